"""Batches as the store's tests write them: a batch's plan, its lines, and the states of
their runs that a test sets by hand."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import text

from parley.schemas.batches import BatchRecord, LinePlan, LineRefusal
from parley.store.batch_acceptance import NewBatch
from parley.store.clock import utc_now
from parley.store.ids import new_id
from parley.store.sql_store import SqlStore


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


def create_batch(
    store: SqlStore,
    batch: NewBatch,
    plans: Sequence[LinePlan],
    refusals: Sequence[LineRefusal],
    *,
    chunk: int = 1000,
) -> tuple[BatchRecord, bool]:
    """Accept a batch as a client does: opened, its lines that open sessions and its
    refusals written ``chunk`` at a time, finished with those that continue
    conversations (dropped if that fails).  The batch, and whether this made it (False:
    its request id made one before)."""
    found = store.open_batch(batch)
    if found is not None:
        assert isinstance(found, BatchRecord), found
        return found, False
    opening = [plan for plan in plans if plan.opens_session]
    lines: list[LinePlan | LineRefusal] = [*opening, *refusals]
    try:
        for start in range(0, len(lines), chunk):
            part = lines[start : start + chunk]
            store.accept_lines(
                batch.batch_id,
                batch.tenant,
                [p for p in part if isinstance(p, LinePlan)],
                [r for r in part if isinstance(r, LineRefusal)],
            )
        continuing = [plan for plan in plans if not plan.opens_session]
        return store.finish_batch(batch.batch_id, continuing), True
    except BaseException:
        store.drop_batch(batch.batch_id)
        raise


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


def give_place(store: SqlStore, turn_id: str | None) -> None:
    """Give a batch run its place in the batch window, as the window does (a driver
    claims a batch run only once placed)."""
    with store.engine.begin() as db:
        db.execute(
            text("UPDATE runs SET placed_at = :t WHERE turn_id = :turn"),
            {"t": utc_now(), "turn": turn_id},
        )


def wait_for_capacity(store: SqlStore, turn_id: str | None) -> None:
    """Leave a turn's run as a deferral does: queued, not to start for five minutes."""
    with store.engine.begin() as db:
        db.execute(
            text("UPDATE runs SET status = 'queued', not_before = :t WHERE turn_id = :turn"),
            {"t": utc_now() + timedelta(minutes=5), "turn": turn_id},
        )


def wait_for_an_answer(store: SqlStore, turn_id: str) -> None:
    """Leave a turn's run as an approval does: waiting for a person, holding no driver."""
    with store.engine.begin() as db:
        waiting = text("UPDATE runs SET status = 'waiting' WHERE turn_id = :turn")
        db.execute(waiting, {"turn": turn_id})
