"""The OpenAI Responses API (docs/protocols.md) through a real
``parley gateway`` process, with the official ``openai`` client pointed at it
(``OpenAI(base_url=<gateway>/v1, api_key=<token>)``), on every deployment: a blocking
create, a background stream cut and resumed after ``N``, a stream silent for longer than
the keep-alive, a continuation in the same conversation (and a branch from an earlier
response), a cancel, a budget that ran out, bad input refused in OpenAI's form without
changing anything, every status and event as the Open Responses schema has them, and on
a fleet of its own a stream resumed across a worker killed with SIGKILL mid-response."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

import parley
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
from tests.support.open_responses import check_event, check_response
from tests.support.sse import sse_messages

pytestmark = on_deployments(*ALL)

LIST: dict[str, Any] = {"name": "list_files", "arguments": {}}
RETRY: dict[str, Any] = {
    "when": "retry policy",
    "steps": [{"tool_calls": [LIST]}, {"text": "It retries 502 and 504.", "chunk_chars": 4}],
}
STREAM_TEXT = "".join(f"word{i} " for i in range(60))
STREAM: dict[str, Any] = {
    "when": "^stream",
    "steps": [{"text": STREAM_TEXT, "chunk_chars": 6, "delay_ms": 25}],
}
LOOP: dict[str, Any] = {"when": "^loop", "steps": [{"tool_calls": [LIST]}]}
ECHO: dict[str, Any] = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
RECORD: dict[str, Any] = {
    "when": "^record",
    "steps": [{"tool_calls": [{"name": "record_call", "arguments": {}}]}, {"text": "recorded."}],
}
KEEPALIVE_SECONDS = 0.2
PAUSE_MS = 1500  # a silence of several keep-alives, mid-text
PAUSED: dict[str, Any] = {
    "when": "^pause",
    "steps": [{"text": "Before the pause, after it.", "chunk_chars": 17, "delay_ms": PAUSE_MS}],
}
RULES: list[dict[str, Any]] = [RETRY, STREAM, LOOP, RECORD, PAUSED, ECHO]
CHAOS_REDIS_URL = os.environ.get("PARLEY_TEST_CHAOS_REDIS_URL", "redis://127.0.0.1:6379/10")


# ------------------------------------------------------------------------ fixtures


gateways, gateway = gateway_fixtures(
    "responses-gateways", {"PARLEY_GATEWAY_KEEPALIVE": str(KEEPALIVE_SECONDS)}
)


tenant = tenant_fixture(RULES)


@pytest.fixture
def api(gateway: Gateway, tenant: Tenant) -> Iterator[OpenAI]:
    """The official client, as a user points it at parley (no retries: a test sees
    every answer)."""
    with client_of(gateway, tenant) as client:
        yield client


def client_of(gateway: Gateway, tenant: Tenant) -> OpenAI:
    return OpenAI(base_url=f"{gateway.url}/v1", api_key=tenant.token, max_retries=0, timeout=60)


# ------------------------------------------------------------------------ helpers


def deltas(events: list[Any]) -> str:
    """What a client that prints each text delta has printed."""
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def key(event: Any) -> tuple[Any, ...]:
    """What two reads of one stream must agree on, event by event."""
    return (
        event.sequence_number,
        event.type,
        getattr(event, "output_index", None),
        getattr(event, "item_id", None),
        getattr(event, "delta", None),
    )


def read_until_deltas(stream: Any, count: int) -> list[Any]:
    """The events of ``stream`` up to its ``count``-th text delta."""
    seen = []
    for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            count -= 1
            if count == 0:
                return seen
    raise AssertionError(f"the stream ended first: {[e.type for e in seen]}")


def model_saw(tenant: Tenant, response_id: str) -> list[tuple[str, str]]:
    """The user and assistant texts of the model's first request for the response."""
    requests = [r for r in tenant.control.requests() if r["turn_id"] == response_id]
    assert requests, f"the model was never asked for {response_id}"
    return [(m["role"], m["text"]) for m in requests[0]["messages"] if m["role"] != "tool"]


def state_of(tenant: Tenant) -> dict[str, Any]:
    """What a refused request must not change: the tenant's sessions, each one's tree,
    its workspace directories, and what its model was asked."""
    listing = tenant.http.get("/v1/sessions", params={"limit": 200})
    assert listing.status_code == 200, listing.text
    sessions = listing.json()["sessions"]
    state: dict[str, Any] = {
        "sessions": sessions,
        "workspaces": sorted(p.name for p in tenant.workspaces.iterdir()),
        "requests": len(tenant.control.requests()),
    }
    for session in sessions:
        state[session["id"]] = tenant.http.get(f"/v1/sessions/{session['id']}/tree").json()
    return state


# ------------------------------------------------------------------------ tests


def test_a_blocking_create_answers_the_ended_response(tenant: Tenant, api: OpenAI) -> None:
    """``create`` waits for the end; the answer is the turn (the same id, reply and
    session as the native API shows), with its tool round before the reply, and the
    model the host used rather than the one asked for."""
    response = api.responses.create(model="gpt-4o-mini", input="what does the retry policy do?")
    assert response.status == "completed"
    assert response.output_text == "It retries 502 and 504."
    assert [item.type for item in response.output] == [
        "function_call",
        "function_call_output",
        "message",
    ]
    call, result = response.output[0], response.output[1]
    assert call.type == "function_call" and call.name == "list_files"
    assert result.type == "function_call_output" and result.call_id == call.call_id
    assert response.model == "scripted"
    turn = tenant.http.get(f"/v1/turns/{response.id}").json()
    assert turn["status"] == "finished" and turn["reply"] == response.output_text
    assert response.conversation is not None and response.conversation.id == turn["session_id"]
    assert response.usage is not None
    assert response.usage.total_tokens == sum(turn["usage"].values()) > 0
    assert api.responses.retrieve(response.id).model_dump() == response.model_dump()

    # A message list: its newest user message is the prompt (a system message is the
    # host's to give, and earlier ones are not replayed).
    listed = api.responses.create(
        model="gpt-4o-mini",
        input=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "input_text", "text": "hello there"}]},
        ],
    )
    assert listed.output_text == "heard: hello there"
    assert listed.conversation is not None
    assert listed.conversation.id != response.conversation.id  # neither given: a new one


def test_a_background_stream_cut_after_a_few_deltas_resumes_exactly(
    tenant: Tenant, api: OpenAI
) -> None:
    """A background streamed create, cut after three deltas while the turn runs, resumed
    with ``retrieve(id, stream=True, starting_after=N)``: the rest is exactly what a
    full read has after ``N``, and the deltas add up to the reply once.  The client's
    own accumulator resumes as well."""
    stream = api.responses.create(
        model="gpt-4o-mini", input="stream a long answer", background=True, stream=True
    )
    seen = read_until_deltas(stream, 3)
    stream.close()
    assert seen[0].type == "response.created"
    response_id = seen[0].response.id
    cut = seen[-1].sequence_number
    assert api.responses.retrieve(response_id).status == "in_progress"  # cut mid-response

    rest = list(api.responses.retrieve(response_id, stream=True, starting_after=cut))
    assert rest[0].sequence_number > cut
    assert rest[-1].type == "response.completed"
    assert deltas(seen) + deltas(rest) == STREAM_TEXT == rest[-1].response.output_text

    full = list(api.responses.retrieve(response_id, stream=True))
    assert [key(e) for e in full] == [key(e) for e in seen + rest]
    assert [e.model_dump() for e in full[len(seen) :]] == [e.model_dump() for e in rest]

    with api.responses.stream(response_id=response_id, starting_after=cut) as resumed:
        events = list(resumed)
        final = resumed.get_final_response()
    assert [e.sequence_number for e in events] == [e.sequence_number for e in rest]
    assert final.output_text == STREAM_TEXT


def test_a_stream_silent_for_longer_than_the_keep_alive_reads_to_its_end(
    tenant: Tenant, api: OpenAI
) -> None:
    """A response that goes quiet mid-text (a slow model, tool or approval) is kept alive
    in a form the official client reads past: ``create(stream=True)``,
    ``retrieve(id, stream=True, starting_after=N)`` and the ``responses.stream()``
    accumulator each read across the silence to the end.  On the wire the silence holds
    keep-alive comments, and no event carries an ``id:`` (as OpenAI's own streams: the
    client's decoder would make each keep-alive after an id an event of no data)."""
    reply = "Before the pause, after it."
    events = list(api.responses.create(model="m", input="pause a while", stream=True))
    created, completed = events[0], events[-1]
    assert created.type == "response.created" and completed.type == "response.completed"
    assert deltas(events) == reply == completed.response.output_text
    response_id = created.response.id

    first = next(e for e in events if e.type == "response.output_text.delta")
    rest = list(
        api.responses.retrieve(response_id, stream=True, starting_after=first.sequence_number)
    )
    assert [key(e) for e in rest] == [key(e) for e in events[events.index(first) + 1 :]]
    with api.responses.stream(model="m", input="pause again") as accumulated:
        final = accumulated.get_final_response()
    assert final.output_text == reply

    raw = b""
    body = {"model": "m", "input": "pause once more", "stream": True}
    with tenant.http.stream("POST", "/v1/responses", json=body) as response:
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            raw += chunk
    frames = raw.decode().split("\n\n")
    keep_alives = [n for n, frame in enumerate(frames) if frame == ": keep-alive"]
    first_delta = next(n for n, f in enumerate(frames) if "response.output_text.delta" in f)
    assert any(n > first_delta for n in keep_alives), frames  # kept alive mid-response
    assert not [line for line in raw.decode().splitlines() if line.startswith("id:")]


EMITTED = {
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
}
"""Every kind of event a Responses stream of parley's sends."""


def wire_events(tenant: Tenant, response_id: str) -> list[dict[str, Any]]:
    """The events of a response's whole stream, as JSON off the wire."""
    path = f"/v1/responses/{response_id}"
    with tenant.http.stream("GET", path, params={"stream": "true"}) as response:
        assert response.status_code == 200
        return [m.json() for m in sse_messages(response.iter_lines()) if m.comment is None]


def test_every_status_and_event_is_as_the_open_responses_schema_has_them(
    tenant: Tenant,
) -> None:
    """The Response object of every status (``queued``, ``in_progress``, ``completed``,
    ``cancelled``, ``failed``, ``incomplete``), as the routes answer it, and every kind of
    event their streams send validate against the specification's own schema (strict
    clients, the specification's compliance runner, typed SDKs in other languages)."""

    def create(**body: Any) -> dict[str, Any]:
        answer = tenant.http.post("/v1/responses", json={"model": "m", **body})
        assert answer.status_code == 200, answer.text
        created: dict[str, Any] = answer.json()
        return created

    def retrieve_once(response_id: str, status: str) -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while (current := tenant.http.get(f"/v1/responses/{response_id}").json())[
            "status"
        ] != status:
            assert time.monotonic() < deadline, current
            time.sleep(0.02)
        found: dict[str, Any] = current
        return found

    objects = {"queued": create(input="pause a while", background=True)}
    objects["in_progress"] = retrieve_once(objects["queued"]["id"], "in_progress")
    objects["completed"] = create(input="what is the retry policy?")
    objects["incomplete"] = create(input="loop for ever", max_output_tokens=1)
    cancelling = create(input="stream a long answer", background=True)
    retrieve_once(cancelling["id"], "in_progress")
    cancelled = tenant.http.post(f"/v1/responses/{cancelling['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    objects["cancelled"] = cancelled.json()
    tenant.control.fail_model("the model is down")
    objects["failed"] = create(input="hello")

    for status, body in objects.items():
        assert body["status"] == status
        check_response(body)
        assert isinstance(body["created_at"], int)
        assert (body["completed_at"] is not None) is (status == "completed"), body
    completed = objects["completed"]
    assert completed["created_at"] <= completed["completed_at"] <= time.time()

    kinds = set()
    for response_id in {body["id"] for body in objects.values()}:
        for event in wire_events(tenant, response_id):
            check_event(event)
            kinds.add(event["type"])
    assert kinds == EMITTED


def test_previous_response_id_continues_the_conversation_and_can_branch(
    tenant: Tenant, api: OpenAI
) -> None:
    """``previous_response_id`` continues that response's session: the model sees the
    earlier turn.  Given an earlier response than the newest, it continues from there (a
    branch); ``conversation`` continues at the newest."""
    first = api.responses.create(model="m", input="my name is Ada")
    second = api.responses.create(
        model="m", input="what is my name?", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id
    assert second.conversation == first.conversation
    assert model_saw(tenant, second.id) == [
        ("user", "my name is Ada"),
        ("assistant", "heard: my name is Ada"),
        ("user", "what is my name?"),
    ]
    third = api.responses.create(model="m", input="how old am I?", previous_response_id=first.id)
    assert third.previous_response_id == first.id
    assert third.conversation == first.conversation
    assert model_saw(tenant, third.id) == [
        ("user", "my name is Ada"),
        ("assistant", "heard: my name is Ada"),
        ("user", "how old am I?"),
    ]
    assert first.conversation is not None
    fourth = api.responses.create(
        model="m", input="bye", conversation={"id": first.conversation.id}
    )
    assert fourth.previous_response_id == third.id
    assert fourth.output_text == "heard: bye"
    tree = tenant.http.get(f"/v1/sessions/{first.conversation.id}/tree").json()["turns"]
    assert [(t["turn_id"], t["parent_id"]) for t in tree] == [
        (first.id, None),
        (second.id, first.id),
        (third.id, first.id),
        (fourth.id, third.id),
    ]


def test_cancel_stops_a_streaming_response(tenant: Tenant, api: OpenAI) -> None:
    """``cancel`` interrupts the turn (at once, while the model streams) and answers the
    cancelled response; its stream ends with that; a second cancel answers the same."""
    stream = api.responses.create(
        model="m", input="stream a long answer", background=True, stream=True
    )
    seen = read_until_deltas(stream, 1)
    response_id = seen[0].response.id
    cancelled = api.responses.cancel(response_id)
    assert cancelled.id == response_id
    assert cancelled.status == "cancelled" and cancelled.output_text == ""
    rest = list(stream)  # the same stream, read on: it ends with the cancel
    assert rest[-1].type == "response.incomplete"
    assert rest[-1].response.status == "cancelled"
    assert deltas(seen + rest) != STREAM_TEXT  # it stopped short
    assert api.responses.retrieve(response_id).status == "cancelled"
    assert api.responses.cancel(response_id).model_dump() == cancelled.model_dump()
    assert tenant.http.get(f"/v1/turns/{response_id}").json()["status"] == "cancelled"


def test_a_response_whose_budget_ran_out_is_incomplete(tenant: Tenant, api: OpenAI) -> None:
    """``max_output_tokens`` is the turn's token budget: a turn that ran out of it is
    ``incomplete`` (``max_output_tokens``), with the tool rounds it committed and no
    reply; a stream of one ends with ``response.incomplete``."""
    response = api.responses.create(model="m", input="loop for ever", max_output_tokens=1)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.max_output_tokens == 1
    assert response.output_text == ""
    assert [item.type for item in response.output] == ["function_call", "function_call_output"]
    assert tenant.http.get(f"/v1/turns/{response.id}").json()["status"] == "budget_exceeded"
    with api.responses.stream(model="m", input="loop again", max_output_tokens=1) as stream:
        events = list(stream)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.status == "incomplete"


def test_bad_requests_are_refused_in_openai_form_and_change_nothing(
    gateway: Gateway, tenant: Tenant, api: OpenAI
) -> None:
    """Empty or unusable input, unknown (or another tenant's) previous responses and
    conversations, client tools, an unknown parameter: each is OpenAI's error form with
    OpenAI's status and the parameter it concerns, and nothing changes."""
    existing = api.responses.create(model="m", input="hello")
    assert existing.conversation is not None
    other = gateway.tenant()
    other.control.script(RULES)
    with client_of(gateway, other) as other_api:
        foreign = other_api.responses.create(model="m", input="hello")
    assert foreign.conversation is not None
    before = state_of(tenant)
    image = {"type": "input_image", "image_url": "https://example.com/a.png"}
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"input": ""}, 400, "input"),
        ({"input": "   "}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": [{"role": "assistant", "content": "hi"}]}, 400, "input"),
        ({"input": [{"role": "user", "content": [image]}]}, 400, "input[0].content[0]"),
        ({"input": "x", "previous_response_id": str(uuid.uuid4())}, 400, "previous_response_id"),
        ({"input": "x", "previous_response_id": foreign.id}, 400, "previous_response_id"),
        ({"input": "x", "conversation": str(uuid.uuid4())}, 404, "conversation"),
        ({"input": "x", "conversation": foreign.conversation.id}, 404, "conversation"),
        (
            {
                "input": "x",
                "previous_response_id": existing.id,
                "conversation": existing.conversation.id,
            },
            400,
            "previous_response_id",
        ),
        (
            {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {}}]},
            400,
            "tools",
        ),
        ({"input": "x", "extra_body": {"colour": "blue"}}, 400, "colour"),
        ({"input": "x", "store": False}, 400, "store"),
    ]
    for arguments, status, param in cases:
        with pytest.raises(openai.APIStatusError) as refused:
            api.responses.create(model="m", **arguments)
        assert refused.value.status_code == status, (arguments, refused.value.body)
        error = refused.value.body
        assert isinstance(error, dict), error
        assert set(error) == {"message", "type", "param", "code"}, error
        assert error["type"] == "invalid_request_error" and error["param"] == param, error
        assert error["message"], error
    assert isinstance(refused.value, openai.BadRequestError)
    for unknown in (str(uuid.uuid4()), foreign.id, "not-an-id"):
        with pytest.raises(openai.NotFoundError):
            api.responses.retrieve(unknown)
        with pytest.raises(openai.NotFoundError):
            api.responses.cancel(unknown)
    with (
        OpenAI(base_url=f"{gateway.url}/v1", api_key="no-such-token-here", max_retries=0) as anon,
        pytest.raises(openai.AuthenticationError) as unauthorized,
    ):
        anon.responses.create(model="m", input="hello")
    assert unauthorized.value.code == "invalid_api_key"
    assert state_of(tenant) == before
    with client_of(gateway, other) as other_api:
        assert other_api.responses.retrieve(foreign.id).status == "completed"
    assert [
        t["turn_id"]
        for t in other.http.get(f"/v1/sessions/{foreign.conversation.id}/tree").json()["turns"]
    ] == [foreign.id]


def test_a_turn_started_natively_is_a_response(tenant: Tenant, api: OpenAI) -> None:
    """One log, several views: a turn submitted through the native API is retrieved and
    streamed as a response, and continued with ``previous_response_id``."""
    session = tenant.new_session()
    turn = tenant.submit(session["id"], "what does the retry policy do?")
    ended = tenant.result(turn["turn_id"])
    with api.responses.stream(response_id=turn["turn_id"]) as stream:
        final = stream.get_final_response()
    assert final.output_text == ended["reply"] == "It retries 502 and 504."
    assert api.responses.retrieve(turn["turn_id"]).output_text == ended["reply"]
    after = api.responses.create(model="m", input="thanks", previous_response_id=turn["turn_id"])
    assert after.conversation is not None and after.conversation.id == session["id"]


def test_a_call_that_asks_waits_and_an_mcp_approval_response_answers_it(
    tenant: Tenant, api: OpenAI
) -> None:
    """A call the policy asks about: the blocking create answers once the response waits
    (``in_progress``, an ``mcp_approval_request`` naming the call); an
    ``mcp_approval_response`` after it answers, and the same response goes on to its
    reply.  A second answer, or one to no such request, is refused and runs nothing."""
    tenant.control.policy(ask_tools=["record_call"])
    waiting = api.responses.create(model="m", input="record it")
    assert waiting.status == "in_progress"
    [request] = waiting.output
    assert request.type == "mcp_approval_request" and request.name == "record_call"
    assert tenant.control.recorded_calls() == []  # nothing ran while it waits
    assert tenant.http.get(f"/v1/turns/{waiting.id}").json()["status"] == "waiting"

    def answer(approval_id: str) -> Any:
        return api.responses.create(
            model="m",
            previous_response_id=waiting.id,
            input=[
                {
                    "type": "mcp_approval_response",
                    "approval_request_id": approval_id,
                    "approve": True,
                }
            ],
        )

    with pytest.raises(openai.BadRequestError) as unknown:
        answer(str(uuid.uuid4()))
    error = unknown.value.body
    assert isinstance(error, dict) and error["param"] == "input[0].approval_request_id", error
    done = answer(request.id)
    assert done.id == waiting.id
    assert done.status == "completed" and done.output_text == "recorded."
    assert [i.type for i in done.output] == ["function_call", "function_call_output", "message"]
    assert len(tenant.control.recorded_calls()) == 1
    with pytest.raises(openai.ConflictError):
        answer(request.id)
    assert len(tenant.control.recorded_calls()) == 1


# ------------------------------------------------------------------------ a crash


@pytest.mark.postgres
@pytest.mark.slow
def test_a_response_stream_resumes_across_a_worker_killed_mid_response(tmp_path: Path) -> None:
    """On a fleet of its own (two workers, the sweeper, a gateway): a background stream
    is cut after a few deltas, the worker driving the turn is killed with SIGKILL, and the
    stream resumed after ``N`` gives the rest: the other worker redid the step, and the
    client holds the reply's text exactly once, in one message."""
    text = "".join(f"w{i:03d} " for i in range(120))
    rules = [{"when": ".*", "steps": [{"text": text, "chunk_chars": 5, "delay_ms": 20}]}]
    with fresh_postgres_database("responses_crash") as url:
        flush_redis(CHAOS_REDIS_URL)
        fleet = Fleet(database_url=url, redis_url=CHAOS_REDIS_URL)
        workers = [fleet.start_worker(1) for _ in range(2)]
        fleet.start_beat()
        gateway: Gateway | None = None
        try:
            fleet.wait_ready()
            env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
            env.update({k: v for k, v in fleet.env().items() if k.startswith("PARLEY_")})
            env.pop("PARLEY_HOST")
            gateway = start_gateway(env, tmp_path / "gateway", tokens=make_tokens(["crash"]))
            tenant = gateway.tenant("crash")
            tenant.control.script(rules)
            with (
                client_of(gateway, tenant) as api,
                parley.connect(url, redis_url=CHAOS_REDIS_URL, queue=fleet.queue) as client,
            ):
                stream = api.responses.create(
                    model="m", input="a long answer", background=True, stream=True
                )
                seen = read_until_deltas(stream, 3)
                stream.close()
                response_id = seen[0].response.id
                worker = client.store.run_state(response_id).worker
                assert worker is not None
                group = os.getpgid(int(worker.split(":")[1]))
                assert group in {w.pid for w in workers}
                os.killpg(group, signal.SIGKILL)
                killed = time.monotonic()

                rest = list(
                    api.responses.retrieve(
                        response_id, stream=True, starting_after=seen[-1].sequence_number
                    )
                )
                assert rest[-1].type == "response.completed", [e.type for e in rest]
                assert time.monotonic() - killed < 60
                assert deltas(seen) + deltas(rest) == text == rest[-1].response.output_text
                added = [e for e in seen + rest if e.type == "response.output_item.added"]
                assert [e.item.type for e in added] == ["message"]
                state = client.store.run_state(response_id)
                assert state.attempts == 2
                native = tenant.event_json(response_id)
                restarts = [e["data"] for e in native if e["kind"] == "step_restarted"]
                assert restarts == [{"index": 0, "reason": "resumed"}]
                again = list(api.responses.retrieve(response_id, stream=True))
                assert deltas(again) == text
        finally:
            if gateway is not None:
                gateway.stop()
            fleet.stop()
