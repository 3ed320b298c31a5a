"""Retention (docs/operations.md#retention) on SQLite and PostgreSQL: pruning deletes an ended
session whole, every table that refers to it included, and nothing of any other; never a session
with a turn queued, running or waiting; counts idle time from the newest activity and honours
the sessions' and the host's times to live; and a submission racing a prune either lands
first (the session is kept) or fails cleanly after (``SessionNotFound``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import event, text

import parley
from parley.coordination import constants as c
from parley.coordination.local_coordinator import LocalCoordinator
from parley.coordination.redis_coordinator import RedisCoordinator
from parley.errors import BatchNotFound, FileNotFound, InvalidRequest, SessionNotFound
from parley.housekeeping import Housekeeper
from parley.retention import prune, report_lines
from parley.schemas import tables as t
from parley.schemas.events import Ended, Event, Queued
from parley.schemas.operations import DeliveryState
from parley.schemas.records import IfBusy, Steer, SteerKind, TurnStatus
from parley.store.batch_acceptance import Acceptance
from parley.store.database import alembic_config, create_database_engine, current_revision
from parley.store.retention import Cut
from parley.store.sql_store import SqlStore
from parley.webhooks import WebhookSettings
from tests.conftest import BACKENDS
from tests.integration.batch_plans import create_batch, new_batch, opening
from tests.integration.drive import finish, migrated_store, new_session, start, submit
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import REDIS_TEST_URL, flush_redis
from tests.support.helpers import Control
from tests.support.hosts import waiting_host, workspace_host
from tests.support.store_rows import (
    HELD_WHILE_DRIVEN,
    OF_NO_SESSION,
    ROWS_OF_SESSION,
    age,
    rows_of,
)
from tests.support.webhook_receiver import receiver

SECRET = "test-secret-0123456789"
ASK = {"ask_tools": ["record_call"]}
PUSH = {
    "when": "push",
    "steps": [
        {"text": "Recording. ", "tool_calls": [{"name": "record_call", "arguments": {}}]},
        {"text": "done: {last_message}"},
    ],
}
GATED = {"when": "gate", "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "out"}]}
AWAIT = {
    "when": "^await",
    "steps": [
        {"tool_calls": [{"name": "await_event", "arguments": {"event": "go"}}]},
        {"text": "went"},
    ],
}
ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
DAYS_AGO_10 = timedelta(days=10)


@pytest.fixture(params=BACKENDS)
def own_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of the test's own (a prune takes whatever has ended in it)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'own.db'}"
        return
    with fresh_postgres_database("retention") as url:
        yield url


@pytest.fixture
def client(
    own_db_url: str, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[parley.Client]:
    # The deliverer's key, read as the client is made (as every setting is).
    monkeypatch.setenv("PARLEY_WEBHOOK_SECRET", SECRET)
    control = Control(workspace)
    control.script([PUSH, GATED, AWAIT, ECHO])
    control.policy(**ASK)
    with parley.connect(own_db_url, host=waiting_host(), migrate_schema=True) as opened:
        yield opened


def wait_status(handle: parley.TurnHandle, status: TurnStatus) -> None:
    deadline = time.monotonic() + 30
    while handle.record().status is not status:
        assert time.monotonic() < deadline, f"never {status}"
        time.sleep(0.02)


def populated(client: parley.Client, root: Path, webhook_url: str) -> parley.Session:
    """A session with a row in every table: a seeded history, a turn that asked for an
    answer and got a steer while it waited, an ordinary turn, an A2A push configuration,
    a compaction, webhooks delivered."""
    root.mkdir(exist_ok=True)
    session = client.open_session(root, webhook_url=webhook_url)
    session.seed_history(
        [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "noted"}]
    )
    handle = session.submit("push it")
    wait_status(handle, TurnStatus.WAITING)
    handle.say("and this")
    [pending] = handle.approvals()
    handle.approve(pending.approval_id)
    assert handle.wait(30).outcome is TurnStatus.FINISHED
    assert session.turn("hello").outcome is TurnStatus.FINISHED
    # A turn that waited for an event, and was signalled (a wait's row and a signal's).
    waited = session.submit("await go")
    wait_status(waited, TurnStatus.WAITING)
    assert waited.signal("go", "now") is True
    assert waited.wait(30).outcome is TurnStatus.FINISHED
    # An A2A push configuration of an ended turn: its end is posted at once, too.
    client.store.add_push_config(handle.turn_id, webhook_url, "push-token")
    session.compact(strategy="trim", keep_turns=1)  # a compaction's row goes with it too
    # A batch's line that continues the session (its row goes with the session).
    line = {"custom_id": "again", "method": "POST", "url": "/v1/responses"}
    batch = client.submit_batch([{**line, "body": {"input": "again", "conversation": session.id}}])
    assert [r["error"] for r in batch.results(timeout=30)] == [None]
    deadline = time.monotonic() + 30
    while any(d.state is not DeliveryState.DELIVERED for d in session.webhook_deliveries()):
        assert time.monotonic() < deadline, session.webhook_deliveries()
        time.sleep(0.05)
    return session


def test_pruning_deletes_every_row_of_an_ended_session_and_none_of_another(
    client: parley.Client, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert set(ROWS_OF_SESSION) | OF_NO_SESSION == set(t.metadata.tables), (
        "a new table: say how it is pruned"
    )
    store = client.store
    with receiver() as hooks:
        victim = populated(client, workspace.parent / "victim", hooks.url)
        keeper = populated(client, workspace.parent / "keeper", hooks.url)
    before = rows_of(store, victim.id)
    # The test reaches every table (but those only a driver's hold fills).
    assert all(n for table, n in before.items() if table not in HELD_WHILE_DRIVEN), before
    kept = rows_of(store, keeper.id)
    kept_tree = keeper.tree()
    age(store, victim.id, DAYS_AGO_10)

    report = client.prune(timedelta(days=5))

    assert [p.session_id for p in report.pruned] == [victim.id]
    [pruned] = report.pruned
    assert pruned.turns == before["turns"] and pruned.root == str(workspace.parent / "victim")
    assert pruned.workspace is None  # not asked
    assert rows_of(store, victim.id) == dict.fromkeys(ROWS_OF_SESSION, 0)
    assert rows_of(store, keeper.id) == kept
    assert keeper.tree() == kept_tree
    assert (workspace.parent / "victim").is_dir()  # its workspace stays unless asked
    with pytest.raises(SessionNotFound):
        client.session(victim.id)
    assert client.prune(timedelta(days=5)).pruned == ()  # nothing more to do


def test_a_session_with_a_turn_queued_running_or_waiting_is_never_pruned(
    client: parley.Client, workspace: Path
) -> None:
    store = client.store
    waiting_session = client.open_session(workspace)
    waiting = waiting_session.submit("push it")
    wait_status(waiting, TurnStatus.WAITING)
    # Straight through the store, with no kick: a turn left queued, and one a driver
    # claimed (running) and never finished.
    queued_session, running_session = new_session(store), new_session(store)
    submit(store, queued_session)
    submit(store, running_session)
    start(store, running_session)
    sessions = [waiting_session.id, queued_session, running_session]
    for session_id in sessions:
        age(store, session_id, DAYS_AGO_10)

    # A lease lives only while a driver holds the session: the waiting turn's driver may
    # let go of its lease just after its status says waiting, between two counts.
    def kept(session_id: str) -> dict[str, int]:
        rows = rows_of(store, session_id)
        return {table: n for table, n in rows.items() if table not in HELD_WHILE_DRIVEN}

    before = {s: kept(s) for s in sessions}

    report = client.prune(timedelta(0), workspaces=True)

    assert report.pruned == ()
    assert {s: kept(s) for s in sessions} == before
    assert workspace.is_dir()
    [pending] = waiting.approvals()
    waiting.approve(pending.approval_id)
    assert waiting.wait(30).outcome is TurnStatus.FINISHED
    # Ended now, and idle for no time at all: a cut of 0 days takes it (and the queued
    # and running ones stay).
    assert [p.session_id for p in client.prune(timedelta(0)).pruned] == [waiting_session.id]


def test_idle_time_counts_from_the_newest_activity_and_time_to_live_is_a_longest_life(
    client: parley.Client, workspace: Path
) -> None:
    store = client.store

    def session(idle: timedelta, retention: timedelta | None = None) -> str:
        opened = client.open_session(workspace, retention=retention)
        assert opened.retention == retention
        opened.turn("hello")
        age(store, opened.id, idle)
        return opened.id

    plain_old = session(timedelta(days=10))
    plain_recent = session(timedelta(days=2))
    short_ttl_passed = session(timedelta(days=2), retention=timedelta(days=1))
    long_ttl_old = session(timedelta(days=10), retention=timedelta(days=30))
    short_ttl_fresh = session(timedelta(hours=1), retention=timedelta(days=1))

    def pruned(older_than: timedelta | None, default: timedelta | None = None) -> set[str]:
        report = prune(store, client.coordinator, older_than=older_than, default_retention=default)
        return {p.session_id for p in report.pruned}

    # Without a cut, only what a time to live says; the session's own first.
    assert pruned(None) == {short_ttl_passed}
    # The host's default applies to the sessions that have none of their own.
    assert pruned(None, default=timedelta(days=5)) == {plain_old}
    # An operator's cut takes whatever idled longer, whatever its own TTL says.
    assert pruned(timedelta(days=5)) == {long_ttl_old}
    assert pruned(timedelta(days=1, hours=12)) == {plain_recent}
    assert client.session(short_ttl_fresh).retention == timedelta(days=1)
    # A new turn is new activity: the idle clock starts again at its end.
    age(store, short_ttl_fresh, timedelta(days=3))
    client.session(short_ttl_fresh).turn("again")
    assert pruned(None) == set()


def test_bad_retention_settings_are_refused_and_create_nothing(
    client: parley.Client, workspace: Path
) -> None:
    store = client.store
    before = store.table_counts()["sessions"]
    for bad in (timedelta(days=-1), timedelta(0), 7, "7d"):
        with pytest.raises(InvalidRequest, match="retention"):
            client.open_session(workspace, retention=bad)  # type: ignore[arg-type]
    for url in ("ftp://example.com/hook", "not a url", "http:///nohost", "", 42):
        with pytest.raises(InvalidRequest, match="webhook_url"):
            client.open_session(workspace, webhook_url=url)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="older_than"):
        client.prune(timedelta(days=-1))
    with pytest.raises(InvalidRequest, match="older_than"):
        client.prune(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match=r"Host\.retention"):
        workspace_host(retention=timedelta(seconds=-5))
    with pytest.raises(InvalidRequest, match=r"Host\.webhook_url"):
        workspace_host(webhook_url="file:///etc/passwd")
    assert store.table_counts()["sessions"] == before


def test_a_submission_that_lands_before_the_prune_keeps_the_session_and_one_after_fails(
    client: parley.Client, workspace: Path
) -> None:
    store = client.store
    session = client.open_session(workspace)
    session.turn("hello")
    age(store, session.id, DAYS_AGO_10)
    cut = Cut.of(timedelta(days=5), None)
    [candidate] = store.expired_sessions(cut)
    # Submitted between the prune's look and its delete: the delete looks again, under
    # the session row's lock, and keeps it.
    handle = session.submit("just in time")
    assert store.prune_sessions([candidate.session_id], cut) == []
    assert handle.wait(30).outcome is TurnStatus.FINISHED
    age(store, session.id, DAYS_AGO_10)
    assert store.prune_sessions([session.id], cut) != []
    with pytest.raises(SessionNotFound):
        session.submit("too late")
    assert rows_of(store, session.id) == dict.fromkeys(ROWS_OF_SESSION, 0)


# ------------------------------------------------------------------ true races (PostgreSQL)


class Pause:
    """Holds the first statement containing ``fragment`` that the thread ``who`` runs
    on ``store``, inside its transaction, until :meth:`go`."""

    def __init__(self, store: SqlStore, fragment: str) -> None:
        self.fragment = fragment
        self.reached = threading.Event()
        self._go = threading.Event()
        self.thread: threading.Thread | None = None
        self._store = store
        event.listen(store.engine, "before_cursor_execute", self._check)

    def _check(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        mine = threading.current_thread() is self.thread and self.fragment in statement
        if mine and not self.reached.is_set():
            self.reached.set()
            assert self._go.wait(30), "the test never let the paused statement go"

    def run(self, work: Callable[[], Any]) -> dict[str, Any]:
        """Run ``work`` on the paused thread; its result or error lands in the dict."""
        outcome: dict[str, Any] = {}

        def body() -> None:
            try:
                outcome["value"] = work()
            except Exception as exc:
                outcome["error"] = exc

        self.thread = threading.Thread(target=body)
        self.thread.start()
        assert self.reached.wait(30), f"the statement with {self.fragment!r} never ran"
        return outcome

    def go(self) -> None:
        self._go.set()
        assert self.thread is not None
        self.thread.join(30)
        event.remove(self._store.engine, "before_cursor_execute", self._check)


def blocked_on_a_lock(store: SqlStore, timeout: float = 30) -> None:
    """Until some backend of the store's database waits for a row lock."""
    deadline = time.monotonic() + timeout
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'"
    )
    while True:
        with store.engine.connect() as db:
            if db.execute(query).scalar_one():
                return
        assert time.monotonic() < deadline, "nothing ever waited for the lock"
        time.sleep(0.02)


@pytest.mark.postgres
def test_a_prune_waits_for_a_submission_holding_the_session_and_then_keeps_it() -> None:
    with fresh_postgres_database("race") as url, migrated_store(url) as store:
        session_id = new_session(store)
        age(store, session_id, DAYS_AGO_10)
        pause = Pause(store, "INSERT INTO turns")
        # A submission with a request id: a transaction that counts the turn on the
        # session (locking its row) before it inserts it.  (A plain one is a single
        # statement on PostgreSQL, which holds the row only while it runs.)
        submitting = pause.run(
            lambda: store.submit_turn(
                session_id=session_id,
                prompt="p",
                request_id="while-pruned",
                contract=None,
                if_busy=IfBusy.ENQUEUE,
            )
        )
        cut = Cut.of(timedelta(days=5), None)
        pruning: dict[str, Any] = {}
        pruner = threading.Thread(
            target=lambda: pruning.update(r=store.prune_sessions([session_id], cut))
        )
        pruner.start()
        blocked_on_a_lock(store)  # the prune waits for the submission's lock
        pause.go()
        pruner.join(30)
        assert "error" not in submitting, submitting
        assert pruning == {"r": []}  # it looked again after the lock: a turn in flight
        assert rows_of(store, session_id)["runs"] == 1


@pytest.mark.postgres
def test_a_submission_that_waits_for_a_prune_fails_cleanly_once_it_committed() -> None:
    with fresh_postgres_database("race") as url, migrated_store(url) as store:
        session_id = new_session(store)
        age(store, session_id, DAYS_AGO_10)
        pause = Pause(store, "DELETE FROM sessions")
        cut = Cut.of(timedelta(days=5), None)
        pruning = pause.run(lambda: store.prune_sessions([session_id], cut))  # holds the row
        submitting: dict[str, Any] = {}

        def submission() -> None:
            try:
                submit(store, session_id)
            except Exception as exc:
                submitting["error"] = exc

        submitter = threading.Thread(target=submission)
        submitter.start()
        blocked_on_a_lock(store)  # the submission waits for the prune's lock
        pause.go()
        submitter.join(30)
        assert pruning["value"] != []
        assert isinstance(submitting.get("error"), SessionNotFound), submitting
        assert rows_of(store, session_id) == dict.fromkeys(ROWS_OF_SESSION, 0)


# ------------------------------------------------------------------ the rest of a session


@pytest.mark.parametrize("kind", ["local", "redis"])
def test_a_pruned_sessions_coordinator_keys_go_with_it(kind: str, own_db_url: str) -> None:
    coordinator: LocalCoordinator | RedisCoordinator
    if kind == "redis":
        flush_redis(REDIS_TEST_URL)
        coordinator = RedisCoordinator(REDIS_TEST_URL)
    else:
        coordinator = LocalCoordinator()
    with migrated_store(own_db_url) as store:
        session_id = new_session(store)
        turn_id, run_id = submit(store, session_id)
        d = start(store, session_id)
        finish(store, d, d.next_seq)
        coordinator.adopt(turn_id, d.fence)
        coordinator.publish(
            [
                Event.of(turn_id, 1, Queued(run_id=run_id)),
                Event.of(turn_id, d.next_seq, Ended(outcome="finished", reply="r")),
            ],
            d.fence,
            now=True,
        )
        coordinator.push_steer(turn_id, Steer(position=1, kind=SteerKind.SAY, text="hi"))
        coordinator.mark_work(session_id)
        assert coordinator.last_seq(turn_id) == d.next_seq
        redis_keys = [
            c.events_key(turn_id),
            c.ends_key(turn_id),
            c.owner_key(turn_id),
            c.steers_key(turn_id),
            c.work_key(session_id),
            c.kick_pending_key(session_id),
        ]
        if isinstance(coordinator, RedisCoordinator):
            assert all(coordinator.redis.exists(k) for k in redis_keys)
        lock = coordinator.try_lock(session_id)  # a driver that bounced in just now
        assert lock is not None

        report = prune(store, coordinator, older_than=timedelta(0))

        assert [p.session_id for p in report.pruned] == [session_id]
        assert coordinator.last_seq(turn_id) == 0
        assert coordinator.steers_after(turn_id, 0, fresh=True) == []
        if isinstance(coordinator, RedisCoordinator):
            assert [k for k in redis_keys if coordinator.redis.exists(k)] == []
            assert coordinator.redis.exists(c.lock_key(session_id))  # left to expire
        assert lock.held()
        lock.release()
    coordinator.close()


def test_the_housekeeper_expires_sessions_past_the_hosts_retention(
    client: parley.Client, workspace: Path
) -> None:
    store = client.store
    ended = client.open_session(workspace)
    ended.turn("hello")
    own = client.open_session(workspace, retention=timedelta(days=30))
    own.turn("hello")
    for session in (ended, own):
        age(store, session.id, timedelta(hours=2))
    keeper = Housekeeper(
        store,
        client.coordinator,
        settings=WebhookSettings(secret=None),
        default_retention=timedelta(hours=1),
        expiry_seconds=0.1,
    ).start()
    try:
        deadline = time.monotonic() + 30
        while store.table_counts()["sessions"] != 1:
            assert time.monotonic() < deadline, "the housekeeper never expired it"
            time.sleep(0.05)
    finally:
        keeper.stop()
    assert client.session(own.id).retention == timedelta(days=30)  # its own TTL holds


def test_migration_0009_dates_existing_sessions_by_their_newest_turn_end(own_db_url: str) -> None:
    engine = create_database_engine(own_db_url)
    config = alembic_config()
    with engine.connect() as connection:
        config.attributes["connection"] = connection
        if current_revision(engine) is None:
            command.upgrade(config, "0008")
        else:
            command.downgrade(config, "0008")  # (a fresh PostgreSQL database is at head)
        connection.commit()
    ended = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    created = datetime(2025, 1, 1, tzinfo=UTC)
    with engine.begin() as db:
        for sid, root in (("s-with-turn", "/a"), ("s-without", "/b")):
            db.execute(
                text(
                    "INSERT INTO sessions (id, root, metadata, fence, turn_count, tokens_used, "
                    "prefix_generation, created_at) VALUES (:id, :root, '{}', 0, 0, 0, 0, :at)"
                ),
                {"id": sid, "root": root, "at": created},
            )
        db.execute(
            text(
                "INSERT INTO turns (id, session_id, ordinal, prompt, created_at) "
                "VALUES ('t1', 's-with-turn', 1, 'p', :at)"
            ),
            {"at": created},
        )
        db.execute(
            text(
                "INSERT INTO runs (id, turn_id, session_id, status, attempts, steps, "
                "input_tokens, output_tokens, cached_tokens, steer_count, steer_cursor, "
                "inbox_open, last_seq, queued_at, queue_position, ended_at) VALUES "
                "('r1', 't1', 's-with-turn', 'finished', 1, 0, 0, 0, 0, 0, 0, false, 1, :at, "
                "1, :ended)"
            ),
            {"at": created, "ended": ended},
        )
    with engine.connect() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        connection.commit()
    store = SqlStore(engine)
    try:
        assert store.get_session("s-with-turn").last_active_at == ended
        assert store.get_session("s-without").last_active_at == created
        cut = Cut.of(None, None, now=datetime(2025, 3, 2, tzinfo=UTC))
        assert store.expired_sessions(cut) == []
        older = Cut.of(timedelta(days=30), None, now=datetime(2025, 3, 2, tzinfo=UTC))
        assert [s.session_id for s in store.expired_sessions(older)] == ["s-without"]
        for sid in ("s-with-turn", "s-without"):
            assert store.prune_sessions([sid], Cut.of(timedelta(0), None)) != []
    finally:
        store.close()


def test_prune_removes_an_ended_batch_with_its_files_and_its_lines_sessions(
    client: parley.Client, workspace: Path
) -> None:
    line = {"method": "POST", "url": "/v1/responses"}
    old = client.submit_batch(
        [{**line, "custom_id": f"o{n}", "body": {"input": f"old {n}"}} for n in range(3)],
        root=workspace,
    )
    assert sum(1 for _ in old.results(timeout=30)) == 3
    recent = client.submit_batch(
        [{**line, "custom_id": "r", "body": {"input": "new"}}], root=workspace
    )
    assert sum(1 for _ in recent.results(timeout=30)) == 1
    sessions = [r["response"]["body"]["conversation"]["id"] for r in old.output()]
    store = client.store
    then = datetime.now(UTC) - DAYS_AGO_10
    with store.engine.begin() as db:  # (typed binds: SQLite compares the text it keeps)
        aged = t.sessions.update().where(t.sessions.c.id.in_(sessions))
        db.execute(aged.values(last_active_at=then))
        db.execute(t.batches.update().where(t.batches.c.id == old.id).values(ended_at=then))
    files = (old.status().output_file_id, old.status().error_file_id)

    dry = client.prune(timedelta(days=5), dry_run=True)
    assert dry.batches == (old.id,) and old.status().status == "completed"
    report = client.prune(timedelta(days=5))

    assert report.batches == (old.id,)
    assert sorted(p.session_id for p in report.pruned) == sorted(sessions)
    with pytest.raises(BatchNotFound):
        client.batch(old.id)
    for file_id in files:
        with pytest.raises(FileNotFound):
            store.get_file(file_id)
    assert "deleted 1 ended batch(es) and their files" in report_lines(report)
    assert client.batch(recent.id).status().request_counts["completed"] == 1


def test_prune_drops_a_batch_acceptance_abandoned_an_hour_ago_with_its_workspaces(
    client: parley.Client, tmp_path: Path
) -> None:
    store = client.store
    before = store.table_counts()
    abandoned, fresh = new_batch(), new_batch()
    roots = {abandoned.batch_id: tmp_path / "abandoned", fresh.batch_id: tmp_path / "fresh"}
    for batch in (abandoned, fresh):
        assert store.open_batch(batch) is None
        roots[batch.batch_id].mkdir()
        store.accept_lines(batch.batch_id, "acme", [opening(1, str(roots[batch.batch_id]))], [])
    with store.engine.begin() as db:  # its process died an hour and a half ago
        began = datetime.now(UTC) - timedelta(minutes=90)
        db.execute(
            t.batches.update().where(t.batches.c.id == abandoned.batch_id).values(created_at=began)
        )

    client.prune(timedelta(days=30))

    assert not roots[abandoned.batch_id].exists() and roots[fresh.batch_id].exists()
    assert store.abandoned_acceptances(datetime.now(UTC)) == [
        Acceptance(batch_id=fresh.batch_id, lines=1, dropping=False)
    ]
    store.drop_batch(fresh.batch_id)
    assert store.table_counts() == before


def ended_sessions(store: SqlStore, count: int) -> None:
    """``count`` sessions of a turn each, every one ended ten days ago (a batch's lines)."""
    create_batch(store, new_batch(), [opening(n) for n in range(1, count + 1)], [])
    then = datetime.now(UTC) - DAYS_AGO_10
    with store.engine.begin() as db:
        db.execute(t.runs.update().values(status="finished", ended_at=then))
        db.execute(t.sessions.update().values(last_active_at=then))


def test_a_prune_takes_a_chunk_of_sessions_a_transaction_on_sqlite_one_on_postgresql(
    own_db_url: str,
) -> None:
    with migrated_store(own_db_url) as store:
        ended_sessions(store, 450)
        before = store.transactions

        report = prune(store, LocalCoordinator(), older_than=timedelta(days=5))

        assert len(report.pruned) == 450 and store.table_counts()["sessions"] == 0
        spent = store.transactions - before
        if store.engine.dialect.name == "postgresql":
            assert spent >= 450  # each session in a transaction of its own, as SPEC says
        else:
            assert spent < 20, spent  # three chunks, and the reads


def test_pruning_costs_as_much_a_session_whatever_their_number(tmp_path: Path) -> None:
    steps = {}
    for count in (300, 2400):
        url = f"sqlite:///{tmp_path / f'prune-{count}.db'}"
        with migrated_store(url) as store:
            ended_sessions(store, count)
            # The work SQLite does, counted in steps of its virtual machine.
            counted = [0]

            def count_step(counted: list[int] = counted) -> int:
                counted[0] += 1
                return 0

            event.listen(
                store.engine,
                "connect",
                lambda dbapi, _: dbapi.set_progress_handler(count_step, 100),
            )
            store.engine.dispose()
            assert (
                len(prune(store, LocalCoordinator(), older_than=timedelta(days=5)).pruned) == count
            )
            steps[count] = counted[0]
    # Eight times the sessions, eight times the work, give or take (it was 34 times: each
    # turn deleted read every turn, for its key's check, and each page of candidates
    # sorted every session ended at the same time).
    assert steps[2400] < 12 * steps[300], steps
