"""The batch window (workers/runtime/batch_window.py) on a real store and the machine's
Redis: it keeps exactly its size in flight, however many fillers come after one another
(a batch's creator, the sweeper, the worker whose line ended), each with the same
fill_batch_window.  The race it once lost: the sweeper filled the place a finished line
left, then that line's worker, finding the oldest queued line taken, kicked the next one
into the same place, and the window ran one over for as long as both lines ran."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import BACKENDS
from tests.integration.batch_plans import clear_batch_runs, new_batch, opening, wait_for_capacity
from tests.integration.drive import Driving, finish, migrated_store, start
from tests.support.databases import fresh_postgres_database
from workers.coordination import constants as c
from workers.coordination.redis_coordinator import RedisCoordinator
from workers.coordination.redis_locks import RedisLock
from workers.runtime.batch_window import fill_batch_window
from workers.store.sql_store import SqlStore

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
    """A batch of lines, the kicks its window sent, and workers that take them."""

    def __init__(self, store: SqlStore, coordinator: RedisCoordinator, lines: int) -> None:
        self.store, self.coordinator = store, coordinator
        self.kicks: list[str] = []
        self.driven: dict[str, tuple[RedisLock, Driving]] = {}
        batch, _ = store.create_batch(new_batch(), [opening(n) for n in range(1, lines + 1)], [])
        self.lines = store.batch_lines(batch.batch_id, None, 0, lines)
        self.sessions = [line.session_id or "" for line in self.lines]

    def fill(self) -> list[str]:
        """One filler's pass (a creator's, the sweeper's, a finishing worker's): the
        sessions it kicked."""
        before = len(self.kicks)
        fill_batch_window(self.store, self.coordinator, self.kicks.append, window=WINDOW)
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
    window = Window(store, coordinator, 5)
    assert window.fill() == window.sessions[:WINDOW]
    assert window.fill() == []  # the kicks on their way hold the places
    window.take(window.sessions[0])
    assert window.fill() == []  # and so does a driven line


def test_the_place_a_line_leaves_is_filled_once_by_two_fillers(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    window = Window(store, coordinator, 5)
    one, two, three, _four, _five = window.sessions
    window.fill()
    window.take(one)
    window.take(two)
    window.end(one)
    # The sweeper and the finished line's worker both top the window up (each with
    # fill_batch_window): the first kicks the next line, the second finds the window
    # full, not the oldest line taken and the one after it free.
    assert window.fill() == [three]
    assert window.fill() == []
    window.take(three)
    assert window.fill() == []
    assert store.batch_runs_in_flight() == WINDOW


def test_a_place_held_by_a_kick_long_on_its_way_is_still_held(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    window = Window(store, coordinator, 4)
    one, two, _three, _four = window.sessions
    window.fill()
    # A kick that waited in the broker past the grace the sweeper gives it: the sweeper
    # may look at its session again, but its flag still holds the place.
    for session_id in (one, two):
        coordinator.redis.pexpire(
            c.kick_pending_key(session_id),
            1000 * (c.KICK_PENDING_SECONDS - c.KICK_GRACE_SECONDS) - 1,
        )
    assert window.fill() == []


def test_a_line_waiting_for_capacity_holds_its_place(
    store: SqlStore, coordinator: RedisCoordinator
) -> None:
    window = Window(store, coordinator, 4)
    one, two, three, _four = window.sessions
    window.fill()
    window.take(one)
    window.take(two)
    wait_for_capacity(store, window.lines[0].turn_id)
    assert window.fill() == []
    window.end(two)
    assert window.fill() == [three]
