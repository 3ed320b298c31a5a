"""The tenants' interactive share of the workers (src/parley/runtime/interactive_share.py) on
a real store: each tenant's interactive turns running and waiting for a worker, as the
view counts them; a drive that may not start a tenant's fresh interactive turn claims
nothing and moves it to the batch lane, where the window places it; a turn already
started, or another tenant's, is claimed as ever."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from parley.runtime.interactive_share import InteractiveShares
from parley.store.clock import utc_now
from parley.store.sql_store import SqlStore
from tests.conftest import BACKENDS
from tests.integration.batch_plans import clear_batch_runs
from tests.integration.drive import migrated_store, start, submit
from tests.support.databases import fresh_postgres_database


@pytest.fixture(scope="module")
def shares_postgres_url() -> Iterator[str]:
    """A database of this module's own: the view counts every interactive run in it."""
    with fresh_postgres_database("shares") as url:
        yield url


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[SqlStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        url = request.getfixturevalue("shares_postgres_url")
    with migrated_store(url) as opened:
        with opened.engine.begin() as db:
            db.execute(
                text("UPDATE runs SET status = 'cancelled' WHERE status IN ('queued', 'running')")
            )
        clear_batch_runs(opened)
        yield opened


def session_of(store: SqlStore, tenant: str) -> str:
    return store.create_session(
        root="/tmp", metadata={}, token_ceiling=None, tenant=tenant
    ).session_id


def waiting_since(store: SqlStore, turn_id: str, seconds_ago: float) -> None:
    """Make a queued turn look as if it had waited that long."""
    with store.engine.begin() as db:
        db.execute(
            text("UPDATE runs SET waiting_since = :t WHERE turn_id = :turn"),
            {"t": utc_now() - timedelta(seconds=seconds_ago), "turn": turn_id},
        )


def lane_of(store: SqlStore, turn_id: str) -> tuple[str, Any]:
    with store.engine.connect() as db:
        row = db.execute(
            text("SELECT priority, placed_at FROM runs WHERE turn_id = :t"), {"t": turn_id}
        ).one()
    return row.priority, row.placed_at


def test_the_view_counts_each_tenants_turns_running_and_waiting_for_a_worker(
    store: SqlStore,
) -> None:
    flood = [session_of(store, "flood") for _ in range(3)]
    for session_id in flood:
        submit(store, session_id)
    for session_id in flood[:2]:
        start(store, session_id)
    # Queued long enough: waiting for a worker.  Behind its session's running turn, or
    # just submitted: not (yet).
    late, _ = submit(store, flood[2])
    waiting_since(store, late, 10)
    behind, _ = submit(store, flood[0])
    waiting_since(store, behind, 10)
    other = session_of(store, "other")
    fresh, _ = submit(store, other)
    since = utc_now() - timedelta(seconds=2)
    assert store.interactive_load(since) == {"flood": (2, 1)}
    waiting_since(store, fresh, 10)
    assert store.interactive_load(since) == {"flood": (2, 1), "other": (0, 1)}
    assert InteractiveShares(store, weights=dict).held_back() == {"flood"}


def test_a_drive_holding_a_tenant_back_moves_its_fresh_turn_to_the_batch_lane(
    store: SqlStore,
) -> None:
    session_id = session_of(store, "flood")
    turn_id, _ = submit(store, session_id)
    _fence, claim = store.start_drive(
        session_id, worker="w", seq_floor=lambda _t, _f: 0, held_back=frozenset({"flood"})
    )
    assert claim is None
    assert lane_of(store, turn_id) == ("batch", None)
    # The window places it, as its tenant's batch work; then it is claimed.
    assert store.place_batch_runs(4, {}) == [session_id]
    assert start(store, session_id).turn_id == turn_id


def test_another_tenants_turn_and_a_turn_already_started_are_claimed(store: SqlStore) -> None:
    other = session_of(store, "other")
    other_turn, _ = submit(store, other)
    held = frozenset({"flood"})
    _fence, claim = store.start_drive(other, worker="w", seq_floor=lambda _t, _f: 0, held_back=held)
    assert claim is not None and claim[0].turn.turn_id == other_turn
    flood = session_of(store, "flood")
    started_turn, _ = submit(store, flood)
    driving = start(store, flood)  # started before its tenant was held back
    with store.engine.begin() as db:  # (its worker died: queued again, attempts kept)
        db.execute(
            text("UPDATE runs SET status = 'queued' WHERE turn_id = :t"), {"t": started_turn}
        )
    _fence, again = store.start_drive(
        flood, worker="w2", seq_floor=lambda _t, _f: 0, held_back=held
    )
    assert again is not None and again[0].turn.turn_id == driving.turn_id
    assert lane_of(store, started_turn)[0] == "interactive"
