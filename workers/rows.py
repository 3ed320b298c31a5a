"""Stored rows → frozen records: the one place that knows both shapes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from schemas.records import RunState, SessionRecord, TaskContract, TurnRecord, TurnStatus, Usage


def aware(value: datetime) -> datetime:
    """SQLite hands timestamps back naive; everything parley stores is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def session_record(row: Any) -> SessionRecord:
    """A ``sessions`` row as a record."""
    return SessionRecord(
        session_id=row.id,
        root=row.root,
        metadata=dict(row.metadata),
        head_turn_id=row.head_turn_id,
        token_ceiling=row.token_ceiling,
        tokens_used=row.tokens_used,
        created_at=aware(row.created_at),
    )


def turn_record(row: Any) -> TurnRecord:
    """A ``turns`` row joined with its run (``TURN_COLUMNS``) as a record."""
    return TurnRecord(
        turn_id=row.id,
        session_id=row.session_id,
        parent_id=row.parent_id,
        prompt=row.prompt,
        status=TurnStatus(row.status),
        reply=row.reply,
        run_id=row.run_id,
        request_id=row.request_id,
        created_at=aware(row.created_at),
    )


def run_state_of(run: Any) -> RunState:
    """A ``runs`` row as the engine's run state."""
    return RunState(
        run_id=run.id,
        turn_id=run.turn_id,
        session_id=run.session_id,
        status=TurnStatus(run.status),
        attempts=run.attempts,
        steps=run.steps,
        usage=Usage(
            input_tokens=run.input_tokens,
            output_tokens=run.output_tokens,
            cached_tokens=run.cached_tokens,
        ),
        steer_cursor=run.steer_cursor,
        contract=TaskContract.from_json(run.contract),
        reply=run.reply,
        partial=run.partial,
        error=run.error,
        worker=run.worker,
        undelivered=tuple(run.undelivered or ()),
        queue_position=run.queue_position,
        stalled_attempts=run.stalled_attempts,
    )


def turn_of_next_run(run: Any) -> TurnRecord:
    """The turn of a ``NEXT_RUN`` row (a run row carrying its turn's columns)."""
    return TurnRecord(
        turn_id=run.turn_id,
        session_id=run.session_id,
        parent_id=run.parent_id,
        prompt=run.prompt,
        status=TurnStatus(run.status),
        reply=run.reply,
        run_id=run.id,
        request_id=run.request_id,
        created_at=aware(run.turn_created_at),
    )
