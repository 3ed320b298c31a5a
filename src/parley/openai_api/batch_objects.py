"""OpenAI's File and Batch objects, and the lines of a batch's output and error files,
as pure functions of what parley stored (docs/batches.md).

An output line is ``{"id", "custom_id", "response": {"status_code": 200, "request_id",
"body": <the Response object, or the chat.completion>}, "error": null}``, its body's id
its turn's.  An error line has the same shape with an ``error`` (``code``, ``message``):
a line refused at submission has no response, nor has a cancelled one (as OpenAI's
lines the batch's cancel stopped: ``batch_cancelled``); a line whose turn failed has the
response its endpoint gives a failed request: the Response (status ``failed``, as
``POST /v1/responses`` answers it), or a chat completion's ``500`` and its error.
"""

from __future__ import annotations

from typing import Any

from parley.openai_api.chat_objects import chat_completion, chat_failure
from parley.openai_api.response_objects import stored_response, unix_seconds, usage_object
from parley.schemas.batches import (
    BatchHeader,
    BatchLine,
    BatchRecord,
    BatchStatus,
    Endpoint,
    FileRecord,
)
from parley.schemas.records import TurnStatus
from parley.store.batches import RenderedTurn

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
    """The Batch object, ``request_counts`` as they stand, ``usage`` what the ended
    lines spent, ``model`` the one that ran them (None until a line has run);
    ``parley`` adds what the counts do not say (lines running, waiting for a person,
    waiting for capacity)."""
    counts = record.counts
    created = unix_seconds(record.created_at)
    ended = None if record.ended_at is None else unix_seconds(record.ended_at)
    status = record.status
    return {
        "id": record.batch_id,
        "object": "batch",
        "endpoint": record.endpoint.value,
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
        "model": record.model,
        "usage": usage_object(record.usage),
        "parley": {
            "running": counts.running,
            "waiting": counts.waiting,
            "throttled": counts.throttled,
            "queued": counts.queued,
            # The child turns under the lines (docs/sub-agents.md): turns, not lines.
            "agents": {"running": counts.agents_running, "waiting": counts.agents_waiting},
        },
    }


def result_line(batch: BatchHeader, line: BatchLine, turn: RenderedTurn | None) -> dict[str, Any]:
    """A line of the output file (an answered line) or of the error file (a refused,
    failed or cancelled one)."""
    if turn is None:
        refusal = dict(line.error or {})
        return {
            "id": f"batch_req_{batch.batch_id}_{line.line}",
            "custom_id": line.custom_id,
            "response": None,
            "error": {"code": refusal.get("code"), "message": refusal.get("message")},
        }
    turn_id, run = turn.turn.turn_id, turn.run
    if run.status is TurnStatus.CANCELLED:
        return {
            "id": f"batch_req_{turn_id}",
            "custom_id": line.custom_id,
            "response": None,
            "error": cancelled_error(batch, turn),
        }
    failed = run.status is TurnStatus.FAILED
    if batch.endpoint is Endpoint.CHAT_COMPLETIONS:
        status_code = 500 if failed else 200
        body = chat_failure(run) if failed else chat_completion(turn.turn, run, turn.steps)
    else:
        status_code = 200  # as POST /v1/responses answers a failed turn: its Response
        body = stored_response(turn.turn, run, turn.steps, approvals=turn.approvals)
    return {
        "id": f"batch_req_{turn_id}",
        "custom_id": line.custom_id,
        "response": {"status_code": status_code, "request_id": turn_id, "body": body},
        "error": (
            {"code": "failed", "message": run.error or "the turn failed"} if failed else None
        ),
    }


def cancelled_error(batch: BatchHeader, turn: RenderedTurn) -> dict[str, Any]:
    """Why a cancelled line has no response: the batch's cancel stopped it (OpenAI's
    ``batch_cancelled``), or its turn was interrupted on its own (``cancelled``); and
    what it committed before it stopped, which its response (the turn id) shows."""
    run, turn_id = turn.run, turn.turn.turn_id
    ended = run.ended_at
    by_batch = batch.cancelling_at is not None and (ended is None or ended >= batch.cancelling_at)
    cause = "the batch was cancelled" if by_batch else f"turn {turn_id} was interrupted"
    if run.steps == 0:
        message = f"{cause} before this line committed anything"
    else:
        message = (
            f"{cause} while this line ran: it stopped after {run.steps} committed "
            f"step(s), which response {turn_id} shows"
        )
    return {"code": "batch_cancelled" if by_batch else "cancelled", "message": message}
