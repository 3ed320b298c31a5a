"""The gateway's A2A v1.0 server (docs/protocols.md#5-a2a) through a real ``parley
gateway`` process, with ``a2a-sdk``'s client (made from the Agent Card by its
``ClientFactory``, the gateway's token in its HTTP client's headers) over both HTTP
bindings, on every deployment: the card; a message runs a turn (the task's artifact is the
reply, its ``contextId`` the session, which a second message continues); a stream; a
cancel; an approval as ``INPUT_REQUIRED`` answered by the next message (a data part, or
the bare text); a subscription; the v0.3 method names; another tenant's task unknown to
every route.  On a fleet of its own: a task created through one gateway process is
followed to its end through another after the first is killed with SIGKILL."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client.client import Client, ClientConfig
from a2a.client.client_factory import ClientFactory
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2AError
from google.protobuf import json_format  # type: ignore[import-untyped]

from tests.support.databases import fresh_postgres_database
from tests.support.deployments import ALL, on_deployments
from tests.support.fleet import Fleet, flush_redis
from tests.support.gateway import (
    Gateway,
    Tenant,
    gateway_fixtures,
    make_tokens,
    start_gateway,
    tenant_fixture,
)
from tests.support.protocol_scripts import RULES, STREAM_TEXT
from tests.support.sse import sse_messages
from tests.support.webhook_receiver import receiver

pytestmark = on_deployments(*ALL)

CHAOS_REDIS_URL = os.environ.get("PARLEY_TEST_CHAOS_REDIS_URL", "redis://127.0.0.1:6379/10")
BINDINGS = ("JSONRPC", "HTTP+JSON")
SECRET = "whsec-a2a-test-41c9"
PUSH_ENV = {
    "PARLEY_WEBHOOK_SECRET": SECRET,
    "PARLEY_WEBHOOK_BACKOFF": "0.2",
    "PARLEY_A2A_PUSH_HOSTS": "127.0.0.1",
}


# ------------------------------------------------------------------------ fixtures


gateways, gateway = gateway_fixtures("a2a-gateways", PUSH_ENV)


tenant = tenant_fixture(RULES)


@asynccontextmanager
async def connected(
    url: str, token: str, binding: str = "JSONRPC", *, streaming: bool = True
) -> AsyncIterator[Client]:
    """``a2a-sdk``'s client for the agent at ``url`` (its card read from
    ``/.well-known/agent-card.json``), speaking ``binding``, as ``token``'s tenant."""
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
    config = ClientConfig(
        httpx_client=http, streaming=streaming, supported_protocol_bindings=[binding]
    )
    client = await ClientFactory(config).create_from_url(url)
    try:
        yield client
    finally:
        await client.close()
        await http.aclose()


def run(scenario: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, 180))


def message(text: str = "", **fields: Any) -> pb.SendMessageRequest:
    """A user's message (``data``: a data part's value)."""
    data = fields.pop("data", None)
    immediately = fields.pop("return_immediately", False)
    parts = [pb.Part(text=text)] if text else []
    if data is not None:
        part = pb.Part()
        json_format.ParseDict(data, part.data)
        parts.append(part)
    sent = pb.Message(message_id=str(uuid.uuid4()), role=pb.ROLE_USER, parts=parts, **fields)
    return pb.SendMessageRequest(
        message=sent, configuration=pb.SendMessageConfiguration(return_immediately=immediately)
    )


async def events_of(client: Client, request: pb.SendMessageRequest) -> list[pb.StreamResponse]:
    return [event async for event in client.send_message(request)]


async def send(client: Client, request: pb.SendMessageRequest) -> pb.Task:
    """The task a non-streaming send answers."""
    [answer] = await events_of(client, request)
    assert answer.HasField("task"), answer
    return answer.task


def reply_of(task: pb.Task) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts)


def streamed_reply(events: list[pb.StreamResponse]) -> str:
    """The artifact a client that applies each update holds at the end."""
    text = ""
    for event in events:
        if event.HasField("artifact_update"):
            chunk = "".join(p.text for p in event.artifact_update.artifact.parts)
            text = text + chunk if event.artifact_update.append else chunk
    return text


def last_state(events: list[pb.StreamResponse]) -> int:
    updates = [e.status_update.status.state for e in events if e.HasField("status_update")]
    return updates[-1]


async def until_state(client: Client, task_id: str, state: int) -> pb.Task:
    for _ in range(600):
        task = await client.get_task(pb.GetTaskRequest(id=task_id))
        if task.status.state == state:
            return task
        await asyncio.sleep(0.1)
    raise AssertionError(f"task {task_id} never reached {state}: {task}")


# ------------------------------------------------------------------------ tests


def test_the_agent_card_names_both_bindings_and_needs_no_token(gateway: Gateway) -> None:
    card = httpx.get(f"{gateway.url}/.well-known/agent-card.json").json()
    assert card["capabilities"]["streaming"] is True
    assert [s["id"] for s in card["skills"]] == ["ask"]
    bindings = {i["protocolBinding"]: i["url"] for i in card["supportedInterfaces"]}
    assert bindings == {"JSONRPC": f"{gateway.url}/a2a", "HTTP+JSON": gateway.url}
    assert "bearer" in card["securitySchemes"]


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_message_runs_a_turn_and_a_second_continues_its_context(
    gateway: Gateway, tenant: Tenant, binding: str
) -> None:
    """A message answers its task once the turn ends: the task id is the turn id, its
    ``contextId`` the session, its artifact the reply; a message with that ``contextId``
    is the session's next turn."""

    async def scenario() -> None:
        async with connected(gateway.url, tenant.token, binding, streaming=False) as client:
            task = await send(client, message("what is it?"))
            assert task.status.state == pb.TASK_STATE_COMPLETED
            assert reply_of(task) == "heard: what is it?"
            turn = tenant.http.get(f"/v1/turns/{task.id}").json()
            assert turn["session_id"] == task.context_id
            again = await send(client, message("and then", context_id=task.context_id))
            assert again.context_id == task.context_id and again.id != task.id
            assert reply_of(again) == "heard: and then"
            fetched = await client.get_task(pb.GetTaskRequest(id=task.id))
            assert reply_of(fetched) == "heard: what is it?"
            listed = await client.list_tasks(pb.ListTasksRequest(context_id=task.context_id))
            assert [t.id for t in listed.tasks] == [again.id, task.id]
            assert not any(t.artifacts for t in listed.tasks)  # (without includeArtifacts)
            full = await client.list_tasks(
                pb.ListTasksRequest(context_id=task.context_id, include_artifacts=True)
            )
            assert [reply_of(t) for t in full.tasks] == ["heard: and then", "heard: what is it?"]
            short = await client.get_task(pb.GetTaskRequest(id=task.id, history_length=1))
            assert [m.role for m in short.history] == [pb.ROLE_AGENT]

    run(scenario())


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_stream_carries_the_reply_as_artifact_updates(
    gateway: Gateway, tenant: Tenant, binding: str
) -> None:
    async def scenario() -> None:
        async with connected(gateway.url, tenant.token, binding) as client:
            events = await events_of(client, message("stream it"))
            assert events[0].HasField("task")
            chunks = [e for e in events if e.HasField("artifact_update")]
            assert len(chunks) > 3
            assert streamed_reply(events) == STREAM_TEXT
            assert last_state(events) == pb.TASK_STATE_COMPLETED

    run(scenario())


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_task_is_canceled_by_an_interrupt(gateway: Gateway, tenant: Tenant, binding: str) -> None:
    async def scenario() -> None:
        async with connected(gateway.url, tenant.token, binding, streaming=False) as client:
            task = await send(client, message("slow one", return_immediately=True))
            assert task.status.state in (pb.TASK_STATE_SUBMITTED, pb.TASK_STATE_WORKING)
            cancelled = await client.cancel_task(pb.CancelTaskRequest(id=task.id))
            assert cancelled.status.state == pb.TASK_STATE_CANCELED
            assert tenant.result(task.id)["status"] == "cancelled"
            with pytest.raises(A2AError):
                await client.cancel_task(pb.CancelTaskRequest(id=task.id))

    run(scenario())


@pytest.mark.parametrize("binding", BINDINGS)
def test_an_approval_is_input_required_and_the_next_message_answers_it(
    gateway: Gateway, tenant: Tenant, binding: str
) -> None:
    """A call the policy asks about: the task is ``INPUT_REQUIRED``, its status message
    naming the call; a message on the task answers it (JSON-RPC: a data part with the
    decision; HTTP+JSON: the bare text ``approve``) and the task completes, the call run
    once."""
    tenant.control.policy(ask_tools=["record_call"])

    async def scenario() -> None:
        async with connected(gateway.url, tenant.token, binding) as client:
            events = await events_of(client, message("record it"))
            assert last_state(events) == pb.TASK_STATE_INPUT_REQUIRED
            task_id = events[0].task.id
            waiting = await client.get_task(pb.GetTaskRequest(id=task_id))
            assert waiting.status.state == pb.TASK_STATE_INPUT_REQUIRED
            [data] = [p for p in waiting.status.message.parts if p.HasField("data")]
            [call] = json_format.MessageToDict(data.data)["pending_approvals"]
            assert call["tool"] == "record_call"
            assert tenant.control.recorded_calls() == []
            if binding == "JSONRPC":
                answer = message(
                    data={"decision": "approve", "approval_id": call["approval_id"]},
                    task_id=task_id,
                )
            else:
                answer = message("approve", task_id=task_id)
            rest = await events_of(client, answer)
            assert last_state(rest) == pb.TASK_STATE_COMPLETED
            assert streamed_reply(rest) == "recorded."
            assert len(tenant.control.recorded_calls()) == 1
            with pytest.raises(A2AError):
                await events_of(client, message("approve", task_id=task_id))

    run(scenario())


def test_a_subscription_follows_a_running_task_to_its_end(gateway: Gateway, tenant: Tenant) -> None:
    async def scenario() -> None:
        async with connected(gateway.url, tenant.token, streaming=False) as sender:
            task_id = (await send(sender, message("stream later", return_immediately=True))).id
        async with connected(gateway.url, tenant.token, "HTTP+JSON") as client:
            events = [e async for e in client.subscribe(pb.SubscribeToTaskRequest(id=task_id))]
            assert events[0].HasField("task") and events[0].task.id == task_id
            assert streamed_reply(events) == STREAM_TEXT
            assert last_state(events) == pb.TASK_STATE_COMPLETED

    run(scenario())


def test_the_v0_3_method_names_answer_too(gateway: Gateway, tenant: Tenant) -> None:
    """``message/send``, ``tasks/get`` and ``message/stream`` (A2A v0.3's JSON-RPC names,
    in v0.3's shapes: ``kind``, ``final``) on the same endpoint."""
    post = tenant.http.post
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "messageId": str(uuid.uuid4()),
                "role": "user",
                "parts": [{"kind": "text", "text": "old client"}],
            }
        },
    }
    sent = post("/a2a", json=body).json()
    assert "result" in sent, sent
    task_id = sent["result"]["id"]
    got = post(
        "/a2a", json={"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task_id}}
    ).json()
    assert got["result"]["id"] == task_id, got
    assert got["result"]["status"]["state"] == "completed", got

    def stream(method: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        request = {"jsonrpc": "2.0", "id": 3, "method": method, "params": params}
        headers = {"Accept": "text/event-stream"}
        with tenant.http.stream("POST", "/a2a", json=request, headers=headers) as answer:
            assert answer.status_code == 200, answer.read()
            messages = sse_messages(answer.iter_lines())
            return [m.json() for m in messages if m.comment is None and m.data]

    again = {
        "message": {
            "kind": "message",
            "messageId": str(uuid.uuid4()),
            "role": "user",
            "parts": [{"kind": "text", "text": "stream old"}],
        }
    }
    streamed = stream("message/stream", again)
    results = [m["result"] for m in streamed]
    assert results[0]["kind"] == "task", results[0]
    text = "".join(
        p["text"] for r in results if r["kind"] == "artifact-update" for p in r["artifact"]["parts"]
    )
    assert text == STREAM_TEXT, results
    assert results[-1]["kind"] == "status-update" and results[-1]["final"] is True, results[-1]
    assert results[-1]["status"]["state"] == "completed"


def test_another_tenants_task_is_unknown_on_every_route(gateway: Gateway, tenant: Tenant) -> None:
    """Get, cancel, subscribe, a message on the task and a listing: another tenant's task
    is unknown to each, and nothing changes (the task runs to its end); no token is 401."""
    other = gateway.tenant()

    async def scenario() -> None:
        async with connected(gateway.url, tenant.token, streaming=False) as mine:
            task = await send(mine, message("slow two", return_immediately=True))
            for binding in BINDINGS:
                async with connected(gateway.url, other.token, binding) as theirs:
                    with pytest.raises(A2AError):
                        await theirs.get_task(pb.GetTaskRequest(id=task.id))
                    with pytest.raises(A2AError):
                        await theirs.cancel_task(pb.CancelTaskRequest(id=task.id))
                    with pytest.raises(A2AError):
                        async for _ in theirs.subscribe(pb.SubscribeToTaskRequest(id=task.id)):
                            pass
                    with pytest.raises(A2AError):
                        await events_of(theirs, message("approve", task_id=task.id))
                    listed = await theirs.list_tasks(pb.ListTasksRequest())
                    assert task.id not in [t.id for t in listed.tasks]
            still = await mine.get_task(pb.GetTaskRequest(id=task.id))
            assert still.status.state != pb.TASK_STATE_CANCELED
            await mine.cancel_task(pb.CancelTaskRequest(id=task.id))

    run(scenario())
    for path in ("/a2a", "/message:send", f"/tasks/{uuid.uuid4()}", "/tasks"):
        method = "GET" if path.startswith("/tasks") else "POST"
        assert httpx.request(method, f"{gateway.url}{path}").status_code == 401, path


@pytest.mark.embedded_only
def test_push_notifications_post_the_ended_task_through_the_webhook_outbox(
    gateway: Gateway, tenant: Tenant
) -> None:
    """A push configuration given with the message and one added to the task after: each
    receives the ended task (A2A's form, its token in ``X-A2A-Notification-Token``,
    signed as every webhook is); one added after the end is posted at once.  A URL off
    ``PARLEY_A2A_PUSH_HOSTS``, or another tenant's task, is refused and stores nothing.
    (Embedded: the gateway's own deliverer posts; on a fleet ``parley beat`` does, as for
    every webhook.)"""
    other = gateway.tenant()
    with receiver() as hook:

        async def scenario() -> tuple[str, str]:
            async with connected(gateway.url, tenant.token, streaming=False) as client:
                request = message("push me", return_immediately=True)
                request.configuration.task_push_notification_config.url = hook.url
                request.configuration.task_push_notification_config.token = "first-token"
                task = await send(client, request)
                second = pb.TaskPushNotificationConfig(
                    task_id=task.id, url=hook.url, token="second-token"
                )
                await client.create_task_push_notification_config(second)
                listed = await client.list_task_push_notification_configs(
                    pb.ListTaskPushNotificationConfigsRequest(task_id=task.id)
                )
                assert [c.url for c in listed.configs] == [hook.url, hook.url]
                far = pb.TaskPushNotificationConfig(task_id=task.id, url="http://10.9.9.9/x")
                with pytest.raises(A2AError):
                    await client.create_task_push_notification_config(far)
                refused = message("never sent")
                refused.configuration.task_push_notification_config.CopyFrom(far)
                with pytest.raises(A2AError):
                    await send(client, refused)
                later = await client.list_tasks(pb.ListTasksRequest())
                assert [t.id for t in later.tasks] == [task.id]  # (the refused one made none)
                async with connected(gateway.url, other.token, streaming=False) as theirs:
                    with pytest.raises(A2AError):
                        await theirs.create_task_push_notification_config(second)
                await until_state(client, task.id, pb.TASK_STATE_COMPLETED)
                hook.wait_for(2)
                late = pb.TaskPushNotificationConfig(
                    task_id=task.id, url=hook.url, token="late-token"
                )
                await client.create_task_push_notification_config(late)
                return task.id, task.context_id

        task_id, context_id = asyncio.run(asyncio.wait_for(scenario(), 180))
        hook.wait_for(3)
        received = hook.requests()
        assert sorted(r.headers["x-a2a-notification-token"] for r in received) == [
            "first-token",
            "late-token",
            "second-token",
        ]
        for arrived in received:
            assert arrived.signed_by(SECRET)
            pushed = arrived.payload["task"]
            assert pushed["id"] == task_id and pushed["contextId"] == context_id
            assert pushed["status"]["state"] == "TASK_STATE_COMPLETED"
            assert pushed["artifacts"][0]["parts"][0]["text"] == "heard: push me"
        time.sleep(0.5)
        assert len(hook.requests()) == 3  # (no more: far's and the other tenant's stored nothing)


# ------------------------------------------------------------------------ a crash


@pytest.mark.postgres
@pytest.mark.slow
def test_a_task_created_through_one_gateway_is_followed_through_another_after_it_is_killed(
    tmp_path: Path, backend: str
) -> None:
    """On a fleet of its own: a task sent through the first gateway (answered at once,
    with a push configuration), which is then killed with SIGKILL while the turn runs; a
    subscription through the second follows the task to its end with the whole reply, and
    ``parley beat`` posts the push once the turn has ended."""
    if backend != "fleet-postgres":
        pytest.skip("the fleet's own crash test runs once")
    with fresh_postgres_database("a2a_crash") as url, receiver() as hook:
        flush_redis(CHAOS_REDIS_URL)
        fleet = Fleet(database_url=url, redis_url=CHAOS_REDIS_URL)
        fleet.start_worker(1)
        fleet.start_beat(env=PUSH_ENV)
        gateways: list[Gateway] = []
        try:
            fleet.wait_ready()
            env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
            env.update({k: v for k, v in fleet.env().items() if k.startswith("PARLEY_")})
            env.pop("PARLEY_HOST")
            tokens = make_tokens(["crash"])
            workspaces = {"PARLEY_WORKSPACES": str(tmp_path / "workspaces")}
            for name in ("first", "second"):
                gateways.append(
                    start_gateway(
                        env, tmp_path / name, tokens=tokens, extra={**workspaces, **PUSH_ENV}
                    )
                )
            first, second = gateways
            tenant = first.tenant("crash")
            tenant.control.script(RULES)

            async def scenario() -> None:
                async with connected(first.url, tenant.token, streaming=False) as client:
                    sent = message("stream across", return_immediately=True)
                    sent.configuration.task_push_notification_config.url = hook.url
                    task = await send(client, sent)
                first.kill()
                async with connected(second.url, tenant.token, "HTTP+JSON") as client:
                    request = pb.SubscribeToTaskRequest(id=task.id)
                    events = [e async for e in client.subscribe(request)]
                    assert streamed_reply(events) == STREAM_TEXT
                    assert last_state(events) == pb.TASK_STATE_COMPLETED
                    done = await client.get_task(pb.GetTaskRequest(id=task.id))
                    assert reply_of(done) == STREAM_TEXT
                hook.wait_for(1)
                [pushed] = hook.requests()
                assert pushed.signed_by(SECRET)
                assert pushed.payload["task"]["id"] == task.id
                assert pushed.payload["task"]["artifacts"][0]["parts"][0]["text"] == STREAM_TEXT

            run(scenario())
        finally:
            for gateway in gateways:
                gateway.stop()
            fleet.stop()
