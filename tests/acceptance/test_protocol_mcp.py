"""The gateway's MCP server (docs/protocols.md#4-mcp) through a real ``parley gateway``
process, with the official ``mcp`` client (``ClientSession`` over its Streamable HTTP
transport, the gateway's token in its HTTP client's headers), on every deployment: the
tool ``ask`` runs a turn and streams its text as progress, a second call continues its
session; a call as a task (2025-11-25 ``params.task``) is followed by ``tasks/get``,
``tasks/result``, ``tasks/list``; a task is cancelled; a call that asks a person is
``input_required`` and its elicitation, answered through ``tasks/result``, answers it;
another tenant's task is unknown to every tasks method, and no token is 401.  On a fleet
of its own: a task created through one gateway process is answered by another after the
first is killed with SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as mt
import pytest
from mcp.client.session import ClientRequestContext, ClientSession, ElicitationFnT
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

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

pytestmark = on_deployments(*ALL)

CHAOS_REDIS_URL = os.environ.get("PARLEY_TEST_CHAOS_REDIS_URL", "redis://127.0.0.1:6379/10")
SESSIONS: dict[int, tuple[str, httpx2.AsyncClient]] = {}
"""Each open session's endpoint and HTTP client (for :func:`call_task`)."""


# ------------------------------------------------------------------------ fixtures


gateways, gateway = gateway_fixtures("mcp-gateways")


tenant = tenant_fixture(RULES)


@asynccontextmanager
async def connected(
    url: str, token: str, elicit: ElicitationFnT | None = None
) -> AsyncIterator[ClientSession]:
    """The official client, initialized, on ``url``'s ``/mcp`` as ``token``'s tenant."""
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60, read=120)
    )
    async with (
        http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write, elicitation_callback=elicit) as session,
    ):
        await session.initialize()
        SESSIONS[id(session)] = (f"{url}/mcp", http)
        try:
            yield session
        finally:
            del SESSIONS[id(session)]


def run(scenario: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, 180))


async def call_task(session: ClientSession, task: str, **arguments: Any) -> mt.CreateTaskResult:
    """``ask`` as a task (MCP 2025-11-25 ``params.task``).  The official client checks a
    ``tools/call`` answer as a ``CallToolResult`` whatever the request asked, so this one
    request goes out as raw JSON-RPC on the session's HTTP client (docs/protocols.md#4-mcp);
    everything else about the task goes through the session."""
    url, http = SESSIONS[id(session)]
    params = {"name": "ask", "arguments": {"task": task, **arguments}, "task": {"ttl": 60_000}}
    answer = await http.post(
        url,
        json={"jsonrpc": "2.0", "id": "create", "method": "tools/call", "params": params},
        headers={"Accept": "application/json, text/event-stream"},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert "result" in body, body
    return mt.CreateTaskResult.model_validate(body["result"], by_name=False)


async def get_task(session: ClientSession, task_id: str) -> mt.GetTaskResult:
    request = mt.GetTaskRequest(params=mt.GetTaskRequestParams(task_id=task_id))
    return await session.send_request(request, mt.GetTaskResult)


async def task_result(session: ClientSession, task_id: str) -> mt.CallToolResult:
    request = mt.GetTaskPayloadRequest(params=mt.GetTaskPayloadRequestParams(task_id=task_id))
    return await session.send_request(request, mt.CallToolResult)


async def cancel_task(session: ClientSession, task_id: str) -> mt.CancelTaskResult:
    request = mt.CancelTaskRequest(params=mt.CancelTaskRequestParams(task_id=task_id))
    return await session.send_request(request, mt.CancelTaskResult)


async def list_tasks(session: ClientSession) -> mt.ListTasksResult:
    return await session.send_request(mt.ListTasksRequest(), mt.ListTasksResult)


def text_of(result: mt.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, mt.TextContent))


async def until_status(session: ClientSession, task_id: str, status: str) -> mt.GetTaskResult:
    for _ in range(600):
        task = await get_task(session, task_id)
        if task.status == status:
            return task
        await asyncio.sleep(0.1)
    raise AssertionError(f"task {task_id} never became {status}: {task}")


# ------------------------------------------------------------------------ tests


def test_ask_runs_a_turn_streams_its_text_and_continues_its_session(
    gateway: Gateway, tenant: Tenant
) -> None:
    """``tools/list`` has ``ask`` (tasks optional); a call answers the reply as text with
    the session and turn in ``structuredContent``, its text arriving as progress
    notifications first; a call with that ``session_id`` is the session's next turn."""

    async def scenario() -> None:
        async with connected(gateway.url, tenant.token) as session:
            listed = await session.list_tools()
            [ask] = listed.tools
            assert ask.name == "ask" and ask.execution is not None
            assert ask.execution.task_support == "optional"
            assert ask.input_schema["required"] == ["task"]
            seen: list[tuple[float, str | None]] = []

            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                seen.append((progress, message))

            result = await session.call_tool(
                "ask", {"task": "stream please"}, progress_callback=on_progress
            )
            assert not result.is_error and text_of(result) == STREAM_TEXT
            assert result.structured_content is not None
            ids = result.structured_content
            assert "".join(text or "" for _, text in seen) == STREAM_TEXT
            assert [v for v, _ in seen] == sorted(v for v, _ in seen)
            turn = tenant.http.get(f"/v1/turns/{ids['turn_id']}").json()
            assert turn["session_id"] == ids["session_id"] and turn["reply"] == STREAM_TEXT
            again = await session.call_tool(
                "ask", {"task": "and then", "session_id": ids["session_id"]}
            )
            assert again.structured_content is not None
            assert again.structured_content["session_id"] == ids["session_id"]
            assert text_of(again) == "heard: and then"
            history = tenant.http.get(f"/v1/sessions/{ids['session_id']}/history").json()
            assert [t["prompt"] for t in history["turns"]] == ["stream please", "and then"]

    run(scenario())


def test_a_task_is_a_turn_followed_by_get_result_and_list(gateway: Gateway, tenant: Tenant) -> None:
    """A call with ``params.task`` answers a task at once, whose id is the turn's;
    ``tasks/result`` waits for the end and answers the call's result; ``tasks/get`` then
    says ``completed``; ``tasks/list`` has it."""

    async def scenario() -> None:
        async with connected(gateway.url, tenant.token) as session:
            created = await call_task(session, "stream it")
            task = created.task
            assert task.status == "working" and task.ttl is None
            turn = tenant.http.get(f"/v1/turns/{task.task_id}")
            assert turn.status_code == 200, turn.text
            result = await task_result(session, task.task_id)
            assert text_of(result) == STREAM_TEXT and not result.is_error
            assert result.structured_content == {
                "session_id": turn.json()["session_id"],
                "turn_id": task.task_id,
            }
            done = await get_task(session, task.task_id)
            assert done.status == "completed"
            listed = await list_tasks(session)
            assert task.task_id in [t.task_id for t in listed.tasks]

    run(scenario())


def test_a_task_is_cancelled_by_an_interrupt(gateway: Gateway, tenant: Tenant) -> None:
    """``tasks/cancel`` interrupts the turn: its task is ``cancelled``, its result an
    error, the turn ``cancelled``; cancelling it again is refused (-32602)."""

    async def scenario() -> None:
        async with connected(gateway.url, tenant.token) as session:
            task = (await call_task(session, "slow one")).task
            cancelled = await cancel_task(session, task.task_id)
            assert cancelled.status == "cancelled", cancelled
            result = await task_result(session, task.task_id)
            assert result.is_error
            assert tenant.result(task.task_id)["status"] == "cancelled"
            with pytest.raises(MCPError) as refused:
                await cancel_task(session, task.task_id)
            assert refused.value.error.code == -32602

    run(scenario())


def test_an_approval_is_input_required_and_answered_through_tasks_result(
    gateway: Gateway, tenant: Tenant
) -> None:
    """A call the policy asks about makes the task ``input_required``; ``tasks/result``
    delivers an ``elicitation/create`` for it, and the client's answer approves the call,
    which runs once, and the task completes with the reply."""
    tenant.control.policy(ask_tools=["record_call"])
    asked: list[mt.ElicitRequestParams] = []

    async def approve(
        context: ClientRequestContext, params: mt.ElicitRequestParams
    ) -> mt.ElicitResult | mt.ErrorData:
        asked.append(params)
        return mt.ElicitResult(action="accept", content={"decision": "approve"})

    async def scenario() -> None:
        async with connected(gateway.url, tenant.token, approve) as session:
            task = (await call_task(session, "record it")).task
            waiting = await until_status(session, task.task_id, "input_required")
            assert waiting.status_message
            assert tenant.control.recorded_calls() == []
            result = await task_result(session, task.task_id)
            assert text_of(result) == "recorded." and not result.is_error
            assert len(asked) == 1 and "record_call" in asked[0].message
            assert len(tenant.control.recorded_calls()) == 1
            assert (await get_task(session, task.task_id)).status == "completed"

    run(scenario())


def test_tasks_result_says_each_status_change_as_a_notification(
    gateway: Gateway, tenant: Tenant
) -> None:
    """The ``tasks/result`` stream of a task that asks a person carries
    ``notifications/tasks/status``: ``input_required`` with the elicitation, ``working``
    once it is answered, ``completed`` just before the result (read as raw SSE: the
    official client drops that notification, which it types but does not route)."""
    tenant.control.policy(ask_tools=["record_call"])
    headers = {"Accept": "application/json, text/event-stream"}

    def create() -> str:
        params = {"name": "ask", "arguments": {"task": "record it"}, "task": {}}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        answer = tenant.http.post("/mcp", json=body, headers=headers)
        return str(answer.json()["result"]["task"]["taskId"])

    task_id = create()
    said: list[dict[str, Any]] = []
    body = {"jsonrpc": "2.0", "id": 2, "method": "tasks/result", "params": {"taskId": task_id}}
    with tenant.http.stream("POST", "/mcp", json=body, headers=headers) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data:"):
                continue
            message = json.loads(line.removeprefix("data:"))
            said.append(message)
            if message.get("method") == "elicitation/create":
                answer = {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "result": {"action": "accept", "content": {"decision": "approve"}},
                }
                assert tenant.http.post("/mcp", json=answer).status_code == 202
            if message.get("id") == 2:
                break
    statuses = [m for m in said if m.get("method") == "notifications/tasks/status"]
    assert [m["params"]["status"] for m in statuses] == ["input_required", "working", "completed"]
    assert all(m["params"]["taskId"] == task_id for m in statuses)
    kinds = [m.get("method", "result") for m in said]
    asked = kinds.index("elicitation/create")
    assert said[asked + 1]["params"]["status"] == "input_required"  # said with the question
    assert kinds[-2:] == ["notifications/tasks/status", "result"]
    assert said[-1]["result"]["content"][0]["text"] == "recorded."


def test_another_tenants_task_is_unknown_and_no_token_is_401(
    gateway: Gateway, tenant: Tenant
) -> None:
    """Every tasks method answers another tenant's task id as an unknown one (-32602)
    and changes nothing: the task runs on, uncancelled; a request without a token is 401."""
    other = gateway.tenant()
    other.control.script(RULES)

    async def scenario() -> None:
        async with connected(gateway.url, tenant.token) as mine:
            task = (await call_task(mine, "stream on")).task
            async with connected(gateway.url, other.token) as theirs:
                for method in (get_task, task_result, cancel_task):
                    with pytest.raises(MCPError) as refused:
                        await method(theirs, task.task_id)
                    assert refused.value.error.code == -32602
                listed = await list_tasks(theirs)
                assert task.task_id not in [t.task_id for t in listed.tasks]
            result = await task_result(mine, task.task_id)
            assert text_of(result) == STREAM_TEXT

    run(scenario())
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert httpx.post(f"{gateway.url}/mcp", json=initialize).status_code == 401


def test_bad_messages_are_refused_as_json_rpc_errors(gateway: Gateway, tenant: Tenant) -> None:
    """Bad input: not JSON, not JSON-RPC, an unknown method, an unknown tool, bad
    arguments, a session of no one: each a JSON-RPC error, and no session is made."""
    post = tenant.http.post
    headers = {"Accept": "application/json, text/event-stream"}
    assert post("/mcp", content=b"{", headers=headers).json()["error"]["code"] == -32700
    assert post("/mcp", json=[1], headers=headers).json()["error"]["code"] == -32600

    def call(method: str, params: dict[str, Any]) -> int:
        body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
        answer = post("/mcp", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        code: int = answer.json()["error"]["code"]
        return code

    assert call("nothing/here", {}) == -32601
    assert call("tools/call", {"name": "nope", "arguments": {"task": "x"}}) == -32602
    assert call("tools/call", {"name": "ask", "arguments": {}}) == -32602
    assert call("tools/call", {"name": "ask", "arguments": {"task": "x", "other": 1}}) == -32602
    unknown = {"task": "x", "session_id": "00000000-0000-0000-0000-000000000000"}
    assert call("tools/call", {"name": "ask", "arguments": unknown}) == -32602
    assert call("tasks/get", {"taskId": "not a turn"}) == -32602
    assert tenant.http.get("/v1/sessions").json()["sessions"] == []


# ------------------------------------------------------------ the 2026-07-28 extension

EXTENSION = {
    "io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}}
    },
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
}


def rpc(tenant: Tenant, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One request of the ``io.modelcontextprotocol/tasks`` extension, as raw JSON-RPC:
    the official client has no side of the extension (docs/protocols.md#4-mcp)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": EXTENSION}}
    answer = tenant.http.post(
        "/mcp", json=body, headers={"Accept": "application/json, text/event-stream"}
    )
    assert answer.status_code == 200, answer.text
    message: dict[str, Any] = answer.json()
    return message


def poll(tenant: Tenant, task_id: str, status: str) -> dict[str, Any]:
    for _ in range(600):
        task: dict[str, Any] = rpc(tenant, "tasks/get", {"taskId": task_id})["result"]
        if task["status"] == status:
            return task
        time.sleep(0.1)
    raise AssertionError(f"task {task_id} never became {status}: {task}")


def test_the_2026_extension_creates_polls_updates_and_cancels(
    gateway: Gateway, tenant: Tenant
) -> None:
    """A call that declares the extension gets a task at once (``resultType: "task"``,
    flat, ``ttlMs``); ``tasks/get`` carries the result once completed, and
    ``inputRequests`` while a call waits for a person, which ``tasks/update`` answers;
    ``tasks/cancel`` is acknowledged and the task ends ``cancelled``; another tenant's
    task is unknown to all three."""
    tenant.control.policy(ask_tools=["record_call"])
    made = rpc(tenant, "tools/call", {"name": "ask", "arguments": {"task": "stream x"}})
    created = made["result"]
    assert created["resultType"] == "task" and created["ttlMs"] is None, made
    done = poll(tenant, created["taskId"], "completed")
    assert done["resultType"] == "complete"
    assert done["result"]["content"][0]["text"] == STREAM_TEXT
    assert done["result"]["structuredContent"]["turn_id"] == created["taskId"]

    asks = rpc(tenant, "tools/call", {"name": "ask", "arguments": {"task": "record it"}})
    task_id = asks["result"]["taskId"]
    waiting = poll(tenant, task_id, "input_required")
    [(key, request)] = waiting["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert "record_call" in request["params"]["message"]
    assert tenant.control.recorded_calls() == []
    other = gateway.tenant()
    for method, extra in (
        ("tasks/get", {}),
        ("tasks/update", {"inputResponses": {key: {"action": "decline"}}}),
        ("tasks/cancel", {}),
    ):
        refused = rpc(other, method, {"taskId": task_id, **extra})
        assert refused["error"]["code"] == -32602, refused
    approve = {key: {"action": "accept", "content": {"decision": "approve"}}}
    updated = rpc(tenant, "tasks/update", {"taskId": task_id, "inputResponses": approve})
    assert updated["result"] == {"resultType": "complete"}
    answered = poll(tenant, task_id, "completed")
    assert answered["result"]["content"][0]["text"] == "recorded."
    assert len(tenant.control.recorded_calls()) == 1
    again = rpc(tenant, "tasks/update", {"taskId": task_id, "inputResponses": approve})
    assert again["result"] == {"resultType": "complete"}  # (not outstanding: ignored)
    assert len(tenant.control.recorded_calls()) == 1
    undeclared = {"taskId": task_id, "inputResponses": approve}
    body = {"jsonrpc": "2.0", "id": 2, "method": "tasks/update", "params": undeclared}
    missing = tenant.http.post("/mcp", json=body).json()
    assert missing["error"]["code"] == -32021, missing

    slow = rpc(tenant, "tools/call", {"name": "ask", "arguments": {"task": "slow z"}})
    slow_id = slow["result"]["taskId"]
    acknowledged = rpc(tenant, "tasks/cancel", {"taskId": slow_id})
    assert acknowledged["result"] == {"resultType": "complete"}
    poll(tenant, slow_id, "cancelled")
    assert tenant.result(slow_id)["status"] == "cancelled"


# ------------------------------------------------------------------------ a crash


@pytest.mark.postgres
@pytest.mark.slow
def test_a_task_created_through_one_gateway_is_answered_by_another_after_it_is_killed(
    tmp_path: Path, backend: str
) -> None:
    """On a fleet of its own (a worker, the sweeper, two gateway processes): a task made
    through the first gateway, which is then killed with SIGKILL while the turn runs;
    the second answers ``tasks/get`` and ``tasks/result`` for it with the whole reply."""
    if backend != "fleet-postgres":
        pytest.skip("the fleet's own crash test runs once")
    with fresh_postgres_database("mcp_crash") as url:
        flush_redis(CHAOS_REDIS_URL)
        fleet = Fleet(database_url=url, redis_url=CHAOS_REDIS_URL)
        fleet.start_worker(1)
        fleet.start_beat()
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
                    start_gateway(env, tmp_path / name, tokens=tokens, extra=workspaces)
                )
            first, second = gateways
            tenant = first.tenant("crash")
            tenant.control.script(RULES)

            async def scenario() -> None:
                async with connected(first.url, tenant.token) as session:
                    task = (await call_task(session, "stream across")).task
                first.kill()
                async with connected(second.url, tenant.token) as session:
                    assert (await get_task(session, task.task_id)).task_id == task.task_id
                    result = await task_result(session, task.task_id)
                    assert text_of(result) == STREAM_TEXT
                    assert (await get_task(session, task.task_id)).status == "completed"

            run(scenario())
        finally:
            for gateway in gateways:
                gateway.stop()
            fleet.stop()
