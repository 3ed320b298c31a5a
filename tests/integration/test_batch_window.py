"""The batch window (src/parley/runtime/batch_window.py, its places in src/parley/store/window.py)
on a real store and the machine's Redis: a filler places the oldest batch runs and kicks
their sessions, a second adds nothing, two fillers give a freed place once; the tenants
with lines waiting share the places by weight, a tenant that arrives while another
holds the whole window getting the places that free until it holds its share (issue 43:
a weight-3 tenant got nothing for 16.7 s until all 40 of a weight-1 tenant's lines had
started); a claim starts no batch run without a place, so under fillers and drivers
racing the runs in flight never exceed the window; an interactive turn posted into a
line's session moves that line to the interactive lane instead of starting it outside
the window; and on PostgreSQL every read of the window is of an index, with 20,000 lines
of one tenant queued."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from sqlalchemy import text

from parley.coordination.redis_coordinator import RedisCoordinator
from parley.coordination.redis_locks import RedisLock
from parley.ports.admission import parse_tenant_weights
from parley.runtime.batch_window import fill_batch_window
from parley.schemas.records import TurnStatus
from parley.store.sql_store import SqlStore
from parley.store.statements import window as wq
from tests.conftest import BACKENDS
from tests.integration.batch_plans import (
    clear_batch_runs,
    create_batch,
    new_batch,
    opening,
    wait_for_capacity,
)
from tests.integration.drive import Driving, finish, migrated_store, start, submit
from tests.support.databases import fresh_postgres_database

WINDOW = 2
# The shared coordinator fixture, as the fleet has it: the window's kicks are Redis flags.
pytestmark = pytest.mark.parametrize("coordinator", ["redis"], indirect=True)


@pytest.fixture(scope="module")
def window_postgres_url() -> Iterator[str]:
    """A database of this module's own: the window counts every batch run in flight in
    its database, and another test's client may still be running some in the shared
    one."""
    with fresh_postgres_database("window") as url:
        yield url


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[SqlStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        url = request.getfixturevalue("window_postgres_url")
    with migrated_store(url) as opened:
        clear_batch_runs(opened)  # what this module's earlier test left
        yield opened


class Window:
    """Batches of lines, the kicks the window sent, and workers that take them."""

    def __init__(
        self,
        store: SqlStore,
        coordinator: RedisCoordinator,
        window: int = WINDOW,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        self.store, self.coordinator, self.window = store, coordinator, window
        self.weights = weights or {}
        self.kicks: list[str] = []
        self.driven: dict[str, tuple[RedisLock, Driving]] = {}

    def batch(self, lines: int, tenant: str = "acme") -> list[str]:
        """A batch of ``lines`` lines of ``tenant``: its lines' sessions, in line order."""
        plans = [opening(n) for n in range(1, lines + 1)]
        batch, _ = create_batch(self.store, new_batch(tenant=tenant), plans, [])
        made = self.store.batch_lines(batch.batch_id, None, 0, lines)
        return [line.session_id or "" for line in made]

    def fill(self) -> list[str]:
        """One filler's pass (a creator's, the sweeper's, a finishing worker's): the
        sessions it kicked."""
        before = len(self.kicks)
        fill_batch_window(
            self.store,
            self.coordinator,
            self.kicks.append,
            window=self.window,
            weights=self.weights,
        )
        return self.kicks[before:]

    def take(self, session_id: str) -> None:
        """A worker takes a kicked session: its lock, then its line's run."""
        lock = self.coordinator.try_lock(session_id)
        assert lock is not None
        self.driven[session_id] = (lock, start(self.store, session_id))

    def end(self, session_id: str) -> None:
        """The line ends and its worker lets the session go."""
        lock, driving = self.driven.pop(session_id)
        finish(self.store, driving, driving.next_seq)
        lock.release()


def test_a_creator_fills_the_window_and_a_second_fill_adds_nothing(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    window = Window(store, coordinator)
    sessions = window.batch(5)
    assert window.fill() == sessions[:WINDOW]
    assert window.fill() == []  # the places are given
    window.take(sessions[0])
    assert window.fill() == []  # and so is a driven line's
    assert store.batch_runs_in_flight() == WINDOW


def test_the_place_a_line_leaves_is_filled_once_by_two_fillers(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    window = Window(store, coordinator)
    one, two, three, _four, _five = window.batch(5)
    window.fill()
    window.take(one)
    window.take(two)
    window.end(one)
    # The sweeper and the finished line's worker both top the window up (each with
    # fill_batch_window): the first places and kicks the next line, the second finds the
    # window full.
    assert window.fill() == [three]
    assert window.fill() == []
    window.take(three)
    assert store.batch_runs_in_flight() == WINDOW


def test_a_placed_line_whose_kick_was_lost_keeps_its_place_and_is_the_sweepers(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    window = Window(store, coordinator)
    one, two, _three = window.batch(3)
    window.fill()  # (its kicks never arrive)
    assert window.fill() == []
    assert {one, two} <= set(store.sessions_with_work())  # the sweeper kicks them
    window.take(one)


def test_a_line_waiting_for_capacity_holds_its_place(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    window = Window(store, coordinator)
    one, two, three, _four = window.batch(4)
    window.fill()
    window.take(one)
    window.take(two)
    lock, driving = window.driven.pop(one)
    wait_for_capacity(store, driving.turn_id)
    lock.release()
    assert window.fill() == []
    window.end(two)
    assert window.fill() == [three]


def test_a_line_waiting_for_answers_gives_its_place_back_and_waits_for_one_again(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    """A person may take an hour to answer: meanwhile the line holds no place.  Answered,
    it needs one again: no claim starts it before the window gives it one."""
    window = Window(store, coordinator)
    one, two, three, four = window.batch(4)
    window.fill()
    window.take(one)
    lock, driving = window.driven.pop(one)
    store.hold_step(
        run_id=driving.run_id,
        session_id=one,
        fence=driving.fence,
        held_step={"index": 0},
        approvals=[],
        events=[],
    )
    lock.release()
    assert window.fill() == [three]  # the place it gave back
    with store.engine.begin() as db:  # answered: queued again, as REQUEUE_WAITING does
        db.execute(text("UPDATE runs SET status = 'queued' WHERE id = :r"), {"r": driving.run_id})
    assert store.start_drive(one, worker="w", seq_floor=lambda _t, _f: 0)[1] is None
    window.take(two)
    window.take(three)
    window.end(two)
    window.end(three)
    assert sorted(window.fill()) == sorted([one, four])
    window.take(one)  # its held step goes on


def test_a_kick_for_a_line_without_a_place_starts_nothing(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    window = Window(store, coordinator)
    sessions = window.batch(3)
    window.fill()
    for session_id in sessions:  # every line kicked, as submissions one by one do
        _fence, claim = store.start_drive(session_id, worker="w", seq_floor=lambda _t, _f: 0)
        assert (claim is not None) == (session_id in sessions[:WINDOW])
    assert store.batch_runs_in_flight() == WINDOW


def test_the_tenants_waiting_share_the_places_by_weight(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    """Window 4, big weighing 1 and small 3: big, alone, takes all four; small's lines
    arrive; the places big's lines free go to small until it holds its three, then one
    each as they free.  Both tenants' oldest lines first."""
    weights = parse_tenant_weights("small=3")  # (as PARLEY_TENANT_WEIGHTS says it)
    window = Window(store, coordinator, window=4, weights=weights)
    big = window.batch(12, tenant="big")
    assert window.fill() == big[:4]
    small = window.batch(6, tenant="small")
    assert window.fill() == []
    for session_id in big[:4]:
        window.take(session_id)
    taken = []
    for session_id in big[:3]:
        window.end(session_id)
        taken += window.fill()
    assert taken == small[:3]  # small's share: three places of four
    for session_id in taken:
        window.take(session_id)
    window.end(big[3])
    assert window.fill() == [big[4]]  # big's one place back
    window.end(small[0])
    assert window.fill() == [small[3]]


def test_a_tenant_that_arrives_while_one_fills_the_window_starts_at_its_next_place(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    """Issue 43: lines started oldest first across all tenants, so a tenant arriving
    behind another's 40 lines started none until all 40 had."""
    window = Window(store, coordinator, window=8)
    first = window.batch(40, tenant="first")
    window.fill()
    for session_id in first[:8]:
        window.take(session_id)
    later = window.batch(3, tenant="later")
    window.end(first[0])
    assert window.fill() == [later[0]]


def test_the_runs_in_flight_never_exceed_the_window_under_fillers_and_drivers_racing(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    """Eight workers, each filling the window, taking any session it kicked (or any
    line's, as a stray kick would), running and ending it; two tenants' batches and
    turns submitted one by one.  Every claim sees the batch runs running, which never
    pass the window."""
    window = Window(store, coordinator, window=3)
    sessions = window.batch(30, tenant="a") + window.batch(30, tenant="b")
    lock = threading.Lock()
    most: list[int] = [0]
    failures: list[BaseException] = []

    def running() -> int:
        with store.engine.connect() as db:
            query = "SELECT count(*) FROM runs WHERE priority = 'batch' AND status = 'running'"
            return int(db.execute(text(query)).scalar_one())

    def worker(seed: int) -> None:
        chooser = random.Random(seed)
        try:
            for _ in range(60):
                kicked: list[str] = []
                fill_batch_window(store, coordinator, kicked.append, window=3, weights={})
                session_id = kicked[0] if kicked else chooser.choice(sessions)
                held = coordinator.try_lock(session_id)
                if held is None:
                    continue
                try:
                    _fence, claim = store.start_drive(
                        session_id, worker=f"w{seed}", seq_floor=lambda _t, _f: 0
                    )
                    if claim is not None:
                        seen = running()
                        with lock:
                            most[0] = max(most[0], seen)
                        claimed, _ = claim
                        driving = Driving(
                            session_id=session_id,
                            turn_id=claimed.turn.turn_id,
                            run_id=claimed.run.run_id,
                            fence=_fence,
                            next_seq=claimed.next_seq,
                        )
                        finish(store, driving, driving.next_seq)
                finally:
                    held.release()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    assert 1 <= most[0] <= 3, most
    assert store.batch_runs_in_flight() <= 3


def test_fillers_at_the_same_moment_give_the_free_places_once(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    """Eight fillers released at once into an empty window of three: three places given
    in all (each fill reads the places held and gives the rest, under one lock)."""
    window = Window(store, coordinator, window=3)
    window.batch(40, tenant="a")
    window.batch(40, tenant="b")
    start_line = threading.Barrier(8)
    placed: list[str] = []

    def filler() -> None:
        start_line.wait()
        placed.extend(store.place_batch_runs(3, {}))

    threads = [threading.Thread(target=filler) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(placed) == 3 and store.batch_runs_in_flight() == 3, placed


def test_an_interactive_turn_behind_a_line_moves_the_line_out_of_the_window(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    """The window is full; an interactive turn is posted into the session of a line
    without a place.  Its kick claims the line (turns start in order, and someone waits
    for the one behind it), moved to the interactive lane: the window's places are not
    exceeded, nor is the line started as a batch run."""
    window = Window(store, coordinator)
    sessions = window.batch(3)
    window.fill()
    behind = sessions[2]
    submit(store, behind, "are you done?")
    driving = start(store, behind)
    run = store.run_state(driving.turn_id)
    assert run.status is TurnStatus.RUNNING
    with store.engine.connect() as db:
        lane = db.execute(
            text("SELECT priority FROM runs WHERE turn_id = :t"), {"t": driving.turn_id}
        ).scalar_one()
    assert lane == "interactive"
    assert store.batch_runs_in_flight() == WINDOW
    # The interactive turn follows it, in the same drive.
    receipt = finish(store, driving, driving.next_seq)
    assert receipt.next_claim is None or receipt.later_turns


@pytest.mark.postgres
def test_every_read_of_the_window_is_of_an_index(
    window_postgres_url: str, coordinator: RedisCoordinator
) -> None:
    """20,000 lines of one tenant queued, three of another's: PostgreSQL reads each of
    the window's statements from an index, touching a handful of rows, never the
    backlog."""
    with migrated_store(window_postgres_url) as store:
        clear_batch_runs(store)
        window = Window(store, coordinator, window=64)
        window.batch(20_000, tenant="big")
        window.batch(3, tenant="small")
        with store.engine.begin() as db:
            db.execute(text("ANALYZE runs"))
            reads = {
                "the tenants waiting": _plan(db, wq.TENANTS_WAITING),
                "a tenant's oldest": _plan(db, wq.OLDEST_OF_TENANT, b_tenant="small", b_limit=64),
                "the places held": _plan(db, wq.PLACES_BY_TENANT),
            }
        for name, nodes in reads.items():
            # (The batches themselves may be scanned: a handful of rows, not the backlog.)
            scans = [n for n in nodes if n["Node Type"] == "Seq Scan"]
            assert not [n for n in scans if n.get("Relation Name") != "batches"], (name, nodes)
            rows = max(n.get("Actual Rows", 0) * n.get("Actual Loops", 1) for n in nodes)
            assert rows < 10, (name, rows)
        assert len(window.fill()) == 64


def _plan(db: Any, statement: Any, **binds: Any) -> list[dict[str, Any]]:
    """The plan PostgreSQL ran ``statement`` by, every node of it."""
    sql = statement.compile(dialect=db.dialect)
    (plan,) = db.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", binds).scalar_one()
    return list(_nodes(plan["Plan"]))


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)
