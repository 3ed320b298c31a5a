"""Readers never skip a durable event: a gap in the replay buffer is jumped only once the
store shows everything below it is committed."""

from __future__ import annotations

import threading
import time

import pytest

from parley.coordination.local_coordinator import LocalCoordinator
from parley.coordination.redis_coordinator import RedisCoordinator
from parley.engine.emitter import Emitter
from parley.schemas.events import Event, EventKind, StepCommitted, StepRestarted
from parley.store.sql_store import SqlStore
from parley.streaming import PATIENCE_SECONDS, follow
from tests.integration.drive import Driving, commit, finish, new_session, start, submit
from tests.support.fleet import REDIS_TEST_URL, flush_redis


def test_a_reader_waits_for_a_lost_durable_event_instead_of_skipping_it(
    sqlite_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sqlite_store
    coordinator = LocalCoordinator()
    session_id = new_session(store)
    submit(store, session_id)
    d = start(store, session_id)
    turn_id = d.turn_id
    started = store.events_after(turn_id, 1)[0]
    assert started.kind is EventKind.STARTED and started.seq == 2

    def event(seq: int, kind: EventKind) -> Event:
        return Event(turn_id=turn_id, seq=seq, kind=kind, data={"seq": seq})

    # Published: tokens 3 and 4; the tool_call 5 was lost on its way to the buffer;
    # tokens 6 and 7 made it.  Nothing of the step is committed yet.
    coordinator.publish(
        [event(1, EventKind.QUEUED), started, event(3, EventKind.TOKEN), event(4, EventKind.TOKEN)]
    )
    coordinator.publish([event(6, EventKind.TOKEN), event(7, EventKind.TOKEN)])
    seen: list[int] = []
    reader = threading.Thread(  # a daemon: a failed assertion must not hang the run
        daemon=True,
        target=lambda: seen.extend(
            e.seq for e in follow(turn_id, 2, coordinator=coordinator, store=store)
        ),
    )
    reads = 0
    events_after = store.events_after

    def counted(turn: str, after: int) -> list[Event]:
        nonlocal reads
        reads += 1
        return events_after(turn, after)

    monkeypatch.setattr(store, "events_after", counted)
    reader.start()
    # Past its patience too: a gap above what the store settled may hold a durable event.
    reader.join(PATIENCE_SECONDS + 1)
    assert seen == [3, 4]  # it waits at the gap rather than jumping to 6
    assert reads < 60  # and polls the store meanwhile instead of spinning on 6 and 7

    step = event(8, EventKind.STEP)
    commit(store, d, 0, events=[event(5, EventKind.TOOL_CALL), step], close=True)
    coordinator.publish([step])
    finished = finish(store, d, 9)
    coordinator.publish([finished.end_event])
    reader.join(10)
    assert seen == [3, 4, 5, 6, 7, 8, 9]


def test_a_turn_taken_over_after_redis_lost_its_buffer_reuses_no_seq_a_reader_holds(
    sqlite_store: SqlStore,
) -> None:
    # The first attempt streams, a reader follows it, the attempt is cut off (its worker
    # died in a tool) and Redis loses the buffer.  The next attempt cannot know how far
    # the first one published: numbered from the last commit, its started and
    # step_restarted would sit below the reader's position, never to reach it.
    store = sqlite_store
    flush_redis(REDIS_TEST_URL)
    first, second, reading = (RedisCoordinator(REDIS_TEST_URL) for _ in range(3))
    try:
        session_id = new_session(store)
        submit(store, session_id, announce=lambda queued: first.publish([queued]))
        fence, claim = store.start_drive(session_id, worker="first", seq_floor=first.adopt)
        assert claim is not None
        claimed, started = claim
        turn_id = claimed.turn.turn_id
        emitter = Emitter(turn_id, claimed.next_seq, first, fence)
        emitter.publish(started)
        for n in range(20):
            emitter.emit_delta(0, f"first attempt {n} ", now=True)
        cut_off = emitter.next_seq - 1

        seen: list[Event] = []
        reader = threading.Thread(  # a daemon: a failed assertion must not hang the run
            target=lambda: seen.extend(follow(turn_id, 0, coordinator=reading, store=store)),
            daemon=True,
        )
        reader.start()
        deadline = time.monotonic() + 10
        while (not seen or seen[-1].seq < cut_off) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen and seen[-1].seq == cut_off
        flush_redis(REDIS_TEST_URL)  # the buffer, the lock, everything

        fence, claim = store.start_drive(session_id, worker="second", seq_floor=second.adopt)
        assert claim is not None
        claimed, started = claim
        assert started.seq > cut_off
        emitter = Emitter(turn_id, claimed.next_seq, second, fence)
        emitter.publish(started)
        emitter.emit(StepRestarted(step=0, reason="resumed"))
        emitter.emit_delta(0, "second attempt", now=True)
        step = emitter.allocate(StepCommitted(step=0, text=""))
        d = Driving(session_id, turn_id, claimed.run.run_id, fence, step.seq)
        commit(store, d, 0, events=[*emitter.take_unstored(), step], close=True)
        emitter.publish(step)
        emitter.publish(finish(store, d, step.seq + 1).end_event, now=True)
        reader.join(15)
        assert not reader.is_alive()
    finally:
        for coordinator in (first, second, reading):
            coordinator.close()

    seqs = [e.seq for e in seen]
    assert seqs == sorted(set(seqs))  # once each, in order
    after_cut = [e.kind for e in seen if e.seq > cut_off]
    assert after_cut[:3] == [EventKind.STARTED, EventKind.STEP_RESTARTED, EventKind.TOKEN]
    assert after_cut[-2:] == [EventKind.STEP, EventKind.END]
