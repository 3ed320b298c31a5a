"""The tests' PostgreSQL databases: a fresh database of a test run's own on the server
``PARLEY_TEST_PG_URL`` names (default: the machine's, on 127.0.0.1), dropped after, and a
way to cut every connection to one."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from parley.store.database import create_database_engine, migrate

PG_ADMIN_URL = os.environ.get("PARLEY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


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
