"""The fleet behind PgBouncer in transaction mode (docs/scaling.md#pgbouncer): Debian's
``pgbouncer`` on a port of its own in front of the tests' PostgreSQL, every process of
the fleet (two workers on the Procfile's line, the sweeper, the client) connecting
through it.  The fleet's scenarios hold: order per session, steers, readers that drop
their stream and come back, a worker SIGKILLed mid-turn; the server sees no more
connections than the pooler's pool, however many the fleet opens; and the same fleet
with psycopg's prepared statements left on breaks, so the first test could fail."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import parley
from parley.store.database import (
    behind_pooler,
    create_database_engine,
    current_revision,
    head_revision,
)
from tests.support.chaos import CHAOS_REDIS_URL, Chaos
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import flush_redis, procfile_worker
from tests.support.fleet_scenarios import killed_during_a_tool_call, steers_and_rejoining_readers
from tests.support.pgbouncer import PgBouncer, peak_server_connections, pgbouncer

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

POOL_SIZE = 8


@pytest.fixture
def bouncer() -> Iterator[PgBouncer]:
    with pgbouncer(pool_size=POOL_SIZE) as started:
        yield started


@pytest.fixture
def bounced(workspace: Path, bouncer: PgBouncer) -> Iterator[Chaos]:
    """A fleet whose every connection goes through ``bouncer`` (its pooler setting left
    unset: each process detects it)."""
    pool, concurrency = procfile_worker()
    with fresh_postgres_database("bounced") as url:
        flush_redis(CHAOS_REDIS_URL)
        harness = Chaos(bouncer.url_of(url), workspace, pool=pool, concurrency=concurrency)
        try:
            yield harness
        finally:
            harness.close()


def test_the_fleet_behind_pgbouncer_keeps_order_steers_and_readers(bounced: Chaos) -> None:
    with peak_server_connections(bounced.database_url) as peak:
        steers_and_rejoining_readers(bounced, sessions=8)
    # Two workers of many threads, the sweeper and this client hold far more client
    # connections than the server ever sees.
    assert 0 < peak[0] <= POOL_SIZE, peak[0]


def test_a_worker_killed_mid_turn_behind_pgbouncer_is_replaced(bounced: Chaos) -> None:
    killed_during_a_tool_call(bounced)


def test_a_connection_through_pgbouncer_is_detected(bouncer: PgBouncer) -> None:
    with fresh_postgres_database("detected") as url:
        direct = create_database_engine(url)
        through = create_database_engine(bouncer.url_of(url))
        try:
            assert not behind_pooler(direct)
            assert behind_pooler(through)
        finally:
            direct.dispose()
            through.dispose()


def test_with_prepared_statements_left_on_the_same_turns_break(
    bouncer: PgBouncer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the detection prevents: psycopg prepares a statement after its fifth run on a
    # connection, and the pooler hands the next transaction another server connection.
    monkeypatch.setenv("PARLEY_DATABASE_POOLER", "none")
    host = parley.Host(
        model=parley.models.ScriptedModel({"rules": [{"when": "", "steps": [{"text": "hi"}]}]})
    )
    with fresh_postgres_database("prepared") as url:
        client = parley.connect(bouncer.url_of(url), host=host)
        try:
            session = client.open_session(str(tmp_path))
            with pytest.raises(parley.errors.StoreError, match="prepared statement"):
                for n in range(30):
                    session.turn(f"hello {n}", timeout=30)
        finally:
            client.close()


def test_parley_migrate_goes_past_the_pooler_to_the_direct_url(bouncer: PgBouncer) -> None:
    with fresh_postgres_database("direct", migrated=False) as url:
        env = {
            **os.environ,
            "PARLEY_DATABASE_URL": bouncer.url_of(url),
            "PARLEY_DATABASE_DIRECT_URL": url,
        }
        done = subprocess.run(
            [sys.executable, "-m", "parley", "migrate"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        engine = create_database_engine(url)
        try:
            assert current_revision(engine) == head_revision()
        finally:
            engine.dispose()
        assert f"schema at revision {head_revision()}" in done.stdout
