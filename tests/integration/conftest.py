"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.database import create_database_engine, migrate
from workers.store import SqlStore


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqlStore]:
    """A migrated store on a SQLite file of the test's own."""
    engine = create_database_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    migrate(engine)
    store = SqlStore(engine)
    yield store
    store.close()
