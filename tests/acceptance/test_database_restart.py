"""The fleet's PostgreSQL restarted under it, with real processes: a server of the test's
own on a free port stops (``-m fast``: every connection closed, transactions in flight
rolled back) while workers drive turns, stays down for three seconds and starts again.
Every accepted turn completes exactly once and in order, and the workers live on.  On
prefork and on the Procfile's worker line (``tests.support.chaos``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.test_broker_restart import RESTART_RULES, assert_the_fleet_went_on
from tests.support.chaos import CHAOS_REDIS_URL, Chaos, deployment_options
from tests.support.databases import fresh_postgres_database
from tests.support.deployments import on_fleet_deployments
from tests.support.fleet import flush_redis
from tests.support.postgres_server import PostgresServer

pytestmark = [on_fleet_deployments(), pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


def test_workers_ride_through_a_postgresql_restart_under_load(
    deployment: str, postgres: PostgresServer, workspace: Path, request: pytest.FixtureRequest
) -> None:
    flush_redis(CHAOS_REDIS_URL)
    with fresh_postgres_database("pg_restart", postgres.admin_url) as url:
        chaos = Chaos(url, workspace, **deployment_options(deployment, request))
        try:
            _restart_under_load(chaos, postgres)
        finally:
            chaos.close()


def _restart_under_load(chaos: Chaos, postgres: PostgresServer) -> None:
    chaos.control.script(RESTART_RULES)
    # One session whose driver waits at the gate with a turn queued behind it (its step
    # commits after the restart), three that stream turn after turn through it.
    gated = chaos.client.open_session(chaos.workspace)
    streaming = [chaos.client.open_session(chaos.workspace) for _ in range(3)]
    load = [[gated.submit("gated 0"), gated.submit("load 1 of the gated session")]] + [
        [s.submit(f"load {n} of {s.id[:8]}") for n in range(3)] for s in streaming
    ]
    chaos.control.wait_entered()
    postgres.stop()
    time.sleep(3)
    postgres.start()
    chaos.control.open_gate()

    assert_the_fleet_went_on(chaos, load)
    # The gated turn's driver held its session across the outage and committed after it.
    assert chaos.client.store.run_state(load[0][0].turn_id).attempts == 1
