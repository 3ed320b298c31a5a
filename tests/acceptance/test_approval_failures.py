"""Durable approvals (docs/guarantees.md#15-approvals, docs/approvals.md) on the fleet under
failure, with real processes: a waiting turn holds no worker slot; it survives every worker
SIGKILLed and Redis emptied; an approved call runs once per answer across a crash between the answer
and its run, and is not run again by the next worker when its worker died while it ran; the sweeper
times an unanswered call out with no worker alive; and after an interrupt while waiting, the
next turn's request is one a strict OpenAI-compatible server on loopback accepts.

Each test starts a fleet of its own (:mod:`tests.support.chaos`), on prefork and on the Procfile's
worker line (``tests.support.chaos.DEPLOYMENTS``)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.engine.tool_calls import NOT_RUN_INTERRUPTED
from parley.schemas.events import EventKind
from parley.schemas.records import Decision, TurnStatus
from tests.providers.servers import (
    Reply,
    openai_message_faults,
    openai_server,
    openai_text,
    openai_tool_calls,
)
from tests.support.chaos import CHAOS_REDIS_URL, Chaos, chaos_fleet, deployment_options
from tests.support.deployments import on_fleet_deployments
from tests.support.events import assert_once_in_order, displayed_text
from tests.support.fleet import flush_redis
from tests.support.waiting import wait_until

pytestmark = [on_fleet_deployments(), pytest.mark.postgres, pytest.mark.slow]

ChaosFactory = Callable[..., Chaos]


@pytest.fixture
def start_fleet(
    workspace: Path, deployment: str, request: pytest.FixtureRequest
) -> Iterator[ChaosFactory]:
    """``start_fleet(workers=…, concurrency=…, host=…)``: this test's fleet (one), as the
    deployment says unless told otherwise."""
    with ExitStack() as stack:

        def start(**options: Any) -> Chaos:
            options = {**deployment_options(deployment, request), **options}
            return stack.enter_context(chaos_fleet(workspace, **options))

        yield start


def record(note: str) -> dict[str, Any]:
    return {"name": "record_call", "arguments": {"note": note}}


def asking(chaos: Chaos, *notes: str) -> None:
    """``record_call`` asks; a prompt ``ask …`` calls it once per note in one step, then
    answers with the last thing it heard; any other prompt is answered at once."""
    chaos.control.policy(ask_tools=["record_call"])
    chaos.control.script(
        [
            {
                "when": "^ask",
                "steps": [
                    {"text": "asking ", "tool_calls": [record(n) for n in notes]},
                    {"text": "done: {last_message}"},
                ],
            },
            {"when": ".*", "steps": [{"text": "plain: {prompt}"}]},
        ]
    )


def waiting_turns(chaos: Chaos, count: int) -> list[parley.TurnHandle]:
    """``count`` turns, each on a session of its own, all waiting for their answers."""
    handles = [chaos.client.open_session(chaos.workspace).submit(f"ask {n}") for n in range(count)]
    wait_until(
        lambda: all(h.record().status is TurnStatus.WAITING for h in handles),
        what="every turn to wait",
    )
    return handles


def tool_messages(chaos: Chaos, turn_id: str) -> list[dict[str, Any]]:
    """The tool results of the last request the model was sent for the turn."""
    last = [r for r in chaos.control.requests() if r["turn_id"] == turn_id][-1]
    return [m for m in last["messages"] if m["role"] == "tool"]


@pytest.mark.timeout(180)
def test_twelve_waiting_turns_hold_no_slot_of_a_two_slot_worker(
    start_fleet: ChaosFactory,
) -> None:
    chaos = start_fleet(workers=1, concurrency=2)
    asking(chaos, "one")
    handles = waiting_turns(chaos, 12)

    # Both slots are free: a turn of another session runs at once.
    started = time.monotonic()
    plain = chaos.client.open_session(chaos.workspace).submit("not asking").wait(30)
    latency = time.monotonic() - started
    assert plain.outcome is TurnStatus.FINISHED and plain.reply == "plain: not asking"
    assert latency < 5, f"a plain turn took {latency:.1f}s beside twelve waiting ones"
    for handle in handles:
        assert handle.record().status is TurnStatus.WAITING
        assert chaos.client.store.run_state(handle.turn_id).worker is None
    assert chaos.control.recorded_calls() == []

    for handle in handles:
        [pending] = handle.approvals()
        handle.approve(pending.approval_id)
    results = [handle.wait(60) for handle in handles]
    assert [r.reply for r in results] == [f"done: ask {n}" for n in range(12)]
    assert len(chaos.control.recorded_calls()) == 12


@pytest.mark.timeout(240)
@pytest.mark.also_amqp
def test_waiting_turns_survive_every_worker_killed_and_redis_emptied(
    start_fleet: ChaosFactory,
) -> None:
    chaos = start_fleet()
    asking(chaos, "first", "second")
    handles = waiting_turns(chaos, 6)
    handles[0].say("heard after it all")  # a steer while waiting, from the store alone
    chaos.kill_workers()
    flush_redis(CHAOS_REDIS_URL)  # locks, buffers, steer lists, kicks, bindings: all gone

    # Answered with no worker alive, in no particular order: every first call approved,
    # every other second one too, the rest denied.
    for number, handle in reversed(list(enumerate(handles))):
        first, second = handle.approvals()
        handle.approve(first.approval_id)
        if number % 2:
            handle.approve(second.approval_id)
        else:
            handle.deny(second.approval_id, reason="not this one")
        assert handle.record().status is TurnStatus.QUEUED
    assert chaos.control.recorded_calls() == []

    chaos.start_worker()
    results = [handle.wait(60) for handle in handles]
    assert [r.outcome for r in results] == [TurnStatus.FINISHED] * 6
    assert [r.reply for r in results] == ["done: heard after it all"] + [
        f"done: ask {n}" for n in range(1, 6)
    ]
    # Each approved call ran once, and no denied one.
    assert Counter(chaos.control.recorded_notes()) == {"first": 6, "second": 3}
    for number, (handle, result) in enumerate(zip(handles, results, strict=True)):
        decisions = [(a.decision, a.reason) for a in result.approvals]
        answer = (Decision.APPROVED, None) if number % 2 else (Decision.DENIED, "not this one")
        assert decisions == [(Decision.APPROVED, None), answer]
        contents = [m["content"] for m in tool_messages(chaos, handle.turn_id)]
        assert contents[0] == "recorded"
        assert (contents[1] == "recorded") == bool(number % 2)
        assert_once_in_order(list(handle.events()), gap_free=False)
        kinds = [e.kind for e in handle.events()]
        assert kinds.count(EventKind.APPROVAL_REQUESTED) == 2
        assert kinds.count(EventKind.APPROVAL_ANSWERED) == 2
        assert kinds.count(EventKind.END) == 1


def test_a_call_answered_while_no_worker_lives_runs_once_on_the_next(
    start_fleet: ChaosFactory,
) -> None:
    chaos = start_fleet()
    asking(chaos, "once")
    [handle] = waiting_turns(chaos, 1)
    chaos.kill_workers()
    [pending] = handle.approvals()
    handle.approve(pending.approval_id)  # committed, with nobody to run the call
    time.sleep(1.5)  # a sweep or so: nothing runs it meanwhile
    assert chaos.control.recorded_calls() == []
    assert handle.record().status is TurnStatus.QUEUED

    worker = chaos.start_worker()
    result = handle.wait(60)
    assert result.outcome is TurnStatus.FINISHED and result.reply == "done: ask 0"
    driver = chaos.driver_pid(handle.turn_id)
    assert chaos.control.recorded_calls() == [driver]
    assert chaos.worker_group_of(driver) == worker.pid
    assert_once_in_order(list(handle.events()), gap_free=False)


def test_an_approved_call_whose_worker_died_while_it_ran_is_not_run_again(
    start_fleet: ChaosFactory,
) -> None:
    chaos = start_fleet()
    chaos.control.policy(ask_tools=["wait_for_gate"])
    chaos.control.script(
        [
            {
                "when": "gate",
                "steps": [
                    {"text": "Opening the gate. ", "tool_calls": [{"name": "wait_for_gate"}]},
                    {"text": "ok"},
                ],
            }
        ]
    )
    handle = chaos.client.open_session(chaos.workspace).submit("gate, approved")
    wait_until(lambda: handle.record().status is TurnStatus.WAITING, what="the turn to wait")
    [pending] = handle.approvals()
    handle.approve(pending.approval_id)
    chaos.control.wait_entered()  # the approved call runs...
    victim = chaos.driver_pid(handle.turn_id)
    chaos.kill(next(w for w in chaos.workers if w.pid == chaos.worker_group_of(victim)))
    chaos.control.open_gate()  # ...and its worker died in it: did it push, or not?

    result = handle.wait(60)
    assert result.outcome is TurnStatus.FINISHED and result.reply == "ok"
    assert chaos.control.gate_calls == 1  # the next worker did not run it again
    assert chaos.driver_pid(handle.turn_id) != victim
    [answer] = tool_messages(chaos, handle.turn_id)
    assert "effect is unknown" in answer["content"] and answer["is_error"]
    [stored] = chaos.client.store.steps_of(handle.turn_id)[0].payload.tool_results
    assert "effect is unknown" in stored.content
    assert [(a.decision, a.reason) for a in result.approvals] == [(Decision.APPROVED, None)]
    # The next worker announced the step as restarted (readers drop what they showed of
    # it): its kept text streams again, though the model was not asked again.
    events = list(handle.events())
    assert [e.data for e in events if e.kind is EventKind.STEP_RESTARTED] == [
        {"index": 0, "reason": "resumed"}
    ]
    assert displayed_text(events) == "Opening the gate. ok"
    assert len([r for r in chaos.control.requests() if r["turn_id"] == handle.turn_id]) == 2


def test_the_sweeper_times_out_an_unanswered_call_with_no_worker_alive(
    start_fleet: ChaosFactory,
) -> None:
    chaos = start_fleet(host="tests.support.hosts:timeout_host")
    asking(chaos, "late")
    [handle] = waiting_turns(chaos, 1)
    [pending] = handle.approvals()
    assert pending.expires_at is not None
    assert (pending.expires_at - pending.requested_at).total_seconds() == pytest.approx(2.0)
    chaos.kill_workers()  # nobody is left to sleep on it: only the sweeper can deny it

    [answered] = wait_until(
        lambda: [a for a in chaos.client.store.approvals(handle.turn_id) if not a.pending],
        timeout=15,
        what="the sweeper to time the call out",
    )
    assert (answered.decision, answered.reason) == (Decision.DENIED, "timed out")
    assert answered.decided_at is not None and answered.decided_at >= pending.expires_at
    assert handle.record().status is TurnStatus.QUEUED

    chaos.start_worker()
    result = handle.wait(60)
    assert result.outcome is TurnStatus.FINISHED and result.reply == "done: ask 0"
    assert chaos.control.recorded_calls() == []
    [answer] = tool_messages(chaos, handle.turn_id)
    assert "denied" in answer["content"] and "timed out" in answer["content"]
    assert_once_in_order(list(handle.events()), gap_free=False)


def test_after_an_interrupt_while_waiting_a_real_provider_gets_no_orphan_call(
    start_fleet: ChaosFactory,
) -> None:
    chaos = start_fleet()
    chaos.control.policy(ask_tools=["record_call"])
    with openai_server(strict=True) as server:
        chaos.control.use_openai(server.base_url)
        server.plan(
            Reply(
                frames=openai_tool_calls(
                    [
                        ("call_a", "record_call", ['{"note":', ' "a"}']),
                        ("call_b", "record_call", ['{"note": "b"}']),
                    ],
                    text=["Recording both."],
                )
            ),
            Reply(frames=openai_text("Nothing ", "was recorded.")),
        )
        session = chaos.client.open_session(chaos.workspace)
        first = session.submit("record a and b")
        wait_until(lambda: first.record().status is TurnStatus.WAITING, what="the turn to wait")
        first.approve(first.approvals()[0].approval_id)  # one answered, one not
        first.interrupt()
        cancelled = first.wait(30)
        assert cancelled.outcome is TurnStatus.CANCELLED
        assert [(a.decision, a.reason) for a in cancelled.approvals] == [
            (Decision.APPROVED, None),
            (Decision.DENIED, "interrupted"),
        ]

        after = session.submit("what happened?").wait(30)
        assert after.outcome is TurnStatus.FINISHED, after.error
        assert after.reply == "Nothing was recorded."
        assert server.pending() == 0 and len(server.received) == 2  # none refused
    assert chaos.control.recorded_calls() == []
    body = server.received[1].json()
    assert openai_message_faults(body) == []
    messages = body["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "user",
    ]
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["call_a", "call_b"]
    assert [(m["tool_call_id"], m["content"]) for m in messages[3:5]] == [
        ("call_a", NOT_RUN_INTERRUPTED),
        ("call_b", "refused by policy rule approval: the operator denied this call: interrupted"),
    ]
    assert messages[5] == {"role": "user", "content": "what happened?"}
