"""Statements on what a turn records: its committed steps and its durable events."""

from __future__ import annotations

from sqlalchemy import func, insert, select

from parley.schemas import tables as t
from parley.schemas.events import EventKind
from parley.store.statements.binds import b

EVENT_COLUMNS = ("turn_id", "seq", "kind", "data")
"""An event row's columns but ``created_at`` (the time of the transaction storing it)."""

INSERT_QUEUED = insert(t.events).values(
    turn_id=b("turn_id"), seq=1, kind=EventKind.QUEUED.value, data=b("data"), created_at=b("now")
)

STEPS_OF_RUNS = (
    select(t.steps.c.run_id, t.steps.c.step_index, t.steps.c.payload)
    .where(t.steps.c.run_id.in_(b("run_ids", expanding=True)))
    .order_by(t.steps.c.run_id, t.steps.c.step_index)
)

EVENTS_AFTER = (
    select(t.events.c.seq, t.events.c.kind, t.events.c.data)
    .where(t.events.c.turn_id == b("turn_id"), t.events.c.seq > b("seq"))
    .order_by(t.events.c.seq)
)

LAST_EVENT_SEQ = select(func.max(t.events.c.seq)).where(t.events.c.turn_id == b("turn_id"))
