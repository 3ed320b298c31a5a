"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.drive import migrated_store
from workers.store import SqlStore


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqlStore]:
    """A migrated store on a SQLite file of the test's own."""
    with migrated_store(f"sqlite:///{tmp_path / 'db.sqlite'}") as store:
        yield store


@pytest.fixture
def postgres_store(postgres_url: str) -> Iterator[SqlStore]:
    """A migrated store on the run's PostgreSQL database."""
    with migrated_store(postgres_url) as store:
        yield store
