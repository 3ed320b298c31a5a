"""Shared fixtures: a database per back end (SQLite file, and a fresh PostgreSQL database
per test run, dropped after), a workspace, and clients that are closed after each test.

PostgreSQL is never skipped: if the server named by PARLEY_TEST_PG_URL (default: the
machine's, on 127.0.0.1) is unreachable, the tests that need it fail."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from tests.rabbitmq import run_vhost
from workers.store.database import create_database_engine, migrate

PG_ADMIN_URL = os.environ.get("PARLEY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@contextmanager
def fresh_postgres_database(
    purpose: str, admin_url: str = PG_ADMIN_URL, *, migrated: bool = True
) -> Iterator[str]:
    """A database created for this test run, migrated unless ``migrated`` is false, and
    dropped after it (on the server ``admin_url`` names: the machine's by default)."""
    name = f"parley_{purpose}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = admin_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin.rsplit("/", 1)[0]
    url = f"{base}/{name}".replace("postgresql://", "postgresql+psycopg://", 1)
    if migrated:
        engine = create_database_engine(url)
        migrate(engine)
        engine.dispose()
    try:
        yield url
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def terminate_backends(database_url: str) -> int:
    """Terminate every server process of the database (but the admin's own); returns how
    many there were."""
    database = database_url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL.replace("+psycopg", ""), autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The embedded tests' PostgreSQL database."""
    with fresh_postgres_database("test") as url:
        yield url


@pytest.fixture(scope="session")
def fleet_postgres_url() -> Iterator[str]:
    """The fleet's own database: its sweeper adopts every turn it finds without a Redis
    lock, so it must not share a database with embedded clients (nor should a real
    deployment: a database is served by one kind of deployment)."""
    with fresh_postgres_database("fleet") as url:
        yield url


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """RabbitMQ for the fleet tests that use it as their broker: the server
    ``PARLEY_TEST_AMQP_URL`` names, on a virtual host of this run's own."""
    with run_vhost() as url:
        yield url


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The database URL of each back end in turn."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'parley.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A small workspace root with a file to read and a secrets folder."""
    root = tmp_path / "workspace"
    (root / "secrets").mkdir(parents=True)
    (root / "retry.py").write_text("RETRY_ON = (502, 504)\n")
    (root / "secrets" / "token.txt").write_text("hunter2\n")
    return root
