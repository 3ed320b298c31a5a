"""The example product host (``examples/audited_host``) on every back end: host context
to a tool, a refused anonymous turn, a rejected reply, a refreshing prefix, and the
audit table its ``after_commit`` writes (on the fleet, from the worker processes)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import parley
from examples.audited_host.host import SYSTEM_PROMPT, build_host
from parley.schemas.events import EventKind
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import Fleet, flush_redis

pytestmark = pytest.mark.postgres


@pytest.fixture
def audit_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "audit.db"
    monkeypatch.setenv("AUDIT_DB", str(path))
    return path


@pytest.fixture(params=["embedded-sqlite", "fleet-postgres"])
def client(
    request: pytest.FixtureRequest, tmp_path: Path, audit_db: Path
) -> Iterator[parley.Client]:
    if request.param == "embedded-sqlite":
        with parley.connect(f"sqlite:///{tmp_path / 'runs.db'}", host=build_host()) as embedded:
            yield embedded
        return
    # A database of its own: the run's shared one holds what other tests left (turns of
    # other tenants counted as running or waiting, queued batch lines), and the fleet's
    # share of the workers and its batch window read them (once seen: this turn held
    # back for a minute, in a whole run under load).
    with fresh_postgres_database("example") as url:
        pool = Fleet(database_url=url, host="examples.audited_host.host:host")
        flush_redis(pool.redis_url)
        pool.start_worker(concurrency=2, pool="threads")
        try:
            pool.wait_ready()
            with parley.connect(url, redis_url=pool.redis_url, queue=pool.queue) as fleet:
                yield fleet
        finally:
            pool.stop()


def audit_rows(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as db:
        return list(db.execute("SELECT turn_id, outcome, user, host_context, path FROM audit"))


@pytest.mark.timeout(180)
def test_the_example_host_end_to_end(client: parley.Client, tmp_path: Path, audit_db: Path) -> None:
    session = client.open_session(tmp_path)
    who = session.submit("who am I?", context={"user": "ada", "team": "release"})
    result = who.wait(timeout=60)
    assert result.outcome is parley.TurnStatus.FINISHED
    [answer] = [e for e in who.events() if e.kind is EventKind.TOOL_RESULT]
    assert answer.data["content"] == "ada (release)"

    anonymous = session.turn("hello", timeout=60)
    assert anonymous.outcome is parley.TurnStatus.FAILED
    assert anonymous.error is not None and "named user" in anonymous.error

    promise = session.turn("promise a date", context={"user": "ada"}, timeout=60)
    assert promise.outcome is parley.TurnStatus.FAILED and promise.reply is None
    assert promise.error is not None and "guarantee" in promise.error

    rows = audit_rows(audit_db)
    assert [(r[0], r[1], r[2]) for r in rows] == [(result.turn_id, "finished", "ada")]
    assert json.loads(rows[0][3]) == {"team": "release", "user": "ada"}
    assert json.loads(rows[0][4]) == [result.turn_id]


def test_the_prefix_refreshes_when_the_tools_change(
    tmp_path: Path, audit_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with parley.connect(url, host=build_host()) as client:
        session = client.open_session(tmp_path)
        session.turn("note this", context={"user": "ada"})
        first = client.store.steps_of(session.history()[0].turn_id)
    monkeypatch.setenv("AUDIT_TOOLS", "lean")
    with parley.connect(url, host=build_host()) as client:
        client.session(session.id).turn("and this", context={"user": "ada"})
        state = client.store.get_session(session.id)
    assert first and state.session_id == session.id
    with sqlite3.connect(tmp_path / "runs.db") as db:
        generations = db.execute(
            "SELECT generation, payload FROM prefixes WHERE session_id = ? ORDER BY generation",
            (session.id,),
        ).fetchall()
    assert len(generations) == 2 and generations[0][0] < generations[1][0]
    tools = [[t["name"] for t in json.loads(p)["tools"]] for _, p in generations]
    assert "release_notes" in tools[0] and "release_notes" not in tools[1]
    assert all(json.loads(p)["system_prompt"] == SYSTEM_PROMPT for _, p in generations)
    assert len(audit_rows(audit_db)) == 2
