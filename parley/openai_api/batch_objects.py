"""OpenAI's File and Batch objects, and the lines of a batch's output and error files,
as pure functions of what parley stored (docs/batches.md).

An output line is ``{"id", "custom_id", "response": {"status_code": 200, "request_id",
"body": <the Response object>}, "error": null}``, the Response's id its turn's.  An error
line has the same shape with an ``error`` (``code``, ``message``): a line refused at
submission has no response; a line whose turn failed or was cancelled has the Response
it ended with (its status ``failed`` or ``cancelled``).
"""

from __future__ import annotations

from typing import Any

from parley.openai_api.response_objects import stored_response, unix_seconds
from schemas.batches import BatchLine, BatchRecord, BatchStatus, FileRecord
from schemas.records import TurnStatus
from workers.store.batches import RenderedTurn

COMPLETION_WINDOW = "24h"
"""The one completion window OpenAI offers; parley keeps no deadline (a line runs until
it ends), and says so by never expiring a batch."""


def file_object(record: FileRecord) -> dict[str, Any]:
    """The File object."""
    return {
        "id": record.file_id,
        "object": "file",
        "bytes": record.bytes or 0,
        "created_at": unix_seconds(record.created_at),
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def batch_object(record: BatchRecord) -> dict[str, Any]:
    """The Batch object, ``request_counts`` as they stand; ``parley`` adds what the
    counts do not say (lines running, waiting for a person, waiting for capacity)."""
    counts = record.counts
    created = unix_seconds(record.created_at)
    ended = None if record.ended_at is None else unix_seconds(record.ended_at)
    status = record.status
    return {
        "id": record.batch_id,
        "object": "batch",
        "endpoint": record.endpoint,
        "errors": (
            {"object": "list", "data": record.errors} if record.errors is not None else None
        ),
        "input_file_id": record.input_file_id or "",
        "completion_window": record.completion_window,
        "status": status.value,
        "output_file_id": record.output_file_id,
        "error_file_id": record.error_file_id,
        "created_at": created,
        # Lines are accepted as the batch is created: it is in progress from then.
        "in_progress_at": None if status is BatchStatus.FAILED else created,
        "expires_at": None,
        # Its output is written as its lines end: finalizing takes no time.
        "finalizing_at": ended if status is BatchStatus.COMPLETED else None,
        "completed_at": ended if status is BatchStatus.COMPLETED else None,
        "failed_at": ended if status is BatchStatus.FAILED else None,
        "expired_at": None,
        "cancelling_at": (
            None if record.cancelling_at is None else unix_seconds(record.cancelling_at)
        ),
        "cancelled_at": ended if status is BatchStatus.CANCELLED else None,
        "request_counts": counts.to_json(),
        "metadata": record.metadata,
        "parley": {
            "running": counts.running,
            "waiting": counts.waiting,
            "throttled": counts.throttled,
            "queued": counts.queued,
        },
    }


def result_line(batch_id: str, line: BatchLine, turn: RenderedTurn | None) -> dict[str, Any]:
    """A line of the output file (an answered line) or of the error file (a refused,
    failed or cancelled one)."""
    if turn is None:
        refusal = dict(line.error or {})
        return {
            "id": f"batch_req_{batch_id}_{line.line}",
            "custom_id": line.custom_id,
            "response": None,
            "error": {"code": refusal.get("code"), "message": refusal.get("message")},
        }
    body = stored_response(turn.turn, turn.run, turn.steps, approvals=turn.approvals)
    response = {"status_code": 200, "request_id": turn.turn.turn_id, "body": body}
    status = turn.run.status
    error: dict[str, Any] | None = None
    if status in (TurnStatus.FAILED, TurnStatus.CANCELLED):
        error = {
            "code": "failed" if status is TurnStatus.FAILED else "cancelled",
            "message": turn.run.error or f"the turn ended {status.value}",
        }
    return {
        "id": f"batch_req_{turn.turn.turn_id}",
        "custom_id": line.custom_id,
        "response": response,
        "error": error,
    }
