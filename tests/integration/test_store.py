"""The store's concurrency rules on SQLite and PostgreSQL: fencing, whole and idempotent
step commits, the steer inbox, and one schema from one set of migrations."""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Iterator
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import inspect, select

from parley.coordination import constants as c
from parley.errors import Conflict, Fenced, SessionNotFound, StoreError, TurnEnded
from parley.ports.backend import ClaimedTurn, TurnEnd
from parley.schemas import tables as t
from parley.schemas.messages import Prefix
from parley.schemas.records import IfBusy, SteerKind, TurnStatus, Usage
from parley.store import statements as q
from parley.store.database import create_database_engine, current_revision, head_revision, migrate
from parley.store.rows import SessionRow, read_session
from parley.store.sql_store import SqlStore
from parley.store.submissions import SubmissionStore
from tests.integration.drive import (
    Driving,
    StatementLog,
    commit,
    finish,
    migrated_store,
    new_session,
    start,
    submit,
)
from tests.support.databases import terminate_backends


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    with migrated_store(db_url) as store:
        yield store


def test_a_stale_fence_commits_nothing(store: SqlStore) -> None:
    session_id = new_session(store)
    submit(store, session_id)
    old = start(store, session_id, worker="a")
    new = start(store, session_id, worker="b")  # another driver took the session over
    assert new.turn_id == old.turn_id and new.fence == old.fence + 1

    with pytest.raises(Fenced):
        commit(store, old, 0)
    with pytest.raises(Fenced):
        finish(store, old, old.next_seq + 1)
    last = TurnEnd(
        turn_id=old.turn_id, status=TurnStatus.FINISHED, reply="r", end_seq=old.next_seq + 1
    )
    with pytest.raises(Fenced):
        commit(store, old, 0, close=True, end=last)  # a last step with its turn's end
    with pytest.raises(Fenced):
        store.close_inbox(run_id=old.run_id, session_id=session_id, fence=old.fence, cursor=0)
    assert store.steps_of(old.turn_id) == []
    assert store.get_session(session_id).tokens_used == 0
    assert store.run_state(old.turn_id).status is TurnStatus.RUNNING
    assert store.run_state(old.turn_id).attempts == 2

    commit(store, new, 0)
    assert [s.payload.text for s in store.steps_of(new.turn_id)] == ["step 0"]


def test_a_step_is_committed_once_even_if_the_commit_is_replayed(store: SqlStore) -> None:
    session_id = new_session(store)
    submit(store, session_id)
    d = start(store, session_id)
    commit(store, d, 0)
    with pytest.raises(Fenced):
        commit(store, d, 0)  # the same step again
    assert len(store.steps_of(d.turn_id)) == 1
    assert store.run_state(d.turn_id).usage == Usage(input_tokens=3, output_tokens=2)
    assert store.get_session(session_id).tokens_used == 5


class RacingSays:
    """``count`` threads that each say something to a turn once the barrier opens (the
    caller is its last party), noting which says were accepted and which refused."""

    def __init__(self, store: SqlStore, turn_id: str, count: int) -> None:
        self.accepted: list[int] = []
        self.refused: list[int] = []
        self.barrier = threading.Barrier(count + 1)
        self._threads = [
            threading.Thread(target=self._say, args=(store, turn_id, n)) for n in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def _say(self, store: SqlStore, turn_id: str, n: int) -> None:
        self.barrier.wait()
        try:
            self.accepted.append(store.add_steer(turn_id, SteerKind.SAY, f"s{n}").position)
        except TurnEnded:
            self.refused.append(n)

    def join(self) -> None:
        for thread in self._threads:
            thread.join()


def test_steers_racing_the_inbox_close_are_seen_or_refused(store: SqlStore) -> None:
    for _ in range(20):
        session_id = new_session(store)
        turn_id, run_id = submit(store, session_id)
        fence = start(store, session_id).fence
        says = RacingSays(store, turn_id, 4)
        accepted, refused = says.accepted, says.refused
        says.barrier.wait()
        pending = store.close_inbox(run_id=run_id, session_id=session_id, fence=fence, cursor=0)
        says.join()
        assert len(accepted) + len(refused) == 4
        if pending:
            # The close saw every steer accepted before it and kept the inbox open.
            assert [s.position for s in pending] == list(range(1, len(pending) + 1))
            assert set(range(1, len(pending) + 1)) <= set(accepted)
        else:
            # The close won: nothing was accepted, every later say was refused.
            assert accepted == []
            assert len(refused) == 4


def test_a_final_step_ends_its_turn_in_its_own_transaction_unless_a_steer_is_pending(
    store: SqlStore,
) -> None:
    for attempt in range(20):
        session_id = new_session(store)
        turn_id, _run_id = submit(store, session_id)
        d = start(store, session_id)
        says = RacingSays(store, turn_id, 2)
        accepted, refused = says.accepted, says.refused
        end = TurnEnd(
            turn_id=turn_id, status=TurnStatus.FINISHED, reply="step 0", end_seq=d.next_seq + 1
        )
        before = store.transactions
        if attempt % 2:
            says.barrier.wait()  # half the time the steers race the commit
        receipt = commit(store, d, 0, close=True, end=end)
        if not attempt % 2:
            assert store.transactions == before + 1  # the step and the end: one transaction
            says.barrier.wait()
        says.join()
        state = store.run_state(turn_id)
        if receipt.finished is None:
            # A steer was accepted first: the step committed, the turn goes on.
            assert 1 <= receipt.steer_count <= len(accepted)
            assert state.status is TurnStatus.RUNNING and state.steps == 1
            assert accepted
            assert store.get_session(session_id).tokens_used == 5  # once, though tried twice
        else:
            # The turn ended with its step: head moved, end stored, every say refused.
            assert receipt.steer_count == 0 and accepted == [] and len(refused) == 2
            assert store.get_session(session_id).tokens_used == 5  # charged with the end
            assert receipt.finished.end_event.seq == d.next_seq + 1
            assert receipt.finished.head_turn_id == turn_id
            assert state.status is TurnStatus.FINISHED and state.steps == 1
            kinds = [e.kind.value for e in store.events_after(turn_id, 0)]
            assert kinds[-2:] == ["step", "end"]
            assert store.turn_result(turn_id) is not None


def _end_and_claim_next(
    store: SqlStore, claimed: ClaimedTurn, fence: int, status: TurnStatus, prefix: Prefix
) -> ClaimedTurn:
    """End ``claimed`` with ``status`` in the final step's transaction, claiming the next."""
    turn = claimed.turn
    end = TurnEnd(
        turn_id=turn.turn_id,
        status=status,
        reply="step 0",
        end_seq=claimed.next_seq + 1,
        prefix=prefix,
        claim_next=lambda _turn, _fence: 0,
        position=claimed.run.queue_position,
        path=(*(p.turn for p in claimed.history), turn),
    )
    d = Driving(turn.session_id, turn.turn_id, claimed.run.run_id, fence, claimed.next_seq)
    finished = commit(store, d, 0, close=True, end=end).finished
    assert finished is not None and finished.next_claim is not None
    return finished.next_claim[0]


def test_a_claim_chained_to_a_turns_end_takes_the_path_and_prefix_the_turn_knows(
    store: SqlStore,
) -> None:
    prefix = Prefix(system_prompt="frozen", tools=())
    session_id = new_session(store)
    for n in range(5):
        submit(store, session_id, f"p{n}")
    fence, claim = store.start_drive(session_id, worker="w", seq_floor=lambda _t, _f: 0)
    assert claim is not None
    claimed = claim[0]
    log = StatementLog(store)
    statuses = [TurnStatus.FINISHED, TurnStatus.FINISHED, TurnStatus.CANCELLED, TurnStatus.FINISHED]
    for n, status in enumerate(statuses):
        reads_before = (log.count("WITH RECURSIVE"), log.count("FROM prefixes"))
        claimed = _end_and_claim_next(store, claimed, fence, status, prefix)
        reads = (log.count("WITH RECURSIVE") - reads_before[0], log.count("FROM prefixes"))
        # What the claim got is what reading it back gives.
        assert [p.turn for p in claimed.history] == store.history(session_id)
        assert claimed.prefix == prefix and claimed.prefix_generation == 1
        assert [p.turn.prompt for p in claimed.history] == [f"p{i}" for i in range(n + 1)]
        # The path is read only past a cancelled ancestor (resume may still change it),
        # the prefix never (the ending turn froze it, or ran with it).
        assert reads == ((1, 0) if n == 3 else (0, 0))
    assert claimed.history[2].turn.status is TurnStatus.CANCELLED


def test_a_turns_end_tries_a_claim_only_if_a_turn_was_counted_after_it(store: SqlStore) -> None:
    # A driver whose turn is the session's last asks for no claim: the statement would
    # find nothing, and a turn submitted after the end reaches it by the work mark.
    session_id = new_session(store)
    submit(store, session_id, "first")
    fence, claim = store.start_drive(session_id, worker="w", seq_floor=lambda _t, _f: 0)
    assert claim is not None
    second, _run = submit(store, session_id, "second")  # counted before the first ends
    log = StatementLog(store)
    prefix = Prefix(system_prompt="s", tools=())
    claimed = _end_and_claim_next(store, claim[0], fence, TurnStatus.FINISHED, prefix)
    assert claimed.turn.turn_id == second and claimed.run.queue_position == 2
    claims = log.count("ORDER BY CASE WHEN")
    assert claims == 1
    end = TurnEnd(
        turn_id=second,
        status=TurnStatus.FINISHED,
        reply="r",
        end_seq=claimed.next_seq + 1,
        claim_next=lambda _turn, _fence: 0,
        position=claimed.run.queue_position,
    )
    d = Driving(session_id, second, claimed.run.run_id, fence, claimed.next_seq)
    finished = commit(store, d, 0, close=True, end=end).finished
    assert finished is not None and finished.next_claim is None
    assert log.count("ORDER BY CASE WHEN") == claims  # no claim was tried
    third, _run = submit(store, session_id, "third")
    assert start(store, session_id).turn_id == third  # the next driver finds it


def test_a_claim_stores_what_it_returns(store: SqlStore) -> None:
    # On PostgreSQL a first claim is one statement, a later one several: both must store
    # the same thing as the claim hands to its driver.
    session_id = new_session(store)
    first, _run = submit(store, session_id)
    second, _run = submit(store, session_id)
    finish(store, start(store, session_id, worker="a"), 3)
    floors: list[str] = []

    def adopt(turn_id: str, _fence: int) -> int:
        floors.append(turn_id)
        return 5  # the buffer holds seqs up to 5

    for attempt, worker in ((1, "b"), (2, "c")):  # the second claim is a takeover
        _fence, claim = store.start_drive(session_id, worker=worker, seq_floor=adopt)
        assert claim is not None
        claimed, started = claim
        assert claimed.turn.turn_id == second and claimed.turn.parent_id == first
        assert store.get_turn(second).parent_id == first
        state = store.run_state(second)
        assert (state.status, state.attempts, state.worker) == (TurnStatus.RUNNING, attempt, worker)
        assert started.data == {"run_id": state.run_id, "attempt": attempt, "worker": worker}
        # A takeover numbers past anything the attempt cut off may have published, even
        # beyond what its buffer says it holds (a buffer can lose its tail).
        taken_over = 2 + c.TAKEOVER_SEQ_GAP + 1
        assert started.seq == (2 if attempt == 1 else taken_over)
        assert claimed.next_seq == started.seq + 1
        assert store.events_after(second, started.seq - 1) == [started]
        with store.engine.connect() as db:
            last_seq = db.execute(select(t.runs.c.last_seq).where(t.runs.c.turn_id == second))
            assert last_seq.scalar_one() == started.seq  # where a resume numbers on from
    assert floors == [second]  # only the takeover adopts the buffer


def test_a_submission_holds_the_session_row_for_nothing_but_its_own_statements(
    store: SqlStore,
) -> None:
    # Every step commit updates the session row a submission locks: a producer that
    # paused while holding it (a slow Redis or broker, a stopped process) would stall the
    # session's running turn.  The submission calls out only after its commit, and a
    # driver its kick wakes finds the turn committed.
    session_id = new_session(store)
    submit(store, session_id)
    running = start(store, session_id)
    claims: list[Any] = []

    def announce(queued: Any) -> None:
        commit(store, running, 0)  # not waiting on a lock the submission still holds
        finish(store, running, running.next_seq + 1)
        claims.append(store.start_drive(session_id, worker="w", seq_floor=lambda _t, _f: 0))

    turn_id, _run_id = submit(store, session_id, announce=announce)
    _fence, claim = claims[0]
    assert claim is not None and claim[0].turn.turn_id == turn_id


def test_pooled_connections_the_server_closed_are_replaced_before_use(postgres_url: str) -> None:
    engine = create_database_engine(postgres_url)
    store = SqlStore(engine)
    try:
        session_id = new_session(store)
        store.get_session(session_id)  # the pool now holds a connection
        assert terminate_backends(postgres_url) > 0
        time.sleep(0.2)  # the backends' goodbyes reach their sockets
        # Without a check at checkout this would be a StoreError on a dead connection.
        assert store.get_session(session_id).session_id == session_id
        turn_id, _run_id = submit(store, session_id)
        assert store.run_state(turn_id).status is TurnStatus.QUEUED
    finally:
        store.close()


def test_a_read_on_a_connection_dropped_unseen_runs_again_on_a_fresh_one(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqlStore(create_database_engine(postgres_url))
    try:
        session_id = new_session(store)
        turn_id, _run_id = submit(store, session_id)
        with store.engine.connect(), store.engine.connect(), store.engine.connect():
            pass  # the pool now holds three connections
        # The server drops them, and the checkout's look misses it (as when its goodbye
        # has not reached the socket yet): the read's first statement fails, and the
        # retry must not be handed another of the dead ones.
        monkeypatch.setattr("parley.store.database._readable", lambda _connection: False)
        assert terminate_backends(postgres_url) > 0
        time.sleep(0.2)
        assert store.run_state(turn_id).status is TurnStatus.QUEUED
        # The pool replaces the other two dead ones at their checkout (they are older
        # than the drop it saw); three checkouts at once leave it three live connections,
        # which the server then drops unseen in turn.
        with store.engine.connect(), store.engine.connect(), store.engine.connect():
            pass
        assert terminate_backends(postgres_url) > 0
        time.sleep(0.2)
        with pytest.raises(StoreError), store.db.tx() as db:  # a transaction is not re-run
            read_session(db, session_id)
    finally:
        store.close()


def test_pooled_connections_past_descriptor_1023_are_checked_too(postgres_url: str) -> None:
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    if limits[0] < 1200:
        if limits[1] != resource.RLIM_INFINITY and limits[1] < 1200:
            pytest.skip(f"needs 1200 open files, the hard limit is {limits[1]}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, limits[1]))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    store = SqlStore(create_database_engine(postgres_url))
    try:
        session_id = new_session(store)  # its connection gets a descriptor above 1100
        assert store.get_session(session_id).session_id == session_id  # checked at checkout
    finally:
        store.close()
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_reads_without_a_transaction_leave_pooled_connections_transactional(
    postgres_url: str,
) -> None:
    store = SqlStore(create_database_engine(postgres_url))
    try:
        session_id = new_session(store)
        store.engine.dispose()  # one connection from here on: the read's
        store.get_session(session_id)  # read in autocommit, without BEGIN and COMMIT
        with store.engine.connect() as connection:
            driver = connection.connection.driver_connection
            assert driver is not None and driver.autocommit is False
        charge = {"b_session_id": session_id, "b_fence": 0, "b_tokens": 5}
        with pytest.raises(SessionNotFound), store.db.tx() as db:
            assert db.execute(q.CHARGE_SESSION, charge).rowcount == 1
            read_session(db, "no-such-session")  # a failure after a write
        assert store.get_session(session_id).tokens_used == 0  # nothing of it stayed
    finally:
        store.close()


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
    from parley.schemas.tables import metadata

    declared = {t.name: sorted(c.name for c in t.columns) for t in metadata.sorted_tables}
    assert tables == declared


def test_the_sweepers_question_is_answered_from_the_runs_in_flight(store: SqlStore) -> None:
    # Which sessions have a queued or running run: asked every few seconds, so on
    # PostgreSQL it must read the partial index of runs in flight, not every run stored.
    # (A run with a time still set is not in flight: the release of due runs reads
    # those, tests/integration/test_delayed_store.py.)
    active = "status IN ({})".format(", ".join(f"'{s}'" for s in q.ACTIVE))
    assert f"{active} AND not_before IS NULL" == t.ACTIVE_RUN
    done, busy = new_session(store), new_session(store)
    submit(store, done)
    d = start(store, done)
    finish(store, d, d.next_seq + 1)
    submit(store, busy)
    with_work = store.sessions_with_work()  # (other tests' sessions too, on PostgreSQL)
    assert busy in with_work and done not in with_work
    if store.engine.dialect.name != "postgresql":
        return  # the fleet's sweeper runs on PostgreSQL
    sql = str(q.SESSIONS_WITH_WORK.compile(store.engine))
    with store.engine.connect() as db:
        db.exec_driver_sql("SET enable_seqscan = off")  # a tiny table is read whole
        plan = db.exec_driver_sql(f"EXPLAIN {sql}", {"b_now": datetime.now(UTC)}).all()
    assert "ix_runs_active" in " ".join(str(row) for row in plan)


def test_a_turns_path_is_walked_by_key_not_by_scanning_every_turn_per_level(
    store: SqlStore,
) -> None:
    # A claim reads its turn's whole path.  Each level must find its parent by key: with
    # one scan of the turns table per level, turn n of a session cost n scans, and turn
    # 2000 of one session took 225 ms in the fleet instead of 30.
    depth = 300
    session_id = new_session(store)
    for n in range(depth):
        submit(store, session_id, f"p{n}")
        d = start(store, session_id)
        finish(store, d, d.next_seq + 1)
    path = store.history(session_id)
    assert [turn.prompt for turn in path] == [f"p{n}" for n in range(depth)]
    assert [turn.parent_id for turn in path] == [None, *(turn.turn_id for turn in path[:-1])]
    compiled = q.PATH.compile(store.engine)
    params = {**compiled.params, "b_head": path[-1].turn_id}
    if store.engine.dialect.name != "postgresql":
        with store.engine.connect() as db:
            steps = db.exec_driver_sql(
                f"EXPLAIN QUERY PLAN {compiled}", tuple(params[k] for k in compiled.positiontup)
            ).all()
        # (A regression guard only: SQLite looked turns up by key with the old walk too.)
        assert not any("SCAN turns" in step[3] for step in steps)
        return
    with store.engine.connect() as db:
        # Another session's 500 turns, rolled back after: the table then holds at least
        # 800 for this EXPLAIN, where a lookup by key is the plan's choice for one row with
        # a margin (about 250 is the tipping point), while a join in the recursive term
        # still gets a scan per level (until about 2500).
        db.exec_driver_sql(
            "INSERT INTO turns (id, session_id, parent_id, ordinal, prompt, created_at) "
            "SELECT gen_random_uuid()::text, %(s)s, NULL, n, 'filler', now() "
            "FROM generate_series(1, 500) AS n",
            {"s": new_session(store)},
        )
        plan = db.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {compiled}", params).scalar_one()
        db.rollback()
    walk = _plan_node(plan[0]["Plan"], "CTE walk")
    assert _rows_read(walk, "turns") <= 2 * depth  # with a scan per level: over depth²


def _plan_node(node: dict[str, Any], name: str) -> dict[str, Any]:
    """The node of an EXPLAIN (FORMAT JSON) plan that computes the subplan ``name``."""
    if node.get("Subplan Name") == name:
        return node
    for child in node.get("Plans", ()):
        try:
            return _plan_node(child, name)
        except LookupError:
            continue
    raise LookupError(name)


def _rows_read(node: dict[str, Any], table: str) -> float:
    """Rows of ``table`` that the plan ``node`` and its children read, kept or not."""
    own = 0.0
    if node.get("Relation Name") == table:
        kept = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        own = kept * node["Actual Loops"]
    return own + sum(_rows_read(child, table) for child in node.get("Plans", ()))


def test_storage_per_turn_does_not_grow_with_the_session(store: SqlStore) -> None:
    session_id = new_session(store)
    counts = []
    for n in range(30):
        before = store.table_counts()
        submit(store, session_id, f"p{n}")
        d = start(store, session_id)
        commit(store, d, 0)
        finish(store, d, d.next_seq + 1)
        after = store.table_counts()
        counts.append({k: after[k] - before[k] for k in after})
    assert all(c == counts[0] for c in counts)  # rows written per turn are constant
    assert len(store.history(session_id)) == 30


def test_interrupting_a_turn_that_is_already_committing_its_end_does_not_fail_the_submit(
    store: SqlStore,
) -> None:
    session_id = new_session(store)
    submit(store, session_id)
    d = start(store, session_id)
    commit(store, d, 0, close=True)  # the model stopped: the inbox closed, no end yet
    receipt = store.submit_turn(
        session_id=session_id,
        prompt="urgent",
        request_id=None,
        contract=None,
        if_busy=IfBusy.INTERRUPT,
    )
    assert receipt.created and receipt.interrupted == ()
    assert store.pending_steers(d.run_id, 0) == ()


def test_turns_start_in_submission_order_whatever_the_producers_clocks_say(
    store: SqlStore,
) -> None:
    from sqlalchemy import text

    session_id = new_session(store)
    first_turn, _ = submit(store, session_id)
    second_turn, _ = submit(store, session_id, "second")
    # The second producer's clock runs a minute behind the first's.
    with store.engine.begin() as db:
        db.execute(
            text("UPDATE runs SET queued_at = :t WHERE turn_id = :id"),
            {"t": datetime(2020, 1, 1, tzinfo=UTC), "id": second_turn},
        )
    assert start(store, session_id).turn_id == first_turn


def test_a_session_row_record_has_every_column_of_the_table() -> None:
    assert {f.name for f in fields(SessionRow)} == set(q.SESSION_COLUMNS)


def test_a_tenants_sessions_page_newest_first_and_no_other_tenants(store: SqlStore) -> None:
    made = [
        store.create_session(root="/r", metadata={"n": n}, token_ceiling=None, tenant="alpha")
        for n in range(5)
    ]
    store.create_session(root="/r", metadata={}, token_ceiling=None, tenant="beta")
    store.create_session(root="/r", metadata={}, token_ceiling=None)  # from Python: no tenant
    newest_first = [r.session_id for r in reversed(made)]
    first = store.list_sessions(tenant="alpha", limit=2)
    assert [r.session_id for r in first] == newest_first[:2]
    assert all(r.tenant == "alpha" for r in first)
    rest = store.list_sessions(tenant="alpha", limit=10, before=first[-1].session_id)
    assert [r.session_id for r in rest] == newest_first[2:]
    assert store.list_sessions(tenant="gamma", limit=10) == []
    beta = store.list_sessions(tenant="beta", limit=10)
    with pytest.raises(SessionNotFound):  # another tenant's session is no page mark
        store.list_sessions(tenant="alpha", limit=10, before=beta[0].session_id)


def test_a_session_id_chosen_twice_is_a_conflict(store: SqlStore) -> None:
    chosen = "0e1a5e5e-0000-4000-8000-000000000001"
    made = store.create_session(root="/r", metadata={}, token_ceiling=None, session_id=chosen)
    assert store.get_session(chosen) == made
    with pytest.raises(Conflict):
        store.create_session(root="/other", metadata={}, token_ceiling=None, session_id=chosen)
    assert store.get_session(chosen).root == "/r"


def test_a_plain_submission_counts_titles_and_queues_its_turn_or_changes_nothing(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submission with nothing to look up first is one statement on PostgreSQL (the
    transaction's path is not taken: it would fail here): it still counts the turn on
    its session, titles the session from its first prompt only, and on a session that
    is not there raises SessionNotFound and stores nothing."""
    if store.engine.dialect.name == "postgresql":

        def no_transaction(*_args: object, **_kwargs: object) -> None:
            raise AssertionError("a plain submission took the transaction's path")

        monkeypatch.setattr(SubmissionStore, "_queue", no_transaction)
    session_id = new_session(store)
    first, _ = submit(store, session_id, "first prompt of all")
    second, _ = submit(store, session_id, "second prompt")
    assert store.get_session(session_id).title == "first prompt of all"
    assert [store.run_state(turn).status for turn in (first, second)] == [TurnStatus.QUEUED] * 2
    positions = [store.get_turn(turn) for turn in (first, second)]
    assert [t.prompt for t in positions] == ["first prompt of all", "second prompt"]
    monkeypatch.undo()  # (a missing session's error comes from the transaction's path)
    with pytest.raises(SessionNotFound):
        submit(store, "00000000-0000-0000-0000-000000000000", "nowhere")
    nowhere = "00000000-0000-0000-0000-000000000000"
    with store.engine.connect() as db:  # (the rows themselves: nothing else was stored)
        turns = db.execute(
            select(t.turns.c.ordinal)
            .where(t.turns.c.session_id.in_([session_id, nowhere]))
            .order_by(t.turns.c.ordinal)
        ).scalars()
        assert list(turns) == [1, 2]
        runs = db.execute(select(t.runs.c.id).where(t.runs.c.session_id == nowhere)).all()
        assert runs == []
        counted = select(t.sessions.c.turn_count).where(t.sessions.c.id == session_id)
        assert db.execute(counted).scalar_one() == 2
