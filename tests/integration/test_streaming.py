"""Readers never skip a durable event: a gap in the replay buffer is jumped only once the
store shows everything below it is committed."""

from __future__ import annotations

import threading

from parley.streaming import PATIENCE_SECONDS, follow
from schemas.events import Event, EventKind
from tests.integration.drive import commit, finish, new_session, start, submit
from workers.local_coordinator import LocalCoordinator
from workers.store import SqlStore


def test_a_reader_waits_for_a_lost_durable_event_instead_of_skipping_it(
    sqlite_store: SqlStore,
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
    reader = threading.Thread(
        target=lambda: seen.extend(
            e.seq for e in follow(turn_id, 2, coordinator=coordinator, store=store)
        )
    )
    reads = 0
    events_after = store.events_after

    def counted(turn: str, after: int) -> list[Event]:
        nonlocal reads
        reads += 1
        return events_after(turn, after)

    store.events_after = counted  # type: ignore[method-assign]
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
