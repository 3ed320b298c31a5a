"""Session leases: the embedded deployment's lock across the processes sharing one
database (parley.runtime.session_leases), on SQLite and PostgreSQL; and who holds them:
the live holders, and those driving a batch line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from parley.coordination.local_coordinator import LocalCoordinator
from parley.runtime.session_leases import HOSTNAME, ProcessLeases, gone, live_holders
from parley.schemas.batches import LinePlan
from parley.schemas.errors import StoreError
from parley.store.ids import new_id
from parley.store.leases import LeaseStore
from parley.store.sql_store import SqlStore
from tests.integration.batch_plans import create_batch, give_place, new_batch
from tests.integration.drive import finish, migrated_store, new_session, start


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    with migrated_store(db_url) as migrated:
        yield migrated


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_live_holder_keeps_its_session_until_it_lets_go(store: SqlStore) -> None:
    session = new_session(store)
    first, second = ProcessLeases(store.leases), ProcessLeases(store.leases)
    assert first.acquire(session)
    assert not second.acquire(session)
    assert first.acquire(session)  # its own: taken again (a driver of the same process)
    assert second.unheld([session]) == []
    first.release(session)
    assert second.unheld([session]) == [session]
    assert second.acquire(session)
    assert not first.acquire(session)
    second.release(session)


def test_a_lease_that_is_not_renewed_expires(store: SqlStore) -> None:
    session = new_session(store)
    now = [1_000.0]
    lapsed = ProcessLeases(store.leases, seconds=5, clock=lambda: now[0])
    other = ProcessLeases(store.leases, seconds=5, clock=lambda: now[0])
    assert lapsed.acquire(session)
    now[0] += 4.9
    assert not other.acquire(session) and other.unheld([session]) == []
    now[0] += 0.2
    assert other.unheld([session]) == [session]
    assert other.acquire(session)
    other.release(session)
    lapsed.release(session)  # no longer its own: nothing happens


def test_a_holder_renews_its_leases_while_it_holds_them(store: SqlStore) -> None:
    sessions = [new_session(store) for _ in range(3)]
    holder = ProcessLeases(store.leases, seconds=0.6, beat=0.1)
    other = ProcessLeases(store.leases, seconds=0.6, beat=0.1)
    for session in sessions:
        assert holder.acquire(session)
    time.sleep(1.5)  # more than two leases' time: only renewals keep them
    assert holder.valid()
    assert other.unheld(sessions) == []
    assert not any(other.acquire(session) for session in sessions)
    holder.release(sessions[0])
    assert other.unheld(sessions) == [sessions[0]]
    for session in sessions[1:]:
        holder.release(session)
    holder.close()  # no renewal may outlive the store's close


def test_a_closed_holder_renews_nothing_more(store: SqlStore) -> None:
    session = new_session(store)
    holder = ProcessLeases(store.leases, seconds=0.6, beat=0.1)
    other = ProcessLeases(store.leases, seconds=0.6, beat=0.1)
    assert holder.acquire(session)
    holder.close()  # as its client closes: the store is about to be closed too
    time.sleep(0.8)
    assert other.unheld([session]) == [session]  # its lease ran out, unrenewed


class FailingRenewals(LeaseStore):
    """The store as a database that stopped answering renewals."""

    def renew_leases(self, owner: str, session_ids: object, *, until: float) -> None:
        raise StoreError("the database is away")


def test_a_holder_whose_renewals_fail_stops_believing_it_holds(store: SqlStore) -> None:
    session = new_session(store)
    holder = ProcessLeases(FailingRenewals(store.db), seconds=0.6, beat=0.1)
    assert holder.acquire(session) and holder.valid()
    time.sleep(0.7)
    assert not holder.valid()  # its drivers stop at their next boundary
    holder.release(session)
    holder.close()


def test_a_lease_of_a_process_gone_from_this_machine_is_taken_at_once(store: SqlStore) -> None:
    session = new_session(store)
    dead = f"{HOSTNAME}:{dead_pid()}:0123456789ab"
    store.take_lease(session, dead, until=time.time() + 3600, now=time.time())
    assert gone(dead)
    taker = ProcessLeases(store.leases)
    assert taker.unheld([session]) == [session]
    assert taker.acquire(session)
    assert store.leases_of([session])[session].owner == taker.owner
    taker.release(session)


def test_only_a_holder_known_dead_is_taken_over(store: SqlStore) -> None:
    session = new_session(store)
    for alive in (
        f"{HOSTNAME}:{os.getppid()}:0123456789ab",  # alive: the test runner's parent
        f"elsewhere.example:{dead_pid()}:0123456789ab",  # another machine: unknown
        "not-a-parley-owner",
    ):
        assert not gone(alive)
        store.take_lease(session, alive, until=time.time() + 3600, now=time.time())
        assert not ProcessLeases(store.leases).acquire(session)
        store.release_lease(session, alive)


def test_a_session_lock_and_its_lease_go_together(store: SqlStore) -> None:
    """Two processes, each with its in-process locks and its leases, on one database."""
    session = new_session(store)
    here, there = LocalCoordinator(), LocalCoordinator()
    here_leases, there_leases = ProcessLeases(store.leases), ProcessLeases(store.leases)
    lock = here.try_lock(session)
    assert lock is not None
    leased = here_leases.lease(session, lock)
    assert leased is not None and leased.held()
    other = there.try_lock(session)
    assert other is not None  # its in-process lock is free, but not the lease
    assert there_leases.lease(session, other) is None
    assert there.try_lock(session) is not None  # and the refusal gave its lock back
    assert there_leases.unheld(there.unattended([session])) == []
    leased.release()
    assert here.unattended([session]) == [session]
    assert there_leases.unheld([session]) == [session]


def test_the_live_holders_and_those_driving_a_batch_line_are_told_apart(store: SqlStore) -> None:
    session = new_session(store)
    batch_session = new_id()
    line = LinePlan(line=1, custom_id="c1", prompt="p", session_id=batch_session, root="/tmp")
    batch, _ = create_batch(store, new_batch(), [line], [])
    here, there = ProcessLeases(store.leases), ProcessLeases(store.leases)
    assert here.acquire(session)
    assert here.owner in live_holders(store.leases)
    assert not there.batch_lines_run_elsewhere()  # it drives an interactive turn only
    assert there.acquire(batch_session)
    assert not there.batch_lines_run_elsewhere()  # its own batch line's session is queued
    give_place(store, store.batch_lines(batch.batch_id, None, 0, 1)[0].turn_id)
    taken = start(store, batch_session)  # the line runs: `there` drives a batch line
    assert here.batch_lines_run_elsewhere() and not there.batch_lines_run_elsewhere()
    dead = f"{HOSTNAME}:{dead_pid()}:0123456789ab"
    there.release(batch_session)
    store.take_lease(batch_session, dead, until=time.time() + 3600, now=time.time())
    assert not here.batch_lines_run_elsewhere()  # its holder is gone
    assert dead not in live_holders(store.leases)
    finish(store, taken, taken.next_seq)
    store.release_lease(batch_session, dead)
    here.release(session)
