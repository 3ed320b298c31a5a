"""Statements run straight through psycopg (PostgreSQL) read and write what they would
through SQLAlchemy: same rows, same JSON, multi-row inserts typed in every row, errors as
SQLAlchemy's, and statements that need SQLAlchemy still run through it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, event
from sqlalchemy.exc import IntegrityError

from parley.store import statements as q
from parley.store.connection import DirectStatements, StoreConnection
from parley.store.sql_store import SqlStore
from parley.store.statements.binds import MAX_INSERT_ROWS
from tests.integration.drive import submit


@pytest.fixture
def store(postgres_store: SqlStore) -> SqlStore:
    return postgres_store


@pytest.fixture
def connections(store: SqlStore) -> Iterator[tuple[StoreConnection, Connection]]:
    """The direct connection and SQLAlchemy's own, in one transaction rolled back."""
    with store.engine.connect() as connection, connection.begin() as tx:
        yield StoreConnection(connection, DirectStatements(store.engine.dialect)), connection
        tx.rollback()


def _turn(store: SqlStore) -> tuple[str, str, str]:
    session = store.create_session(root="/r", metadata={"k": [1, "v"]}, token_ceiling=None)
    turn_id, run_id = submit(store, session.session_id)
    return session.session_id, turn_id, run_id


def test_rows_read_directly_are_the_rows_sqlalchemy_reads(
    store: SqlStore, connections: tuple[StoreConnection, Connection]
) -> None:
    session_id, turn_id, _run_id = _turn(store)
    direct, alchemy = connections
    cases: list[tuple[Any, dict[str, Any]]] = [
        (q.SESSION, {"b_session_id": session_id}),
        (q.RUN_BY_TURN, {"b_turn_id": turn_id}),
        (q.NEXT_RUN, {"b_session_id": session_id}),
        (q.EVENTS_AFTER, {"b_turn_id": turn_id, "b_seq": 0}),
    ]
    for statement, params in cases:
        got = direct.execute(statement, params).all()
        want = alchemy.execute(statement, params).all()
        assert [dict(r._mapping) for r in got] == [dict(r._mapping) for r in want]
        assert [tuple(r) for r in got] == [tuple(r) for r in want]
    session = direct.execute(q.SESSION, {"b_session_id": session_id}).one()
    assert session.metadata == {"k": [1, "v"]} and session.fence == 0


@pytest.mark.parametrize("count", [1, 2, MAX_INSERT_ROWS, MAX_INSERT_ROWS + 1])
def test_inserts_of_many_rows_store_each_rows_json(
    store: SqlStore, connections: tuple[StoreConnection, Connection], count: int
) -> None:
    _session_id, turn_id, _run_id = _turn(store)
    direct, _alchemy = connections
    now = datetime.now(UTC)
    rows = [
        {"turn_id": turn_id, "seq": 10 + n, "kind": "step", "data": {"n": n}, "created_at": now}
        for n in range(count)
    ]
    direct.execute(store.db.q.insert_events, rows)
    direct.execute(store.db.q.insert_events, rows)  # ON CONFLICT DO NOTHING: no error
    stored = direct.execute(q.EVENTS_AFTER, {"b_turn_id": turn_id, "b_seq": 9}).all()
    assert [(r.seq, r.data) for r in stored] == [(10 + n, {"n": n}) for n in range(count)]


def test_a_violated_constraint_is_sqlalchemys_integrity_error(
    store: SqlStore, connections: tuple[StoreConnection, Connection]
) -> None:
    _session_id, _turn_id, run_id = _turn(store)
    direct, _alchemy = connections
    steer = {
        "run_id": run_id,
        "position": 1,
        "kind": "say",
        "text": "t",
        "created_at": datetime.now(UTC),
    }
    direct.execute(q.INSERT_STEER, steer)
    with pytest.raises(IntegrityError):
        direct.execute(q.INSERT_STEER, steer)


def test_statements_needing_sqlalchemy_still_run_and_every_one_is_seen_by_listeners(
    store: SqlStore, connections: tuple[StoreConnection, Connection]
) -> None:
    _session_id, _turn_id, run_id = _turn(store)
    direct, alchemy = connections
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(alchemy, "before_cursor_execute", record)
    # An expanding IN list: SQLAlchemy renders it per call.
    assert direct.execute(q.STEPS_OF_RUNS, {"b_run_ids": [run_id, "other"]}).all() == []
    assert direct.execute(q.RUN_STATUS, {"b_run_id": run_id}).scalar_one() == "queued"
    assert len(seen) == 2 and "$1" in seen[1]  # the second ran directly
