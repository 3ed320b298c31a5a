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
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.engine import Engine

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


def _at_revision(url: str, revision: str) -> tuple[Engine, Config]:
    """An engine on ``url`` whose schema is at ``revision`` (a fresh PostgreSQL database
    is at head: taken down; a fresh SQLite file is empty: taken up), and the Alembic
    config that moved it."""
    engine = create_database_engine(url)
    config = alembic_config()
    with engine.connect() as connection:
        config.attributes["connection"] = connection
        if current_revision(engine) is None:
            command.upgrade(config, revision)
        else:
            command.downgrade(config, revision)
        connection.commit()
    return engine, config


def _upgrade(engine: Engine, config: Config) -> None:
    """Take ``engine``'s schema to head."""
    with engine.connect() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        connection.commit()


def test_migration_0015_gives_the_sessions_batch_lines_opened_their_batch(
    own_db_url: str,
) -> None:
    engine, config = _at_revision(own_db_url, "0014")
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
    _upgrade(engine, config)
    store = SqlStore(engine)
    try:
        assert store.get_session("opened").batch_id == "batch_1"
        assert store.get_session("continued").batch_id is None  # a conversation it continued
        assert store.get_session("plain").batch_id is None
        listed = store.list_sessions(tenant="acme", limit=10, batch_sessions=False)
        assert {r.session_id for r in listed} == {"continued", "plain"}
    finally:
        store.close()


def test_migration_0030_flags_the_sessions_with_compactions_or_push_configurations(
    own_db_url: str,
) -> None:
    """A session flagged ``compacted`` or ``pushes`` has its claims and ends read what
    it holds; one not flagged is never asked: a flag missing on a session that had a
    compaction would make its next turn ignore it."""
    engine, config = _at_revision(own_db_url, "0029")
    at = datetime(2026, 1, 1, tzinfo=UTC)
    with engine.begin() as db:
        for sid in ("compacted", "pushed", "plain"):
            db.execute(
                text(
                    "INSERT INTO sessions (id, root, metadata, fence, turn_count, tokens_used, "
                    "prefix_generation, created_at) VALUES (:id, '/r', '{}', 0, 1, 0, 0, :at)"
                ),
                {"id": sid, "at": at},
            )
            db.execute(
                text(
                    "INSERT INTO turns (id, session_id, ordinal, prompt, created_at) "
                    "VALUES (:turn, :id, 1, 'hi', :at)"
                ),
                {"turn": f"turn-{sid}", "id": sid, "at": at},
            )
        db.execute(
            text(
                "INSERT INTO compactions (id, session_id, through_turn_id, strategy, text, "
                "messages, tokens_before, tokens_after, created_at) VALUES ('c1', 'compacted', "
                "'turn-compacted', 'trim', '', '[]', 10, 5, :at)"
            ),
            {"at": at},
        )
        db.execute(
            text(
                "INSERT INTO push_configs (id, turn_id, url, created_at) "
                "VALUES ('p1', 'turn-pushed', 'http://127.0.0.1:9/hook', :at)"
            ),
            {"at": at},
        )
    _upgrade(engine, config)
    try:
        with engine.connect() as db:
            rows = db.execute(text("SELECT id, compacted, pushes FROM sessions")).all()
        flags = {row.id: (bool(row.compacted), bool(row.pushes)) for row in rows}
        assert flags == {
            "compacted": (True, False),
            "pushed": (False, True),
            "plain": (False, False),
        }
    finally:
        engine.dispose()
