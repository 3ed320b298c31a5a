"""Fleet-wide admission against a provider account (docs/admission.md): the Procfile's
fleet runs a backlog of batch turns at the provider's limit with few 429s, an interactive
turn submitted into it streams at once, a 429 out of phase at a backlog's start costs
little, a second tenant's small batch is not stuck behind the first's, an exhausted quota
fails a turn at once, and the buckets survive Redis losing everything.

The provider is a real OpenAI-compatible server on loopback with an account's limits
(tests/providers/rate_limited_server.py), which the workers' official ``openai`` client
talks to; nothing about its limits is configured: the fleet learns them from its
headers.  One server and one fleet serve every test here (each test resets the server's
counts), so what the fleet learned in one test it knows in the next: the first test is
the one that starts cold.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

import parley
from parley.coordination.redis_admission import RedisAdmission
from parley.schemas.events import EventKind
from tests.providers.rate_limited_server import ServerProcess, server_process
from tests.support.chaos import CHAOS_REDIS_URL, Chaos
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import flush_redis, procfile_worker
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

RPM = 1_200  # 20 calls a second
STREAM_SECONDS = 1.0
MODEL = "openai:gpt-test"


@dataclass
class Provider:
    server: ServerProcess
    chaos: Chaos


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    workspace = tmp_path_factory.mktemp("admission") / "workspace"
    workspace.mkdir()
    pool, concurrency = procfile_worker()
    arguments = ("--rpm", str(RPM), "--stream-seconds", str(STREAM_SECONDS))
    with server_process(*arguments) as server, fresh_postgres_database("admission") as url:
        flush_redis(CHAOS_REDIS_URL)
        chaos = Chaos(
            url,
            workspace,
            pool=pool,
            concurrency=concurrency,
            host="tests.support.hosts:provider_host",
            environment={"PARLEY_TEST_PROVIDER_URL": server.base_url},
        )
        try:
            yield Provider(server=server, chaos=chaos)
        finally:
            chaos.close()


def _sessions(provider: Provider, count: int, tenant: str) -> list[parley.Session]:
    client = provider.chaos.client
    return [client.open_session(provider.chaos.workspace, tenant=tenant) for _ in range(count)]


def _first_token_after(handle: parley.TurnHandle, since: float, box: list[float]) -> None:
    for event in handle.events():
        if event.kind is EventKind.TOKEN:
            box.append(time.monotonic() - since)
            return
        if event.kind is EventKind.END:
            return


@pytest.mark.timeout(240)
def test_a_backlog_runs_at_the_providers_limit_and_an_interactive_turn_goes_first(
    provider: Provider,
) -> None:
    provider.server.reset_stats()
    batch = _sessions(provider, 300, "acme")
    started = time.monotonic()
    handles = [s.submit(f"line {n}", priority="batch") for n, s in enumerate(batch)]
    time.sleep(3)
    (person,) = _sessions(provider, 1, "acme")
    asked = time.monotonic()
    interactive = person.submit("I am waiting for this")
    first: list[float] = []
    follower = threading.Thread(target=_first_token_after, args=(interactive, asked, first))
    follower.start()
    assert interactive.wait(60).outcome is parley.TurnStatus.FINISHED
    follower.join(10)
    results = [h.wait(180) for h in handles]
    took = time.monotonic() - started
    failed = [r for r in results if r.outcome is not parley.TurnStatus.FINISHED]
    assert not failed, failed
    stats = provider.server.stats()
    # Every line once, and few refusals: the fleet learned the limit from the headers
    # (a cold start probes one call per worker first) and kept under it.
    assert stats.admitted == 301
    assert stats.rate_limited <= 0.05 * stats.admitted, stats
    # At close to the limit: 300 calls at 20 a second take 15 s; the fleet's overhead
    # and the probe at the start allow some more, not the client's retry storms.
    assert took < 300 / (RPM / 60) * 1.35 + 5, took
    # The interactive turn took capacity before the backlog's calls.
    assert first and first[0] < 2.5, first


@pytest.mark.timeout(240)
def test_a_lone_429_at_the_start_of_a_backlog_costs_little(provider: Provider) -> None:
    """Issue 42: one call refused at the start of a backlog, as by a provider whose bucket
    is out of phase with the fleet's, halved the rate for the whole backlog (twice the
    floor).  It costs its retry-after and the buckets it emptied now."""
    provider.server.reset_stats()
    batch = _sessions(provider, 300, "acme")
    provider.server.refuse(1)
    started = time.monotonic()
    handles = [s.submit(f"line {n}", priority="batch") for n, s in enumerate(batch)]
    wait_until(lambda: provider.server.stats().rate_limited >= 1, what="the 429")
    admission = RedisAdmission(provider.chaos.redis_url)
    try:
        (use,) = admission.use([MODEL])
    finally:
        admission.close()
    assert use.slowed == 1.0, use  # blocked for its retry-after, not slowed
    results = [h.wait(180) for h in handles]
    took = time.monotonic() - started
    assert {r.outcome for r in results} == {parley.TurnStatus.FINISHED}
    stats = provider.server.stats()
    assert stats.rate_limited >= 1 and stats.admitted == 300, stats
    assert took < 300 / (RPM / 60) * 1.35 + 5, took


@pytest.mark.timeout(240)
def test_a_late_tenants_small_batch_is_not_stuck_behind_the_first_tenants(
    provider: Provider,
) -> None:
    provider.server.reset_stats()
    big = _sessions(provider, 240, "big")
    small = _sessions(provider, 10, "small")
    started = time.monotonic()
    backlog = [s.submit(f"big {n}", priority="batch") for n, s in enumerate(big)]
    time.sleep(3)
    arrived = time.monotonic()
    late = [s.submit(f"small {n}", priority="batch") for n, s in enumerate(small)]
    ends = []
    for handle in late:
        assert handle.wait(120).outcome is parley.TurnStatus.FINISHED
        ends.append(time.monotonic() - arrived)
    small_done = time.monotonic()
    assert [h.wait(180).outcome for h in backlog] == [parley.TurnStatus.FINISHED] * len(big)
    big_done = time.monotonic()
    # Equal weights: the ten get half the capacity from their arrival (ten calls at ten
    # a second), not a place after the 240 lines already waiting.
    assert max(ends) < 6, ends
    assert big_done - small_done > 3, (big_done - started, small_done - started)
    stats = provider.server.stats()
    assert stats.rate_limited <= 0.05 * stats.admitted, stats


@pytest.mark.timeout(120)
def test_an_exhausted_quota_fails_the_turn_at_once_saying_so(provider: Provider) -> None:
    provider.server.reset_stats()
    provider.server.set_mode("quota")
    try:
        (session,) = _sessions(provider, 1, "acme")
        asked = time.monotonic()
        result = session.submit("no credit left").wait(30)
        took = time.monotonic() - asked
    finally:
        provider.server.set_mode("normal")
    assert result.outcome is parley.TurnStatus.FAILED
    record = provider.chaos.client.store.run_state(result.turn_id)
    assert record.error is not None and "quota" in record.error, record.error
    assert took < 5, took
    assert provider.server.stats().quota_refused == 1  # not retried, by the client or parley


@pytest.mark.timeout(240)
def test_the_buckets_survive_redis_losing_everything(provider: Provider) -> None:
    provider.server.reset_stats()
    batch = _sessions(provider, 150, "acme")
    handles = [s.submit(f"line {n}", priority="batch") for n, s in enumerate(batch)]
    time.sleep(3)
    client = redis.Redis.from_url(CHAOS_REDIS_URL)
    try:
        client.flushdb()  # (the test's own database: FLUSHALL would empty the others')
    finally:
        client.close()
    results = [h.wait(180) for h in handles]
    assert {r.outcome for r in results} == {parley.TurnStatus.FINISHED}
    assert {r.steps for r in results} == {1}  # each line's step committed once
    stats = provider.server.stats()
    # The locks went with the flush: the calls in flight then (a second of the rate at
    # most) are redone by the drivers that take their sessions over.
    assert 150 <= stats.admitted <= 150 + RPM / 60, stats
    # Rebuilt full: at most one burst (a second of the rate) more than the account
    # allows, which it refuses; the rest stays under the limit.
    assert stats.rate_limited <= RPM / 60 + 0.05 * stats.admitted, stats
    per_second = sorted(stats.per_second.values())
    assert statistics.median(per_second) <= RPM / 60 + 1, stats.per_second
