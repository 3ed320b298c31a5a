"""The migrations build exactly the schema src/parley/schemas/tables/ declares, on both databases:
a table, column, index or constraint added to one and not the other fails here.  And
what a migration fills in for the rows there were."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from parley.schemas.tables import metadata
from parley.store.database import (
    alembic_config,
    create_database_engine,
    current_revision,
    migrate,
)
from parley.store.sql_store import SqlStore
from tests.conftest import BACKENDS
from tests.support.databases import fresh_postgres_database


def test_the_migrated_schema_is_the_declared_one(db_url: str) -> None:
    engine = create_database_engine(db_url)
    try:
        migrate(engine)
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), metadata) == []
    finally:
        engine.dispose()


@pytest.fixture(params=BACKENDS)
def own_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of the test's own, to take back to an earlier revision."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'own.db'}"
        return
    with fresh_postgres_database("migrations") as url:
        yield url


def test_migration_0015_gives_the_sessions_batch_lines_opened_their_batch(
    own_db_url: str,
) -> None:
    engine = create_database_engine(own_db_url)
    config = alembic_config()
    with engine.connect() as connection:
        config.attributes["connection"] = connection
        if current_revision(engine) is None:
            command.upgrade(config, "0014")
        else:
            command.downgrade(config, "0014")  # (a fresh PostgreSQL database is at head)
        connection.commit()
    at = datetime(2026, 1, 1, tzinfo=UTC)
    with engine.begin() as db:
        for sid in ("opened", "continued", "plain"):
            db.execute(
                text(
                    "INSERT INTO sessions (id, root, metadata, fence, turn_count, tokens_used, "
                    "prefix_generation, created_at, tenant) "
                    "VALUES (:id, '/r', '{}', 0, 0, 0, 0, :at, 'acme')"
                ),
                {"id": sid, "at": at},
            )
        for file_id in ("file-out", "file-err"):
            db.execute(
                text(
                    "INSERT INTO files (id, purpose, filename, kind, created_at) "
                    "VALUES (:id, 'batch_output', 'f.jsonl', 'batch_output', :at)"
                ),
                {"id": file_id, "at": at},
            )
        db.execute(
            text(
                "INSERT INTO batches (id, tenant, output_file_id, error_file_id, endpoint, "
                "completion_window, status, total, created_at) VALUES ('batch_1', 'acme', "
                "'file-out', 'file-err', '/v1/responses', '24h', 'in_progress', 3, :at)"
            ),
            {"at": at},
        )
        lines: list[tuple[int, str | None, bool]] = [
            (1, "opened", True),
            (2, "continued", False),
            (3, None, False),  # a refused line
        ]
        for line, line_session, opened in lines:
            db.execute(
                text(
                    "INSERT INTO batch_lines (batch_id, line, session_id, opened_session) "
                    "VALUES ('batch_1', :line, :sid, :opened)"
                ),
                {"line": line, "sid": line_session, "opened": opened},
            )
    with engine.connect() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        connection.commit()
    store = SqlStore(engine)
    try:
        assert store.get_session("opened").batch_id == "batch_1"
        assert store.get_session("continued").batch_id is None  # a conversation it continued
        assert store.get_session("plain").batch_id is None
        listed = store.list_sessions(tenant="acme", limit=10, batch_sessions=False)
        assert {r.session_id for r in listed} == {"continued", "plain"}
    finally:
        store.close()
