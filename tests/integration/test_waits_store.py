"""The store's side of waiting for an event (docs/time.md#how-a-wait-is-kept), on both
databases: a hold is fenced and takes a signal kept for it; each wait ends once, by a
signal, its deadline or an interrupt; the run is queued again once none waits; a release
reads the runs whose deadline came from their index alone (ix_runs_wait_due), and the
sweeper's count the runs waiting for an event from theirs (ix_runs_waiting_event)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from parley.errors import TurnEnded, TurnNotFound
from parley.ports.backend import EventHold, EventWait
from parley.schemas.errors import Fenced
from parley.schemas.records import SteerKind, TurnStatus, Waiting
from parley.store.sql_store import SqlStore
from parley.store.statements import waits as wq
from tests.integration.drive import Driving, finish, migrated_store, new_session, start, submit

pytestmark = pytest.mark.postgres

HELD = {"v": 1, "index": 0, "payload": {}, "cursor": 0, "judgements": []}
"""What the store keeps of a held step: opaque to it."""


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    with migrated_store(db_url) as opened:
        yield opened


def hold(store: SqlStore, d: Driving, *waits: EventWait, fence: int | None = None) -> bool:
    return store.hold_for_event(
        run_id=d.run_id,
        session_id=d.session_id,
        fence=d.fence if fence is None else fence,
        hold=EventHold(turn_id=d.turn_id, step=0, cursor=0, held_step=HELD, waits=waits),
        events=[],
    )


def wait(
    call_id: str, position: int, event: str | None, until: datetime | None = None
) -> EventWait:
    return EventWait(call_id=call_id, position=position, event=event, until=until)


def driving(store: SqlStore) -> Driving:
    session = new_session(store)
    submit(store, session)
    return start(store, session)


def test_each_wait_ends_once_and_the_run_is_queued_once_none_waits(store: SqlStore) -> None:
    d = driving(store)
    past = datetime.now(UTC) - timedelta(seconds=1)
    assert hold(store, d, wait("c0", 0, "soon", past), wait("c1", 1, "go")) is False
    record = store.get_turn(d.turn_id)
    assert (record.status, record.waiting_for, record.waiting_event) == (
        TurnStatus.WAITING,
        Waiting.EVENT,
        "go",  # (the first by name of those still waiting)
    )
    assert record.not_before is not None  # the soonest deadline

    # The deadline came: that wait times out; the other still waits, with no deadline.
    assert store.release_due_waits() == []
    ended = store.waits_of_step(d.run_id, 0)
    assert (ended["c0"].state, ended["c1"].state) == ("timed_out", "waiting")
    record = store.get_turn(d.turn_id)
    assert (record.status, record.not_before, record.waiting_event) == (
        TurnStatus.WAITING,
        None,
        "go",
    )
    # A signal for the timed-out wait wakes nothing: it is kept.
    assert store.signal_turn(d.turn_id, "soon", 1).delivered is False
    signalled = store.signal_turn(d.turn_id, "go", {"ok": True})
    assert signalled.delivered and signalled.answered.runnable
    ended = store.waits_of_step(d.run_id, 0)
    assert (ended["c1"].state, ended["c1"].payload) == ("signalled", {"ok": True})
    record = store.get_turn(d.turn_id)
    assert (record.status, record.waiting_for, record.waiting_event) == (
        TurnStatus.QUEUED,
        None,
        None,
    )
    # A second signal of the name finds no call waiting: kept, the run left as it is.
    again = store.signal_turn(d.turn_id, "go", "again")
    assert not again.delivered and not again.answered.runnable


def test_a_hold_takes_the_oldest_signal_kept_for_it_and_the_run_still_runs(
    store: SqlStore,
) -> None:
    d = driving(store)
    assert store.signal_turn(d.turn_id, "go", "first").delivered is False
    assert store.signal_turn(d.turn_id, "go", "second").delivered is False
    assert hold(store, d, wait("c0", 0, "go")) is True  # met at once
    assert store.run_state(d.turn_id).status is TurnStatus.RUNNING
    assert store.waits_of_step(d.run_id, 0)["c0"].payload == "first"


def test_a_stale_fence_holds_nothing(store: SqlStore) -> None:
    d = driving(store)
    with pytest.raises(Fenced):
        hold(store, d, wait("c0", 0, "go"), fence=d.fence - 1)
    assert store.waits_of_step(d.run_id, 0) == {}
    assert store.run_state(d.turn_id).status is TurnStatus.RUNNING


def test_an_interrupt_cancels_the_waits_and_queues_the_run(store: SqlStore) -> None:
    d = driving(store)
    hold(store, d, wait("c0", 0, "go", datetime.now(UTC) + timedelta(hours=1)))
    receipt = store.accept_steer(d.turn_id, SteerKind.INTERRUPT, "")
    assert receipt.woken == d.session_id  # runnable at once: its session needs a kick
    assert store.waits_of_step(d.run_id, 0)["c0"].state == "cancelled"
    record = store.get_turn(d.turn_id)
    assert (record.status, record.not_before) == (TurnStatus.QUEUED, None)


def test_signals_to_unknown_or_ended_turns_are_refused_and_kept_nowhere(store: SqlStore) -> None:
    with pytest.raises(TurnNotFound):
        store.signal_turn("00000000-0000-0000-0000-000000000000", "go", None)
    d = driving(store)
    finish(store, d, d.next_seq)
    with pytest.raises(TurnEnded):
        store.signal_turn(d.turn_id, "go", None)
    with store.engine.connect() as db:
        kept = db.execute(wq.KEPT_SIGNAL, {"b_run_id": d.run_id, "b_name": "go"}).all()
    assert kept == []


def test_the_release_and_the_count_read_their_own_indexes(store: SqlStore) -> None:
    if store.engine.dialect.name != "postgresql":
        pytest.skip("the fleet's sweeper runs on PostgreSQL")
    binds = {"b_now": datetime.now(UTC), "b_limit": 1000}
    for statement, index, values in (
        (wq.DUE_WAITS, "ix_runs_wait_due", binds),
        (wq.WAITING_FOR_EVENTS, "ix_runs_waiting_event", {}),
    ):
        sql = str(statement.compile(store.engine))
        with store.engine.connect() as db:
            db.exec_driver_sql("SET enable_seqscan = off")  # a tiny table is read whole
            plan = " ".join(str(row) for row in db.exec_driver_sql(f"EXPLAIN {sql}", values).all())
        assert index in plan, plan


def test_an_interrupt_accepted_before_the_hold_ends_its_waits_at_once(store: SqlStore) -> None:
    d = driving(store)
    store.accept_steer(d.turn_id, SteerKind.INTERRUPT, "")  # (no wait to end yet)
    assert hold(store, d, wait("c0", 0, "go")) is True  # the turn goes on to stop
    assert store.waits_of_step(d.run_id, 0)["c0"].state == "cancelled"
    assert store.run_state(d.turn_id).status is TurnStatus.RUNNING
