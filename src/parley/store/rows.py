"""Stored rows → frozen records: the one place that knows both shapes, and the reads
(by name) that the client-facing side of the store and the driver's protocol share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from parley.ports.backend import CommittedStep
from parley.schemas.errors import SessionNotFound, TurnNotFound
from parley.schemas.events import Event
from parley.schemas.messages import StepPayload
from parley.schemas.records import (
    Approval,
    Decision,
    RunState,
    SessionRecord,
    Steer,
    SteerKind,
    TaskContract,
    TurnRecord,
    TurnStatus,
    Usage,
    Waiting,
)
from parley.store import statements as q
from parley.store.connection import StoreConnection


def aware(value: datetime) -> datetime:
    """SQLite hands timestamps back naive; everything parley stores is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(frozen=True, kw_only=True)
class SessionRow:
    """A ``sessions`` row as the driver's protocol reads it (all its columns)."""

    id: str
    root: str
    metadata: dict[str, Any]
    head_turn_id: str | None
    fence: int
    turn_count: int
    tokens_used: int
    token_ceiling: int | None
    prefix_generation: int
    created_at: datetime
    tenant: str | None = None
    retention_seconds: int | None = None
    webhook_url: str | None = None
    last_active_at: datetime | None = None
    title: str | None = None
    batch_id: str | None = None
    parent_run_id: str | None = None
    parent_step: int | None = None
    parent_call_id: str | None = None
    parent_turn_id: str | None = None
    agent: str | None = None
    replay_of: str | None = None
    compacted: bool = False
    pushes: bool = False

    @classmethod
    def of(cls, row: Any) -> SessionRow:
        """A row (or a mapping of its columns) of any statement returning them."""
        values = row if isinstance(row, Mapping) else row._mapping
        return cls(**{name: values[name] for name in q.SESSION_COLUMNS})


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
        tenant=row.tenant,
        retention=(
            None if row.retention_seconds is None else timedelta(seconds=row.retention_seconds)
        ),
        webhook_url=row.webhook_url,
        last_active_at=_aware_or_none(row.last_active_at),
        title=row.title,
        batch_id=row.batch_id,
        parent_turn_id=row.parent_turn_id,
        parent_call_id=row.parent_call_id,
        agent=row.agent,
        replay_of=row.replay_of,
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
        not_before=_aware_or_none(row.not_before),
        waiting_for=shown_waiting(row.status, row.waiting_for, row.not_before),
        waiting_event=_shown_event(row),
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
        held_step=getattr(run, "held_step", None),
        approval_count=getattr(run, "approval_count", 0),
        ended_at=_aware_or_none(run.ended_at),
        host_context=dict(getattr(run, "host_context", None) or {}),
        priority=getattr(run, "priority", None) or "interactive",
        trace_context=getattr(run, "trace_context", None),
        waiting_since=_aware_or_none(getattr(run, "waiting_since", None)),
        waiting_for=_waiting(getattr(run, "waiting_for", None)),
        not_before=_aware_or_none(getattr(run, "not_before", None)),
    )


def _shown_event(row: Any) -> str | None:
    """The event a turn waits for, while it waits for one (docs/time.md#waiting-for-an-event)."""
    if row.status != TurnStatus.WAITING or row.waiting_for != Waiting.EVENT:
        return None
    return getattr(row, "waiting_event", None)


def shown_waiting(status: str, value: str | None, not_before: Any = None) -> Waiting | None:
    """What a turn of run ``status`` waits for, as its record shows it: None unless it is
    queued or waiting, and for a run only in line (its place is not a thing it waits
    for the way a time, an answer or capacity is), as is one whose time came (its
    ``not_before`` released: it is in line now)."""
    waiting = _waiting(value)
    if status not in (TurnStatus.QUEUED, TurnStatus.WAITING) or waiting is Waiting.QUEUE:
        return None
    if waiting is Waiting.EVENT and status != TurnStatus.WAITING:
        return None  # its wait ended: it is in line now
    if waiting in _TIMED and not_before is None:
        return None
    return waiting


# What a queued run waits for until a time (its ``not_before``).
_TIMED = (Waiting.TIME, Waiting.CAPACITY)


def _waiting(value: str | None) -> Waiting | None:
    return Waiting(value) if value is not None and value in Waiting._value2member_map_ else None


def _aware_or_none(value: datetime | None) -> datetime | None:
    """:func:`aware`, of a timestamp that may be missing."""
    return aware(value) if value is not None else None


def approval_of(row: Any) -> Approval:
    """An ``approvals`` row as a record."""
    return Approval(
        approval_id=row.id,
        turn_id=row.turn_id,
        step=row.step_index,
        call_id=row.call_id,
        tool=row.tool,
        arguments=dict(row.arguments),
        accesses=tuple(dict(a) for a in row.accesses),
        requested_at=aware(row.requested_at),
        expires_at=_aware_or_none(row.expires_at),
        decision=Decision(row.decision) if row.decision else None,
        reason=row.reason,
        decided_at=_aware_or_none(row.decided_at),
    )


def read_approvals(db: StoreConnection, turn_id: str) -> tuple[Approval, ...]:
    """Every call of a turn that asked for an answer, in step and call order."""
    return tuple(approval_of(r) for r in db.execute(q.APPROVALS_OF_TURN, {"b_turn_id": turn_id}))


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
        not_before=_aware_or_none(run.not_before),
        waiting_for=shown_waiting(run.status, run.waiting_for, run.not_before),
        waiting_event=_shown_event(run),
    )


# ---------------------------------------------------------------------------- shared reads
# The statements the client-facing side and the driver's protocol both run, by name.


def read_session(db: StoreConnection, session_id: str) -> SessionRecord:
    """The stored session; :class:`SessionNotFound` if unknown."""
    row = db.execute(q.SESSION, {"b_session_id": session_id}).one_or_none()
    if row is None:
        raise SessionNotFound(f"no session {session_id!r}")
    return session_record(row)


def read_turn(db: StoreConnection, turn_id: str) -> TurnRecord:
    """One turn; :class:`TurnNotFound` if unknown."""
    row = db.execute(q.TURN, {"b_turn_id": turn_id}).one_or_none()
    if row is None:
        raise TurnNotFound(f"no turn {turn_id!r}")
    return turn_record(row)


def read_path(db: StoreConnection, head: str | None) -> list[TurnRecord]:
    """The turns from the root to ``head`` (none without a head)."""
    if head is None:
        return []
    return [turn_record(row) for row in db.execute(q.PATH, {"b_head": head}).all()]


def read_steps(db: StoreConnection, run_ids: Sequence[str]) -> dict[str, list[CommittedStep]]:
    """The committed steps of each run, in order (runs without any are absent)."""
    found: dict[str, list[CommittedStep]] = {}
    if not run_ids:
        return found
    for row in db.execute(q.STEPS_OF_RUNS, {"b_run_ids": list(run_ids)}).all():
        found.setdefault(row.run_id, []).append(
            CommittedStep(index=row.step_index, payload=StepPayload.from_json(row.payload))
        )
    return found


def read_pending(db: StoreConnection, run_id: str, cursor: int) -> tuple[Steer, ...]:
    """The steers of a run accepted after ``cursor``, in position order."""
    rows = db.execute(q.PENDING_STEERS, {"b_run_id": run_id, "b_cursor": cursor}).all()
    return tuple(Steer(position=r.position, kind=SteerKind(r.kind), text=r.text) for r in rows)


def event_row(event: Event) -> dict[str, Any]:
    """An event's row, but ``created_at`` (see ``statements.EVENT_COLUMNS``)."""
    return {
        "turn_id": event.turn_id,
        "seq": event.seq,
        "kind": event.kind.value,
        "data": event.data,
    }


def write_events(
    db: StoreConnection,
    statements: q.DialectStatements,
    events: Sequence[Event],
    now: datetime,
) -> None:
    """Store the durable ones of ``events`` (tokens are never stored)."""
    durable = [{**event_row(e), "created_at": now} for e in events if e.kind.durable]
    if durable:
        db.execute(statements.insert_events, durable)


def insert_step(
    db: StoreConnection,
    statements: q.DialectStatements,
    run_id: str,
    index: int,
    payload: StepPayload,
    now: datetime,
) -> None:
    """Store a committed step (a retried commit that finds it stored changes nothing)."""
    db.execute(
        statements.insert_step,
        {"run_id": run_id, "step_index": index, "payload": payload.to_json(), "created_at": now},
    )
