"""Batches as the store's tests write them: a batch's plan, its lines, and the states of
their runs that a test sets by hand."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import text

from schemas.batches import LinePlan
from workers.store.batches import NewBatch
from workers.store.clock import utc_now
from workers.store.ids import new_id
from workers.store.sql_store import SqlStore


def new_batch(tenant: str | None = "acme", request_id: str | None = None) -> NewBatch:
    hexes = [uuid.uuid4().hex for _ in range(3)]
    return NewBatch(
        batch_id=f"batch_{hexes[0]}",
        tenant=tenant,
        input_file_id=None,
        output_file_id=f"file-{hexes[1]}",
        error_file_id=f"file-{hexes[2]}",
        endpoint="/v1/responses",
        completion_window="24h",
        metadata={"job": "tickets"},
        request_id=request_id,
    )


def opening(n: int, root: str = "/tmp") -> LinePlan:
    """Line ``n``, opening a session of its own."""
    return LinePlan(line=n, custom_id=f"c{n}", prompt=f"ticket {n}", session_id=new_id(), root=root)


def clear_batch_runs(store: SqlStore) -> None:
    """End every queued or running batch run an earlier test left in the database."""
    with store.engine.begin() as db:
        db.execute(
            text(
                "UPDATE runs SET status = 'cancelled' WHERE priority = 'batch' "
                "AND status IN ('queued', 'running')"
            )
        )


def wait_for_capacity(store: SqlStore, turn_id: str | None) -> None:
    """Leave a turn's run as a deferral does: queued, not to start for five minutes."""
    with store.engine.begin() as db:
        db.execute(
            text("UPDATE runs SET status = 'queued', not_before = :t WHERE turn_id = :turn"),
            {"t": utc_now() + timedelta(minutes=5), "turn": turn_id},
        )
