"""The fleet under failure, with real processes: workers killed with SIGKILL, a worker
paused past its lock, Redis emptied or its connections cut, database backends
terminated, and a load of sessions.  Each test gets its own database, Redis database
and fleet (two workers and the sweeper), and runs on two deployments
(``tests.support.chaos.DEPLOYMENTS``): prefork, one kick at a time in a child process of each
worker, and the Procfile's worker line (Celery's threads pool, its concurrency, kicks in
the worker process itself); those marked ``also_amqp`` also on the Procfile's line with
RabbitMQ as the broker."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import parley
from parley.coordination.constants import TAKEOVER_SEQ_GAP, kicked_key
from parley.engine.turn_engine import MAX_ATTEMPTS
from parley.schemas.events import EventKind
from tests.support.chaos import CHAOS_REDIS_URL, Chaos, chaos_fleet, deployment_options
from tests.support.databases import terminate_backends
from tests.support.deployments import on_fleet_deployments
from tests.support.events import assert_once_in_order
from tests.support.fleet import flush_redis
from tests.support.fleet_scenarios import (
    assert_completed_once_in_order,
    killed_during_a_tool_call,
    steers_and_rejoining_readers,
    submit_load,
)
from tests.support.waiting import wait_until

pytestmark = [on_fleet_deployments(), pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def chaos(workspace: Path, deployment: str, request: pytest.FixtureRequest) -> Iterator[Chaos]:
    with chaos_fleet(workspace, **deployment_options(deployment, request)) as harness:
        yield harness


@pytest.mark.also_amqp
def test_a_worker_killed_during_a_tool_call_is_replaced_and_the_step_redone(chaos: Chaos) -> None:
    handle, recovered_in = killed_during_a_tool_call(chaos)
    events = list(handle.events())
    restarts = [e.data for e in events if e.kind is EventKind.STEP_RESTARTED]
    assert restarts == [{"index": 1, "reason": "resumed"}]
    assert recovered_in < 15, f"took {recovered_in:.1f}s to resume"


def test_a_worker_killed_while_streaming_is_replaced_and_readers_are_told(chaos: Chaos) -> None:
    text = "".join(f"w{i:03d} " for i in range(120))
    chaos.control.script(
        [
            {
                "when": "stream",
                "steps": [
                    {"tool_calls": [{"name": "list_files"}]},
                    {"text": text, "chunk_chars": 5, "delay_ms": 20},
                ],
            }
        ]
    )
    handle = chaos.client.open_session(chaos.workspace).submit("stream and crash")
    for event in handle.events():
        if event.kind is EventKind.TOKEN and event.data["step"] == 1:
            break
    victim = chaos.driver_pid(handle.turn_id)
    os.killpg(chaos.worker_group_of(victim), signal.SIGKILL)

    result = handle.wait(60)
    assert result.reply == text
    assert [s.index for s in chaos.client.store.steps_of(handle.turn_id)] == [0, 1]
    events = list(handle.events())
    assert_once_in_order(events)
    takeover = next(e for e in events if e.data.get("attempt") == 2)
    committed = next(e for e in events if e.kind is EventKind.STEP)  # step 0's, the last
    assert takeover.seq == committed.seq + TAKEOVER_SEQ_GAP + 1
    restarted = max(i for i, e in enumerate(events) if e.kind is EventKind.STEP_RESTARTED)
    assert events[restarted].data == {"index": 1, "reason": "resumed"}
    redone = [e.data["text"] for e in events[restarted:] if e.kind is EventKind.TOKEN]
    assert "".join(redone) == text  # after the restart, the tokens are the committed text


@pytest.mark.also_amqp
def test_a_worker_told_to_stop_finishes_its_turn_and_hands_the_session_over(
    chaos: Chaos,
) -> None:
    # A deploy stops a worker with SIGTERM to its main process (systemd's KillMode=mixed).
    # Its driver must finish the turn it runs, not the session's whole backlog, and the
    # rest must go on at once on another worker, with no step redone.
    chaos.control.script(
        [
            {
                "when": "^gated",
                "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "a"}],
            },
            {"when": ".*", "steps": [{"text": "b"}]},
        ]
    )
    session = chaos.client.open_session(chaos.workspace)
    handles = [session.submit(prompt) for prompt in ("gated", "second", "third")]
    chaos.control.wait_entered()
    driver = chaos.driver_pid(handles[0].turn_id)
    worker = next(w for w in chaos.workers if w.pid == chaos.worker_group_of(driver))
    os.kill(worker.pid, signal.SIGTERM)
    log = chaos.fleet.log_of(worker)
    wait_until(lambda: b"Warm shutdown" in log.read_bytes(), what="the warm shutdown")
    chaos.control.open_gate()  # (the turn waited at the gate meanwhile)

    results = [handle.wait(60) for handle in handles]
    assert [r.outcome for r in results] == [parley.TurnStatus.FINISHED] * 3
    assert [r.reply for r in results] == ["a", "b", "b"]
    worker.wait(20)  # it exits once its turn is done, without the backlog
    assert chaos.driver_pid(handles[0].turn_id) == driver
    survivor = next(w for w in chaos.workers if w is not worker)
    groups = {_group_of(chaos.driver_pid(h.turn_id)) for h in handles[1:]}
    assert groups == {survivor.pid}, "the stopping worker ran the session's backlog"
    assert [chaos.client.store.run_state(h.turn_id).attempts for h in handles] == [1, 1, 1]
    kinds = [e.kind for h in handles for e in h.events()]
    assert EventKind.STEP_RESTARTED not in kinds
    # Handed over with a kick, not found seconds later by the sweeper.
    assert not redis.Redis.from_url(CHAOS_REDIS_URL).exists(kicked_key(session.id))


def _group_of(pid: int) -> int | None:
    """The process group of ``pid``, or None once it is gone."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.mark.also_amqp
def test_a_paused_worker_that_lost_its_lock_commits_nothing(chaos: Chaos) -> None:
    chaos.control.script(
        [{"when": "pause", "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "ok"}]}]
    )
    handle = chaos.client.open_session(chaos.workspace).submit("pause me")
    chaos.control.wait_entered()
    stale = chaos.driver_pid(handle.turn_id)
    group = chaos.worker_group_of(stale)
    os.killpg(group, signal.SIGSTOP)
    try:
        # The lock expires, the sweeper kicks, the other worker takes over the turn.
        fresh = wait_until(
            lambda: (chaos.control.entered_by() - {stale}) or None, timeout=30, what="takeover"
        ).pop()
    finally:
        os.killpg(group, signal.SIGCONT)
    chaos.control.open_gate(stale)  # the stale worker finishes its step first...
    time.sleep(2)
    assert chaos.client.store.steps_of(handle.turn_id) == []  # ...and the fence rejects it
    chaos.control.open_gate(fresh)
    result = handle.wait(60)
    assert result.outcome is parley.TurnStatus.FINISHED and result.reply == "ok"
    steps = chaos.client.store.steps_of(handle.turn_id)
    assert [s.index for s in steps] == [0, 1]
    assert steps[0].payload.tool_results[0].content == f"gate opened (pid {fresh})"
    # The stale driver's events never reached the buffer the new one writes: a reader
    # sees one sequence, gap-free but for the new attempt's start.
    events = list(chaos.client.attach(handle.turn_id).events())
    assert_once_in_order(events)
    starts = [e.data["attempt"] for e in events if e.kind is EventKind.STARTED]
    assert starts == [1, 2]
    results = [e.data["content"] for e in events if e.kind is EventKind.TOOL_RESULT]
    assert results == [f"gate opened (pid {fresh})"]


@pytest.mark.also_amqp
def test_emptying_redis_under_load_loses_no_turn(chaos: Chaos) -> None:
    load = submit_load(chaos, sessions=8, turns=4)
    wait_until(
        lambda: (
            sum(chaos.client.store.run_state(h.turn_id).status.terminal for s in load for h in s)
            >= 4
        ),
        what="some turns to finish",
    )
    flush_redis(CHAOS_REDIS_URL)  # locks, buffers, queued kicks: all gone
    assert_completed_once_in_order(chaos, load)


def test_cutting_every_redis_connection_mid_turn_duplicates_no_step(chaos: Chaos) -> None:
    chaos.control.script(
        [{"when": "cut", "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "ok"}]}]
    )
    handle = chaos.client.open_session(chaos.workspace).submit("cut the wire")
    chaos.control.wait_entered()
    admin = redis.Redis.from_url(CHAOS_REDIS_URL)
    # Every connection of this fleet's database, and no other's: the server is shared
    # (with another test process, say).
    database = admin.connection_pool.connection_kwargs.get("db", 0)
    mine = admin.client_id()
    for client in admin.client_list():
        if int(client["db"]) == database and int(client["id"]) != mine:
            admin.client_kill_filter(_id=client["id"])
    admin.close()
    chaos.control.open_gate()
    result = handle.wait(60)
    assert result.outcome is parley.TurnStatus.FINISHED
    assert [s.index for s in chaos.client.store.steps_of(handle.turn_id)] == [0, 1]


def test_terminating_the_workers_database_backends_mid_turn(chaos: Chaos) -> None:
    chaos.control.script(
        [{"when": "pg", "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "ok"}]}]
    )
    handle = chaos.client.open_session(chaos.workspace).submit("pg goes away")
    chaos.control.wait_entered()
    assert terminate_backends(chaos.database_url) > 0
    chaos.control.open_gate()
    result = handle.wait(60)
    assert result.outcome is parley.TurnStatus.FINISHED and result.reply == "ok"
    steps = chaos.client.store.steps_of(handle.turn_id)
    assert [s.index for s in steps] == [0, 1]  # nothing half-written, nothing twice


@pytest.mark.also_amqp
def test_many_sessions_with_steers_and_reconnecting_readers(chaos: Chaos) -> None:
    steers_and_rejoining_readers(chaos)


def test_a_driver_that_lost_its_lock_during_a_slow_approval_runs_no_tool(chaos: Chaos) -> None:
    # The approver is host code that may take any time (a person): a driver that lost
    # the session meanwhile must not run the call once it is approved.
    call = {"name": "record_call", "arguments": {"approval_gate": str(chaos.control.dir)}}
    chaos.control.script(
        [{"when": "approve", "steps": [{"tool_calls": [call]}, {"text": "recorded once"}]}]
    )
    handle = chaos.client.open_session(chaos.workspace).submit("approve slowly")
    chaos.control.wait_entered(gate="approval")
    stale = chaos.driver_pid(handle.turn_id)
    group = chaos.worker_group_of(stale)
    os.killpg(group, signal.SIGSTOP)  # past the lock's life, inside the approver
    try:
        fresh = wait_until(
            lambda: (chaos.control.entered_by("approval") - {stale}) or None,
            timeout=30,
            what="takeover",
        ).pop()
        chaos.control.open_gate(fresh, gate="approval")
        result = handle.wait(60)
    finally:
        os.killpg(group, signal.SIGCONT)
    assert result.outcome is parley.TurnStatus.FINISHED and result.reply == "recorded once"
    assert chaos.control.recorded_calls() == [fresh]
    chaos.control.open_gate(stale, gate="approval")  # the stale approver says yes at last
    time.sleep(2)
    assert chaos.control.recorded_calls() == [fresh]  # and its driver runs nothing
    assert (
        "lost session"
        in chaos.fleet.log_of(next(w for w in chaos.workers if w.pid == group)).read_text()
    )


def test_a_long_turn_taken_over_more_times_than_the_attempt_limit_finishes(chaos: Chaos) -> None:
    # Attempts that commit steps are progress, not a crash loop: only claims in a row
    # that commit nothing may make a turn give up.  Steps of half a second, so that a
    # driver cut off by the flush commits at most a couple more before the next claim
    # fences it out.
    step = {
        "text": "step ",
        "chunk_chars": 1,
        "delay_ms": 100,
        "tool_calls": [{"name": "list_files"}],
    }
    steps = 40
    chaos.control.script([{"when": "long", "steps": [step] * steps + [{"text": "done"}]}])
    handle = chaos.client.open_session(chaos.workspace).submit("a long turn")
    store = chaos.client.store
    wait_until(lambda: store.run_state(handle.turn_id).steps > 0, what="the first step")
    for _ in range(MAX_ATTEMPTS + 1):
        before = store.run_state(handle.turn_id).attempts
        flush_redis(CHAOS_REDIS_URL)  # every lock gone: the next driver takes over
        taken = wait_until(
            lambda before=before: (
                (state := store.run_state(handle.turn_id)).attempts > before and state
            ),
            what="a takeover",
        )
        wait_until(
            lambda taken=taken: store.run_state(handle.turn_id).steps > taken.steps,
            what="the new attempt to commit a step",
        )
    result = handle.wait(90)
    assert result.outcome is parley.TurnStatus.FINISHED and result.reply == "done"
    state = store.run_state(handle.turn_id)
    assert state.attempts > MAX_ATTEMPTS + 1 and state.steps == steps + 1
    assert [s.index for s in store.steps_of(handle.turn_id)] == list(range(steps + 1))


def test_a_producer_paused_inside_a_submission_does_not_stall_the_running_turn(
    chaos: Chaos, monkeypatch: pytest.MonkeyPatch
) -> None:
    chaos.control.script(
        [
            {
                "when": "^running",
                "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "a"}],
            },
            {"when": ".*", "steps": [{"text": "b"}]},
        ]
    )
    session = chaos.client.open_session(chaos.workspace)
    running = session.submit("running turn")
    chaos.control.wait_entered()
    # Another producer whose Redis stalls while it submits to the same session.
    producer = chaos.fleet.client()
    stalled, resume = threading.Event(), threading.Event()
    mark_work = producer.coordinator.mark_work

    def slow_mark_work(*args: Any, **kwargs: Any) -> bool:
        stalled.set()
        resume.wait(60)
        return mark_work(*args, **kwargs)

    monkeypatch.setattr(producer.coordinator, "mark_work", slow_mark_work)
    handles: list[parley.TurnHandle] = []
    submitter = threading.Thread(
        target=lambda: handles.append(producer.session(session.id).submit("queued behind")),
        daemon=True,
    )
    submitter.start()
    try:
        assert stalled.wait(10)
        chaos.control.open_gate()
        # The running turn commits its steps and its end while the producer is stuck.
        result = running.wait(15)
        assert result.outcome is parley.TurnStatus.FINISHED and result.reply == "a"
    finally:
        resume.set()
        submitter.join(30)
    assert handles[0].wait(30).reply == "b"
    producer.close()


def gated_then_echo(chaos: Chaos) -> None:
    """Step 0 waits at the gate; step 1 answers with what it heard last."""
    chaos.control.script(
        [
            {
                "when": "steer",
                "steps": [
                    {"tool_calls": [{"name": "wait_for_gate"}]},
                    {"text": "heard: {last_message}"},
                ],
            }
        ]
    )


def steers_heard(chaos: Chaos, turn_id: str) -> list[list[str]]:
    """The steer texts of each model request of the turn, in order."""
    return [
        chaos.control.user_texts(r, origin="steer")
        for r in chaos.control.requests()
        if r["turn_id"] == turn_id
    ]


def test_a_flood_of_steers_reaches_the_model_once_each_in_order(chaos: Chaos) -> None:
    # Far more than a boundary reads from the steer list: the rest come from the store.
    gated_then_echo(chaos)
    handle = chaos.client.open_session(chaos.workspace).submit("steer flood")
    chaos.control.wait_entered()
    texts = [f"steer {n:04d}" for n in range(2000)]

    def send(part: list[str]) -> None:
        for text in part:
            handle.say(text)

    senders = [threading.Thread(target=send, args=(texts[n::4],)) for n in range(4)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(120)
    chaos.control.open_gate()
    result = handle.wait(60)
    assert result.outcome is parley.TurnStatus.FINISHED and result.undelivered == ()
    heard = steers_heard(chaos, handle.turn_id)
    assert heard[0] == [] and sorted(heard[1]) == texts and len(heard) == 2
    listed = [e.data["text"] for e in handle.events() if e.kind is EventKind.STEER]
    assert listed == heard[1]  # delivered in acceptance order, each once
    assert [e.data["position"] for e in handle.events() if e.kind is EventKind.STEER] == list(
        range(1, 2001)
    )


def test_a_steer_sent_before_its_worker_died_reaches_the_next_one_once(chaos: Chaos) -> None:
    gated_then_echo(chaos)
    handle = chaos.client.open_session(chaos.workspace).submit("steer, then crash")
    chaos.control.wait_entered()
    handle.say("before the crash")
    os.killpg(chaos.worker_group_of(chaos.driver_pid(handle.turn_id)), signal.SIGKILL)
    chaos.control.open_gate()
    result = handle.wait(60)
    assert result.reply == "heard: before the crash"
    assert steers_heard(chaos, handle.turn_id)[-1] == ["before the crash"]
    assert sum(e.kind is EventKind.STEER for e in handle.events()) == 1


def test_a_steer_whose_list_redis_lost_reaches_the_model_from_the_store(chaos: Chaos) -> None:
    gated_then_echo(chaos)
    handle = chaos.client.open_session(chaos.workspace).submit("steer, then lose redis")
    chaos.control.wait_entered()
    handle.say("kept by the store")
    flush_redis(CHAOS_REDIS_URL)  # the steer list, the lock, the buffer: gone
    chaos.control.open_gate()
    result = handle.wait(60)
    assert result.reply == "heard: kept by the store"
    assert [texts for texts in steers_heard(chaos, handle.turn_id) if texts] == [
        ["kept by the store"]
    ]
