"""The store's side of delayed turns (docs/time.md#delayed-turns), on both databases:
a delayed run is no work for the sweeper until its time, which a release reads from the
runs waiting for a time alone (ix_runs_due), so what waits for later costs a sweep
nothing; a driver claims nothing of its session before then, and the session's later
turns wait behind it, while a turn before it stays work to recover."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from parley.schemas.records import IfBusy, TurnStatus, Waiting
from parley.store import statements as q
from parley.store.sql_store import SqlStore
from tests.integration.drive import migrated_store, new_session, start, submit

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    with migrated_store(db_url) as opened:
        yield opened


def delayed(store: SqlStore, session_id: str, seconds: float, prompt: str = "later") -> str:
    receipt = store.submit_turn(
        session_id=session_id,
        prompt=prompt,
        request_id=None,
        contract=None,
        if_busy=IfBusy.ENQUEUE,
        not_before=datetime.now(UTC) + timedelta(seconds=seconds),
    )
    assert receipt.turn.waiting_for is Waiting.TIME
    return receipt.turn.turn_id


def claimed(store: SqlStore, session_id: str) -> str | None:
    _fence, claim = store.start_drive(session_id, worker="w", seq_floor=lambda _t, _f: 0)
    return None if claim is None else claim[0].turn.turn_id


def test_a_delayed_run_is_no_work_until_its_time_and_its_session_waits_behind_it(
    store: SqlStore,
) -> None:
    session = new_session(store)
    first = delayed(store, session, 1.0)
    submit(store, session, "behind it")
    assert session not in store.sessions_with_work()
    assert claimed(store, session) is None  # the turn behind it waits too
    assert session not in dict(store.release_due_runs())
    assert store.get_turn(first).status is TurnStatus.QUEUED

    time.sleep(1.1)
    assert dict(store.release_due_runs()).get(session) == "interactive"
    assert session not in dict(store.release_due_runs())  # released once
    assert session in store.sessions_with_work()
    record = store.get_turn(first)
    assert record.not_before is None and record.waiting_for is None  # in line now
    assert claimed(store, session) == first


def test_a_turn_before_a_delayed_one_stays_work_to_recover(store: SqlStore) -> None:
    session = new_session(store)
    submit(store, session, "running")
    start(store, session)  # (its driver dies: nothing else holds the session)
    delayed(store, session, 3600)
    assert session in store.sessions_with_work()


def test_a_release_reads_only_the_due_runs_from_their_index(store: SqlStore) -> None:
    waiting = [new_session(store) for _ in range(30)]
    for session in waiting:
        delayed(store, session, 3600)
    due = new_session(store)
    delayed(store, due, 0)
    released = dict(store.release_due_runs())
    assert due in released and not set(waiting) & set(released)
    if store.engine.dialect.name != "postgresql":
        return  # (the fleet's sweeper runs on PostgreSQL)
    sql = str(q.RELEASE_DUE.compile(store.engine))
    with store.engine.connect() as db:
        db.exec_driver_sql("SET enable_seqscan = off")  # a tiny table is read whole
        plan = db.exec_driver_sql(
            f"EXPLAIN {sql}", {"b_now": datetime.now(UTC), "b_limit": 1000}
        ).all()
    text = " ".join(str(row) for row in plan)
    assert "ix_runs_due" in text, text


def test_status_counts_the_delayed_turns_and_their_next_time(store: SqlStore) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"  # (other tests' turns share the database)
    session = store.create_session(
        root="/tmp", metadata={}, token_ceiling=None, tenant=tenant
    ).session_id
    delayed(store, session, 3600)
    delayed(store, session, 60)
    [lane] = [lane for lane in store.work_by_lane() if lane.tenant == tenant]
    assert lane.delayed == 2 and lane.waiting_capacity == 0
    assert lane.next_due is not None
    soon = datetime.now(UTC) + timedelta(seconds=60)
    assert soon - timedelta(seconds=5) < lane.next_due <= soon
    # Waiting for a time is not waiting for capacity, which every sweep counts from the
    # index of those runs alone.
    assert not [key for key in store.waiting_for_capacity() if key[0] == tenant]
    if store.engine.dialect.name != "postgresql":
        return
    sql = str(q.CAPACITY_BY_LANE.compile(store.engine))
    with store.engine.connect() as db:
        db.exec_driver_sql("SET enable_seqscan = off")
        plan = " ".join(str(row) for row in db.exec_driver_sql(f"EXPLAIN {sql}").all())
    assert "ix_runs_capacity" in plan, plan
