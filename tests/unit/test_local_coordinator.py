"""The in-process coordinator's memory bounds: its replay buffers are bounded on ended
turns only, so a running turn's replay window stays the whole turn however many turns end
meanwhile, and it keeps nothing of idle sessions.  What it promises as a coordinator is
tested, with the Redis one, in tests/integration/test_coordinator_contract.py."""

from __future__ import annotations

from parley.coordination.local_coordinator import UNENDED_FACTOR, LocalCoordinator
from parley.schemas.events import Event, EventKind
from parley.schemas.records import Steer, SteerKind


def event(turn_id: str, seq: int, kind: EventKind = EventKind.TOKEN) -> Event:
    return Event(turn_id=turn_id, seq=seq, kind=kind, data={})


def test_ended_turns_make_way_but_a_running_turn_keeps_its_whole_buffer() -> None:
    coordinator = LocalCoordinator(retained_turns=2)
    coordinator.publish([event("running", 1), event("running", 2)])  # quiet from here on
    for n in range(5):
        coordinator.publish([event(f"ended{n}", 1), event(f"ended{n}", 2, EventKind.END)])

    assert [e.seq for e in coordinator.read_events("running", 0, timeout=0)] == [1, 2]
    kept = [n for n in range(5) if coordinator.read_events(f"ended{n}", 0, timeout=0)]
    assert kept == [4]  # the newest ended turn; the running one counts toward the two

    # Once it ends it is an ended turn like the others, least recently published first.
    coordinator.publish([event("running", 3, EventKind.END)])
    coordinator.publish([event("later", 1)])
    assert coordinator.read_events("ended4", 0, timeout=0) == []
    assert len(coordinator.read_events("running", 0, timeout=0)) == 3
    coordinator.publish([event("later still", 1)])
    assert coordinator.read_events("running", 0, timeout=0) == []


def test_turns_that_never_end_cannot_grow_the_buffers_forever() -> None:
    coordinator = LocalCoordinator(retained_turns=2)
    for n in range(20):  # announced, never run (say, each submission rolled back)
        coordinator.publish([event(f"announced{n}", 1, EventKind.QUEUED)])
    kept = [n for n in range(20) if coordinator.read_events(f"announced{n}", 0, timeout=0)]
    assert kept == list(range(20 - 2 * UNENDED_FACTOR, 20))  # the most recent


def test_a_running_turns_tokens_outlast_a_deep_queue_of_announced_turns() -> None:
    # Announced turns' buffers hold only durable events (a reader gets them from the
    # store): they make way before a running turn's tokens, which live only here.
    coordinator = LocalCoordinator(retained_turns=2)
    coordinator.publish([event("running", 1, EventKind.STARTED), event("running", 2)])
    for n in range(20):
        coordinator.publish([event(f"queued{n}", 1, EventKind.QUEUED)])
    assert [e.seq for e in coordinator.read_events("running", 0, timeout=0)] == [1, 2]
    kept = [n for n in range(20) if coordinator.read_events(f"queued{n}", 0, timeout=0)]
    assert kept == list(range(20 - 2 * UNENDED_FACTOR + 1, 20))


def test_a_long_lived_process_keeps_nothing_of_sessions_and_turns_long_gone() -> None:
    coordinator = LocalCoordinator(retained_turns=2)
    for n in range(50):
        lock = coordinator.try_lock(f"session{n}")
        assert lock is not None
        coordinator.mark_work(f"session{n}")
        coordinator.adopt(f"turn{n}", fence=1)
        coordinator.publish([event(f"turn{n}", 1)], 1)
        coordinator.push_steer(f"turn{n}", Steer(position=1, kind=SteerKind.INTERRUPT, text=""))
        coordinator.publish([event(f"turn{n}", 2, EventKind.END)], 1)
        lock.release()
    state = vars(coordinator)
    assert not state["_held"] and not state["_marks"]
    assert len(state["_owners"]) <= 2 and len(state["_steers"]) <= 2
