"""Traces on the fleet (docs/operations.md#traces), read by a real OTLP/HTTP
receiver on loopback from what the standard exporter of each process sends: a turn
submitted through the gateway with a ``traceparent`` is one trace from the caller's span
to the last commit, across the queue hop; a worker SIGKILLed mid-turn leaves the redone
step in that trace, as attempt 2; an approval answered later, by another request with a
trace of its own, joins it.  The fleet runs the Procfile's worker line."""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.chaos import Chaos, chaos_fleet
from tests.support.fleet import procfile_worker
from tests.support.gateway import TOKEN, Gateway, start_fleet_gateway, wait_ready
from tests.support.helpers import Control
from tests.support.otlp import CONTENT_ATTRIBUTES, OtlpReceiver, ReceivedSpan, tree
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as found:
        yield found


def _tracing(receiver: OtlpReceiver) -> dict[str, str]:
    # Exported within a tenth of a second, so a test waits for spans, not for batches;
    # Celery's own spans too.
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "PARLEY_TRACE_CELERY": "1",
    }


@pytest.fixture
def traced(workspace: Path, receiver: OtlpReceiver) -> Iterator[tuple[Chaos, Gateway, Path]]:
    """A fleet (the Procfile's worker line, two workers, the sweeper) and a gateway, every
    process exporting to ``receiver``; and where the gateway makes sessions' roots."""
    pool, concurrency = procfile_worker()
    with chaos_fleet(
        workspace, pool=pool, concurrency=concurrency, environment=_tracing(receiver)
    ) as chaos:
        roots = workspace.parent / "gateway-workspaces"
        gateway = start_fleet_gateway(chaos.fleet, roots)
        wait_ready(gateway)
        yield chaos, gateway, roots


def _caller() -> tuple[str, str, str]:
    """A caller's trace id, span id, and the ``traceparent`` naming them."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _api(gateway: Gateway, traceparent: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if traceparent:
        headers["traceparent"] = traceparent
    return httpx.Client(base_url=gateway.url, headers=headers, timeout=30)


def _submit(gateway: Gateway, traceparent: str, prompt: str) -> dict[str, str]:
    with _api(gateway) as api:
        session = api.post("/v1/sessions", json={"workspace": "traced"}).json()
    with _api(gateway, traceparent) as api:
        answered = api.post(f"/v1/sessions/{session['id']}/turns", json={"prompt": prompt})
    assert answered.status_code == 202, answered.text
    return dict(answered.json())


def _result(gateway: Gateway, turn_id: str) -> dict[str, object]:
    with _api(gateway) as api:
        return dict(api.get(f"/v1/turns/{turn_id}/result", params={"wait": 60}).json())


def _one(spans: list[ReceivedSpan], name: str, **attributes: object) -> ReceivedSpan:
    found = [
        s
        for s in spans
        if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
    ]
    assert len(found) == 1, f"{len(found)} spans {name} {attributes} in\n{tree(spans)}"
    return found[0]


def _has(name: str, **attributes: object):  # type: ignore[no-untyped-def]
    def seen(spans: list[ReceivedSpan]) -> bool:
        return any(
            s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
            for s in spans
        )

    return seen


def _all(
    *predicates: Callable[[list[ReceivedSpan]], bool],
) -> Callable[[list[ReceivedSpan]], bool]:
    """Whether every one of ``predicates`` holds."""

    def seen(spans: list[ReceivedSpan]) -> bool:
        return all(predicate(spans) for predicate in predicates)

    return seen


def test_a_turn_through_the_gateway_is_one_trace_from_the_caller_to_its_last_commit(
    traced: tuple[Chaos, Gateway, Path], receiver: OtlpReceiver
) -> None:
    _chaos, gateway, roots = traced
    Control(roots / "alpha" / "traced").script(
        [
            {
                "when": "",
                "steps": [
                    {"text": "looking. ", "tool_calls": [{"name": "list_files"}]},
                    {"text": "done"},
                ],
            }
        ]
    )
    trace_id, caller_span, traceparent = _caller()
    turn = _submit(gateway, traceparent, "what is here?")
    assert _result(gateway, turn["turn_id"])["reply"] == "done"

    # Every process exports on its own schedule: the gateway's spans may come after the
    # workers' last one.
    receiver.wait_for(
        _all(
            _has("parley.commit step", **{"parley.step": 1}),
            _has("POST /v1/sessions/{session_id}/turns"),
            _has("parley.submit"),
        )
    )
    spans = receiver.trace(trace_id)
    shown = tree(spans)
    # The gateway's server span hangs under the caller's, the submission under it...
    server = _one(spans, "POST /v1/sessions/{session_id}/turns")
    assert server.parent_span_id == caller_span and server.kind == "SERVER", shown
    assert server.resource["service.name"] == "parley-gateway"
    submit = _one(spans, "parley.submit")
    assert submit.parent_span_id == server.span_id and submit.kind == "PRODUCER", shown
    assert submit.attributes["parley.turn.id"] == turn["turn_id"]
    # ...and across the queue, the worker's attempt under the submission.
    agent = _one(spans, "invoke_agent parley")
    assert agent.parent_span_id == submit.span_id, shown
    assert agent.resource["service.name"] == "parley-worker"
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.conversation.id"] == turn["session_id"]
    assert agent.attributes["parley.turn.id"] == turn["turn_id"]
    assert agent.attributes["parley.run.id"] == turn["run_id"]
    assert agent.attributes["parley.attempt"] == 1
    assert agent.attributes["parley.outcome"] == "finished"
    wait = _one(spans, "parley.wait queue")
    assert wait.parent_span_id == submit.span_id and wait.end_ns <= agent.end_ns, shown
    chats = [s for s in spans if s.name == "chat workspace-scripted"]
    assert [c.attributes["parley.step"] for c in chats] == [0, 1], shown
    for chat in chats:
        assert chat.parent_span_id == agent.span_id and chat.kind == "CLIENT"
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "parley"
        assert chat.attributes["gen_ai.request.model"] == "workspace-scripted"
        for usage in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
            tokens = chat.attributes[usage]
            assert isinstance(tokens, int) and tokens > 0, chat.attributes
    reasons = [c.attributes["gen_ai.response.finish_reasons"] for c in chats]
    assert reasons == [("tool_calls",), ("stop",)]
    tool = _one(spans, "execute_tool list_files")
    assert tool.parent_span_id == agent.span_id
    assert tool.attributes["gen_ai.tool.name"] == "list_files"
    assert tool.attributes["gen_ai.tool.call.id"]
    assert tool.attributes["parley.tool.decision"] == "ran"
    commits = [s.attributes["parley.step"] for s in spans if s.name == "parley.commit step"]
    assert sorted(commits) == [0, 1]  # type: ignore[type-var]
    # Celery's spans (PARLEY_TRACE_CELERY=1) nest in the same trace: the kick's publish
    # under the submission, its run under that; the attempt links the run that started it.
    publish = _one(spans, "apply_async/parley.drive_session")
    assert publish.parent_span_id == submit.span_id and publish.kind == "PRODUCER", shown
    run = _one(spans, "run/parley.drive_session")
    assert run.parent_span_id == publish.span_id and run.kind == "CONSUMER", shown
    assert [link[1] for link in agent.links] == [run.span_id], shown
    # Every span of the turn is in the caller's trace, and none carries content.
    assert {s.trace_id for s in receiver.spans() if s.name.startswith("invoke_agent")} == {trace_id}
    assert not CONTENT_ATTRIBUTES & {k for s in receiver.spans() for k in s.attributes}


def test_a_step_redone_after_a_worker_is_killed_is_in_the_same_trace_as_attempt_2(
    traced: tuple[Chaos, Gateway, Path], receiver: OtlpReceiver
) -> None:
    chaos, gateway, roots = traced
    control = Control(roots / "alpha" / "traced")
    control.script(
        [
            {
                "when": "",
                "steps": [
                    {"tool_calls": [{"name": "list_files"}]},
                    {"tool_calls": [{"name": "wait_for_gate"}]},
                    {"text": "done"},
                ],
            }
        ]
    )
    trace_id, _span, traceparent = _caller()
    turn = _submit(gateway, traceparent, "crash inside a tool")
    control.wait_entered()
    victim = chaos.driver_pid(turn["turn_id"])
    os.killpg(chaos.worker_group_of(victim), signal.SIGKILL)
    control.open_gate()
    assert _result(gateway, turn["turn_id"])["reply"] == "done"

    receiver.wait_for(_has("invoke_agent parley", **{"parley.attempt": 2}))
    spans = receiver.trace(trace_id)
    shown = tree(spans)
    submit = _one(spans, "parley.submit")
    second = _one(spans, "invoke_agent parley", **{"parley.attempt": 2})
    assert second.parent_span_id == submit.span_id, shown
    assert second.attributes["parley.resumed_after"] == "takeover"
    assert second.attributes["parley.outcome"] == "finished"
    under = [s for s in spans if s.parent_span_id == second.span_id]
    redone = [s for s in under if s.name == "execute_tool wait_for_gate"]
    assert len(redone) == 1, shown  # the step the kill cut off, redone by attempt 2
    steps = sorted(s.attributes["parley.step"] for s in under if s.name == "parley.commit step")  # type: ignore[type-var]
    assert steps == [1, 2], shown
    # The killed attempt never ended its span; nothing of the turn left the trace.
    assert {s.trace_id for s in receiver.spans() if "parley.turn.id" in s.attributes} == {trace_id}


def test_an_approval_answered_later_joins_the_turns_trace(
    traced: tuple[Chaos, Gateway, Path], receiver: OtlpReceiver
) -> None:
    _chaos, gateway, roots = traced
    control = Control(roots / "alpha" / "traced")
    control.policy(ask_tools=["record_call"])
    control.script(
        [
            {
                "when": "",
                "steps": [
                    {"tool_calls": [{"name": "record_call", "arguments": {"note": "x"}}]},
                    {"text": "recorded"},
                ],
            }
        ]
    )
    trace_id, _span, traceparent = _caller()
    turn = _submit(gateway, traceparent, "record it once approved")
    with _api(gateway) as api:
        wait_until(
            lambda: api.get(f"/v1/turns/{turn['turn_id']}").json()["status"] == "waiting",
            what="the turn to wait for its approval",
        )
        pending = api.get(f"/v1/turns/{turn['turn_id']}").json()["pending_approvals"]
    approval_id = pending[0]["approval_id"]
    # The approver's request comes with a trace of its own.
    their_trace, their_span, theirs = _caller()
    with _api(gateway, theirs) as api:
        answered = api.post(
            f"/v1/turns/{turn['turn_id']}/approvals/{approval_id}", json={"decision": "approve"}
        )
    assert answered.status_code == 200, answered.text
    assert _result(gateway, turn["turn_id"])["reply"] == "recorded"

    receiver.wait_for(
        _all(
            _has("parley.commit step", **{"parley.step": 1}),
            _has("parley.submit"),
            _has("parley.approval answer"),
        )
    )
    spans = receiver.trace(trace_id)
    shown = tree(spans)
    submit = _one(spans, "parley.submit")
    answer = _one(spans, "parley.approval answer")
    assert answer.attributes["parley.approval.decision"] == "approved"
    assert answer.attributes["parley.approval.id"] == approval_id
    assert answer.parent_span_id == submit.span_id, shown
    assert [(link[0], link[1]) for link in answer.links] == [
        (their_trace, next(s.span_id for s in receiver.trace(their_trace) if s.kind == "SERVER"))
    ]
    waited = _one(spans, "parley.wait approval")
    assert waited.parent_span_id == submit.span_id, shown
    first = _one(spans, "invoke_agent parley", **{"parley.attempt": 1})
    assert first.attributes["parley.outcome"] == "waiting"
    second = _one(spans, "invoke_agent parley", **{"parley.attempt": 2})
    assert waited.start_ns >= first.start_ns and waited.end_ns <= second.end_ns, shown
    tool = _one(spans, "execute_tool record_call")
    assert tool.parent_span_id == second.span_id
    assert tool.attributes["parley.tool.decision"] == "approved"
    # The approver's own request stays in its trace, parent of nothing of the turn's.
    assert {s.name for s in receiver.trace(their_trace)} == {
        "POST /v1/turns/{turn_id}/approvals/{approval_id}"
    }
    assert their_span in {s.parent_span_id for s in receiver.trace(their_trace)}


@pytest.fixture
def traced_agents(workspace: Path, receiver: OtlpReceiver) -> Iterator[tuple[Chaos, Gateway, Path]]:
    """:func:`traced` with the host that declares agents (a researcher)."""
    pool, concurrency = procfile_worker()
    with chaos_fleet(
        workspace,
        pool=pool,
        concurrency=concurrency,
        environment=_tracing(receiver),
        host="tests.support.hosts:agents_host",
    ) as chaos:
        roots = workspace.parent / "gateway-workspaces"
        gateway = start_fleet_gateway(chaos.fleet, roots)
        wait_ready(gateway)
        yield chaos, gateway, roots


def test_a_childs_spans_nest_under_its_agent_call_across_the_queue(
    traced_agents: tuple[Chaos, Gateway, Path], receiver: OtlpReceiver
) -> None:
    """docs/sub-agents.md#7-seen: each child turn's ``invoke_agent`` span is a child of
    the parent's ``execute_tool {agent}`` span for its call, though a worker of its own
    ran it; the parent's attempt that goes on with the results is in the same trace."""
    _chaos, gateway, roots = traced_agents
    call = {"name": "researcher", "arguments": {"task": "topic alpha"}}
    other = {"name": "researcher", "arguments": {"task": "topic beta"}}
    Control(roots / "alpha" / "traced").script(
        [
            {
                "when": "^fan",
                "steps": [{"tool_calls": [call, other]}, {"text": "both reported"}],
            },
            {"when": "^topic", "steps": [{"text": "found {prompt}"}]},
        ]
    )
    trace_id, _span, traceparent = _caller()
    turn = _submit(gateway, traceparent, "fan out to two")
    result = _result(gateway, turn["turn_id"])
    assert result["reply"] == "both reported", result
    with _api(gateway) as api:
        children = api.get(f"/v1/turns/{turn['turn_id']}").json()["children"]
    assert len(children) == 2

    receiver.wait_for(
        _all(
            *(_has("invoke_agent parley", **{"parley.turn.id": c["turn_id"]}) for c in children),
            _has("invoke_agent parley", **{"parley.turn.id": turn["turn_id"], "parley.attempt": 2}),
            _has("parley.commit step", **{"parley.step": 1}),
        )
    )
    spans = receiver.trace(trace_id)
    shown = tree(spans)
    first = _one(
        spans, "invoke_agent parley", **{"parley.turn.id": turn["turn_id"], "parley.attempt": 1}
    )
    assert first.attributes["parley.outcome"] == "waiting"
    for child in children:
        opened = _one(
            spans, "execute_tool researcher", **{"parley.child.turn.id": child["turn_id"]}
        )
        assert opened.parent_span_id == first.span_id, shown
        assert opened.attributes["parley.tool.decision"] == "agent"
        assert opened.attributes["gen_ai.tool.call.id"] == child["call_id"]
        invoked = _one(spans, "invoke_agent parley", **{"parley.turn.id": child["turn_id"]})
        assert invoked.parent_span_id == opened.span_id, shown
        assert invoked.resource["service.name"] == "parley-worker"
        assert invoked.attributes["gen_ai.conversation.id"] == child["session_id"]
        chat = next(
            s for s in spans if s.name.startswith("chat ") and s.parent_span_id == invoked.span_id
        )
        assert chat.trace_id == trace_id
    # The parent goes on in its trace, and gives each call its child's result.
    second = _one(
        spans, "invoke_agent parley", **{"parley.turn.id": turn["turn_id"], "parley.attempt": 2}
    )
    given = [
        s
        for s in spans
        if s.name == "execute_tool researcher" and s.parent_span_id == second.span_id
    ]
    assert len(given) == 2, shown
