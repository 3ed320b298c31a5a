"""The store is composed of repositories, not a chain of mixins (src/parley/store/
sql_store.py): every public method of every repository (bar those that are a step inside
another's transaction) is the store's own, read through the repository that holds it,
and no repository inherits from another."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest

from parley.schemas.records import SessionRecord
from parley.store.connection import Transactions
from parley.store.database import create_database_engine, migrate
from parley.store.exposing import exposed
from parley.store.sessions import SessionStore
from parley.store.sql_store import SqlStore


@pytest.fixture
def store() -> Iterator[SqlStore]:
    engine = create_database_engine("sqlite:///:memory:")
    migrate(engine)
    made = SqlStore(engine)
    yield made
    made.close()


def repositories(store: SqlStore) -> dict[str, object]:
    return {
        name: part
        for name, part in vars(store).items()
        if type(part).__module__.startswith("parley.store.") and not isinstance(part, Transactions)
    }


def test_every_repository_method_is_the_stores_read_through_its_repository(
    store: SqlStore,
) -> None:
    parts = repositories(store)
    assert len(parts) >= 15, parts
    for part_name, part in parts.items():
        for name, method in inspect.getmembers(type(part), inspect.isfunction):
            parameters = list(inspect.signature(method).parameters)
            if name.startswith("_") or parameters[1:2] == ["db"]:
                continue
            declared = inspect.getattr_static(SqlStore, name)
            assert isinstance(declared, exposed), f"{type(part).__name__}.{name} is not exposed"
            assert declared.part == part_name
            assert getattr(store, name) == getattr(part, name)


def test_the_repositories_share_one_transactions_and_inherit_from_none(store: SqlStore) -> None:
    for part in repositories(store).values():
        assert type(part).__mro__[1:] == (object,), type(part).__mro__
        assert vars(part)["_db"] is store.db


def test_a_method_replaced_on_the_store_is_what_callers_get(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert store.list_sessions(tenant="t", limit=5) == []
    replaced: list[SessionRecord] = []
    monkeypatch.setattr(store, "list_sessions", lambda **_kw: replaced)
    assert store.list_sessions(tenant="t", limit=5) is replaced
    monkeypatch.undo()
    assert store.list_sessions(tenant="t", limit=5) == []


def test_an_exposure_named_unlike_its_method_is_refused() -> None:
    # (Python 3.11 wraps an error of __set_name__ in a RuntimeError; 3.12 raises it.)
    with pytest.raises((TypeError, RuntimeError)) as raised:

        class Misnamed:
            listing = exposed("sessions", SessionStore.list_sessions)

    assert "name it alike" in str(raised.value.__cause__ or raised.value)
