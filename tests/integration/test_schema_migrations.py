"""The migrations build exactly the schema schemas/tables.py declares, on both databases:
a table, column, index or constraint added to one and not the other fails here."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from schemas.tables import metadata
from workers.store.database import create_database_engine, migrate


def test_the_migrated_schema_is_the_declared_one(db_url: str) -> None:
    engine = create_database_engine(db_url)
    try:
        migrate(engine)
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), metadata) == []
    finally:
        engine.dispose()
