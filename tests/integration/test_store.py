"""The store's concurrency rules on SQLite and PostgreSQL: fencing, whole and idempotent
step commits, the steer inbox, and one schema from one set of migrations."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import inspect

from parley.errors import Fenced, TurnEnded
from schemas.events import Event, EventKind
from schemas.messages import StepPayload
from schemas.records import IfBusy, SteerKind, TurnStatus, Usage
from workers.database import create_database_engine, current_revision, head_revision, migrate
from workers.store import SqlStore


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    engine = create_database_engine(db_url)
    migrate(engine)
    store = SqlStore(engine)
    yield store
    store.close()


def queued_turn(store: SqlStore) -> tuple[str, str, str]:
    session = store.create_session(root="/tmp", metadata={}, token_ceiling=None)
    receipt = store.submit_turn(
        session_id=session.session_id,
        prompt="p",
        request_id=None,
        contract=None,
        if_busy=IfBusy.ENQUEUE,
    )
    return session.session_id, receipt.turn.turn_id, receipt.turn.run_id


def commit(store: SqlStore, ids: tuple[str, str, str], fence: int, index: int, seq: int) -> None:
    session_id, turn_id, run_id = ids
    store.commit_step(
        run_id=run_id,
        session_id=session_id,
        fence=fence,
        index=index,
        payload=StepPayload(text=f"step {index}", usage=Usage(input_tokens=3, output_tokens=2)),
        steer_cursor=0,
        events=[Event(turn_id=turn_id, seq=seq, kind=EventKind.STEP, data={})],
        close_inbox_if_idle=False,
    )


def test_a_stale_fence_commits_nothing(store: SqlStore) -> None:
    session_id, turn_id, run_id = queued_turn(store)
    old = store.take_fence(session_id)
    claimed, _ = store.claim_turn(turn_id, fence=old, worker="a", seq_floor=0)
    new = store.take_fence(session_id)  # another driver took the session over
    assert new == old + 1

    with pytest.raises(Fenced):
        commit(store, (session_id, turn_id, run_id), old, 0, claimed.next_seq)
    with pytest.raises(Fenced):
        store.finish_turn(
            run_id=run_id,
            turn_id=turn_id,
            session_id=session_id,
            fence=old,
            status=TurnStatus.FINISHED,
            reply="r",
            error=None,
            partial=None,
            cursor=0,
            prefix=None,
            refresh_prefix=False,
            events=[],
            end_seq=claimed.next_seq,
        )
    with pytest.raises(Fenced):
        store.claim_turn(turn_id, fence=old, worker="a", seq_floor=0)
    assert store.steps_of(turn_id) == []
    assert store.get_session(session_id).tokens_used == 0
    assert store.run_state(turn_id).status is TurnStatus.RUNNING

    store.claim_turn(turn_id, fence=new, worker="b", seq_floor=0)
    commit(store, (session_id, turn_id, run_id), new, 0, 10)
    assert [s.payload.text for s in store.steps_of(turn_id)] == ["step 0"]


def test_a_step_is_committed_once_even_if_the_commit_is_replayed(store: SqlStore) -> None:
    session_id, turn_id, run_id = queued_turn(store)
    fence = store.take_fence(session_id)
    store.claim_turn(turn_id, fence=fence, worker="a", seq_floor=0)
    commit(store, (session_id, turn_id, run_id), fence, 0, 3)
    with pytest.raises(Fenced):
        commit(store, (session_id, turn_id, run_id), fence, 0, 4)  # the same step again
    assert len(store.steps_of(turn_id)) == 1
    assert store.run_state(turn_id).usage == Usage(input_tokens=3, output_tokens=2)
    assert store.get_session(session_id).tokens_used == 5


def test_steers_racing_the_inbox_close_are_seen_or_refused(store: SqlStore) -> None:
    for _ in range(20):
        session_id, turn_id, run_id = queued_turn(store)
        fence = store.take_fence(session_id)
        store.claim_turn(turn_id, fence=fence, worker="a", seq_floor=0)
        accepted: list[int] = []
        refused: list[int] = []
        start = threading.Barrier(5)

        def say(
            n: int,
            turn_id: str = turn_id,
            start: threading.Barrier = start,
            accepted: list[int] = accepted,
            refused: list[int] = refused,
        ) -> None:
            start.wait()
            try:
                accepted.append(store.add_steer(turn_id, SteerKind.SAY, f"s{n}").position)
            except TurnEnded:
                refused.append(n)

        threads = [threading.Thread(target=say, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        start.wait()
        pending = store.close_inbox(run_id=run_id, session_id=session_id, fence=fence, cursor=0)
        for thread in threads:
            thread.join()
        assert len(accepted) + len(refused) == 4
        if pending:
            # The close saw every steer accepted before it and kept the inbox open.
            assert [s.position for s in pending] == list(range(1, len(pending) + 1))
            assert set(range(1, len(pending) + 1)) <= set(accepted)
        else:
            # The close won: nothing was accepted, every later say was refused.
            assert accepted == []
            assert len(refused) == 4


def test_migrations_build_the_same_schema_everywhere(db_url: str, tmp_path: object) -> None:
    engine = create_database_engine(db_url)
    migrate(engine)
    migrate(engine)  # idempotent
    assert current_revision(engine) == head_revision()
    inspector = inspect(engine)
    tables = {
        name: sorted(c["name"] for c in inspector.get_columns(name))
        for name in inspector.get_table_names()
        if name != "alembic_version"
    }
    engine.dispose()
    from schemas.tables import metadata

    declared = {t.name: sorted(c.name for c in t.columns) for t in metadata.sorted_tables}
    assert tables == declared


def test_storage_per_turn_does_not_grow_with_the_session(store: SqlStore) -> None:
    session = store.create_session(root="/tmp", metadata={}, token_ceiling=None)
    counts = []
    for n in range(30):
        before = store.table_counts()
        receipt = store.submit_turn(
            session_id=session.session_id,
            prompt=f"p{n}",
            request_id=None,
            contract=None,
            if_busy=IfBusy.ENQUEUE,
        )
        fence = store.take_fence(session.session_id)
        claimed, _ = store.claim_turn(receipt.turn.turn_id, fence=fence, worker="w", seq_floor=0)
        commit(
            store,
            (session.session_id, receipt.turn.turn_id, receipt.turn.run_id),
            fence,
            0,
            claimed.next_seq,
        )
        store.finish_turn(
            run_id=receipt.turn.run_id,
            turn_id=receipt.turn.turn_id,
            session_id=session.session_id,
            fence=fence,
            status=TurnStatus.FINISHED,
            reply="r",
            error=None,
            partial=None,
            cursor=0,
            prefix=None,
            refresh_prefix=False,
            events=[],
            end_seq=claimed.next_seq + 1,
        )
        after = store.table_counts()
        counts.append({k: after[k] - before[k] for k in after})
    assert all(c == counts[0] for c in counts)  # rows written per turn are constant
    assert len(store.history(session.session_id)) == 30


def test_interrupting_a_turn_that_is_already_committing_its_end_does_not_fail_the_submit(
    store: SqlStore,
) -> None:
    session_id, turn_id, run_id = queued_turn(store)
    fence = store.take_fence(session_id)
    store.claim_turn(turn_id, fence=fence, worker="a", seq_floor=0)
    # The model stopped: the last step closed the inbox; the turn is not finished yet.
    store.commit_step(
        run_id=run_id,
        session_id=session_id,
        fence=fence,
        index=0,
        payload=StepPayload(text="done"),
        steer_cursor=0,
        events=[],
        close_inbox_if_idle=True,
    )
    receipt = store.submit_turn(
        session_id=session_id,
        prompt="urgent",
        request_id=None,
        contract=None,
        if_busy=IfBusy.INTERRUPT,
    )
    assert receipt.created and receipt.interrupted_turn_ids == ()
    assert store.pending_steers(run_id, 0) == ()


def test_turns_start_in_submission_order_whatever_the_producers_clocks_say(
    store: SqlStore,
) -> None:
    from sqlalchemy import text

    session_id, first_turn, _ = queued_turn(store)
    second = store.submit_turn(
        session_id=session_id,
        prompt="second",
        request_id=None,
        contract=None,
        if_busy=IfBusy.ENQUEUE,
    )
    # The second producer's clock runs a minute behind the first's.
    with store.engine.begin() as db:
        db.execute(
            text("UPDATE runs SET queued_at = :t WHERE turn_id = :id"),
            {"t": datetime(2020, 1, 1, tzinfo=UTC), "id": second.turn.turn_id},
        )
    _fence, claim = store.start_drive(session_id, worker="w", seq_floor=lambda _t, _f: 0)
    assert claim is not None and claim[0].turn.turn_id == first_turn
