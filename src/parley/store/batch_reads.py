"""A batch as read (docs/batches.md): its row, and its counts, usage and model read from
its lines' runs in one pass, never kept on its row (no turn's end touches a batch).  A
batch of 100,000 lines is read on every poll of it: the counts and the usage are one
grouped query over its lines, and the model one row, read only once a line has run."""

from __future__ import annotations

from typing import Any

from parley.schemas.batches import (
    ANSWERED,
    UNANSWERED,
    BatchCounts,
    BatchRecord,
    BatchStatus,
    Endpoint,
)
from parley.schemas.errors import BatchNotFound
from parley.schemas.records import TurnStatus, Usage
from parley.store import statements as q
from parley.store.clock import utc_now
from parley.store.connection import StoreConnection
from parley.store.rows import aware
from parley.store.statements import batches as bq


def accepted_batch(db: StoreConnection, batch_id: str) -> Any:
    """The row of the batch ``batch_id``; :class:`BatchNotFound` if there is none, or it
    is still being accepted (no reader sees a batch half accepted)."""
    row = db.execute(bq.BATCH, {"b_batch_id": batch_id}).one_or_none()
    if row is None or row.status in bq.UNACCEPTED:
        raise BatchNotFound(f"no batch {batch_id!r}")
    return row


def read_batch(db: StoreConnection, batch_id: str) -> BatchRecord:
    """The batch with its counts, usage and model as they stand; :class:`BatchNotFound`
    if there is none."""
    row = accepted_batch(db, batch_id)
    tally: dict[str, int] = {}
    usage = Usage()
    ran = False  # whether any line has left the queue (a refused one never joined it)
    for count in db.execute(bq.BATCH_COUNTS, {"b_batch_id": batch_id, "b_now": utc_now()}):
        key = _count_key(count.status, bool(count.throttled), bool(count.agents))
        tally[key] = tally.get(key, 0) + int(count.lines)
        if key == "running" and count.status == TurnStatus.WAITING.value:
            tally["awaiting_agents"] = tally.get("awaiting_agents", 0) + int(count.lines)
        status = None if count.status is None else TurnStatus(count.status)
        ran = ran or (status is not None and status is not TurnStatus.QUEUED)
        if status is not None and status.terminal:
            usage += Usage(
                input_tokens=int(count.input_tokens),
                output_tokens=int(count.output_tokens),
                cached_tokens=int(count.cached_tokens),
            )
    if tally.get("awaiting_agents"):
        # Their trees' child turns, read only while a line waits for its agents.
        tally.update(_children(db, batch_id))
    return _batch_record(
        row,
        BatchCounts(total=row.total, **tally),
        usage,
        # Read only once a line has run: before, it would walk every line to find none.
        _model(db, batch_id) if ran else None,
    )


def _model(db: StoreConnection, batch_id: str) -> str | None:
    payload = db.execute(bq.BATCH_MODEL, {"b_batch_id": batch_id}).scalar_one_or_none()
    if payload is None:
        return None
    return str(payload.get("model") or "") or None


def _children(db: StoreConnection, batch_id: str) -> dict[str, int]:
    """The child turns under the batch's lines that wait for their agents: running, and
    not running (queued, or waiting)."""
    counts = {
        TurnStatus(row.status): int(row.runs)
        for row in db.execute(q.BATCH_CHILDREN, {"b_batch_id": batch_id})
    }
    running = counts.pop(TurnStatus.RUNNING, 0)
    return {"agents_running": running, "agents_waiting": sum(counts.values())}


def _count_key(status: str | None, throttled: bool, agents: bool = False) -> str:
    """Which of :class:`BatchCounts`' fields a line of run ``status`` counts in: a line
    whose turn waits for its agent calls' child turns is running (its work runs in
    them; ``waiting`` is for a person's answer)."""
    if status is None:
        return "failed"  # refused at submission
    turn_status = TurnStatus(status)
    if turn_status in ANSWERED:
        return "completed"
    if turn_status in UNANSWERED:
        return "failed"
    if turn_status is TurnStatus.QUEUED:
        return "throttled" if throttled else "queued"
    if turn_status is TurnStatus.RUNNING or agents:
        return "running"
    return "waiting"


def _batch_record(row: Any, counts: BatchCounts, usage: Usage, model: str | None) -> BatchRecord:
    return BatchRecord(
        batch_id=row.id,
        tenant=row.tenant,
        input_file_id=row.input_file_id,
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        endpoint=Endpoint(row.endpoint),
        completion_window=row.completion_window,
        metadata=row.metadata,
        request_id=row.request_id,
        status=BatchStatus(row.status),
        errors=row.errors,
        created_at=aware(row.created_at),
        cancelling_at=None if row.cancelling_at is None else aware(row.cancelling_at),
        ended_at=None if row.ended_at is None else aware(row.ended_at),
        counts=counts,
        usage=usage,
        model=model,
    )
