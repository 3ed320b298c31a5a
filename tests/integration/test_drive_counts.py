"""A drive's log line counts what that driver cost, even with another driver running at
the same time in the same process, as on Celery's threads pool (the benchmarks read the
line; the process's counters still count everything)."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import parley
from parley.ports.host import ModelReply
from parley.runtime.fleet import FleetRuntime, drive_session
from tests.integration.drive import migrated_store, new_session, submit
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import REDIS_TEST_URL, flush_redis

pytestmark = pytest.mark.postgres

# The line, with the counts as tests/bench/fleet.py reads them.
DROVE = re.compile(
    r"drove session (?P<session>\S+): "
    r"turns=(\d+) transactions=(\d+) round_trips=(\d+) events=(\d+) coalesced=(\d+)$"
)


class MeetingModel:
    """Streams a few deltas per call once ``parties`` calls are inside at the same time
    (so that the drives overlap)."""

    name = "meeting"

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties)

    def stream(self, request: Any, on_delta: Any) -> ModelReply:
        self.barrier.wait(10)
        for word in ("one ", "two ", "three"):
            on_delta(word)
        return ModelReply(text="one two three")


@pytest.fixture
def own_database() -> Iterator[str]:
    """A database of this test's own: the run's shared one may hold an embedded client
    another test left behind, whose recovery would drive the turns counted here first."""
    with fresh_postgres_database("drives") as url:
        yield url


@pytest.fixture
def runtime_of(own_database: str) -> Iterator[Any]:
    """``runtime_of(model)``: a worker process's runtime with a host around ``model``."""
    flush_redis(REDIS_TEST_URL)
    built: list[FleetRuntime] = []

    def build(model: MeetingModel) -> FleetRuntime:
        built.append(
            FleetRuntime.build(
                database_url=own_database,
                redis_url=REDIS_TEST_URL,
                host=parley.Host(model=model),
            )
        )
        return built[-1]

    yield build
    for runtime in built:
        runtime.close()


def _drive_counts(
    runtime: FleetRuntime, sessions: list[str], caplog: pytest.LogCaptureFixture
) -> list[tuple[int, ...]]:
    """Drive each session on a thread of its own, all at once; each drive's counts."""
    caplog.clear()
    threads = [threading.Thread(target=drive_session, args=(runtime, s)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    drove = [DROVE.match(r.getMessage()) for r in caplog.records if r.name == "parley.tasks"]
    counts = {m["session"]: tuple(int(n) for n in m.groups()[1:]) for m in drove if m}
    return [counts[s] for s in sessions]


def test_two_drivers_at_once_in_one_process_each_log_their_own_counts(
    own_database: str, runtime_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="parley.tasks")
    with migrated_store(own_database) as store:
        sessions = [new_session(store) for _ in range(3)]
        for session_id in sessions:
            submit(store, session_id, "count me")

    [alone] = _drive_counts(runtime_of(MeetingModel(1)), sessions[:1], caplog)
    turns, transactions, round_trips, events, coalesced = alone
    assert turns == 1 and transactions > 0 and 0 < round_trips <= events

    runtime = runtime_of(MeetingModel(2))
    before = runtime.store.transactions
    together = _drive_counts(runtime, sessions[1:], caplog)
    assert len(together) == 2
    for counts in together:
        # What a drive of the same turn costs alone: none of the other driver's work.
        assert counts[:2] == (turns, transactions)
        assert counts[3] + counts[4] == events + coalesced  # every delta, sent or joined
        assert 0 < counts[2] <= counts[3]
    assert runtime.store.transactions - before == 2 * transactions  # the process's total
