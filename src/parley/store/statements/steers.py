"""Statements on a run's steer inbox: counting a steer while the inbox is open, storing
it, reading those past a cursor."""

from __future__ import annotations

from sqlalchemy import select, update

from parley.schemas import tables as t
from parley.store.statements.binds import b

# Counting a steer only while the inbox is open takes the run row's lock and checks it in
# one statement: a concurrent close either sees the steer or refuses it.
COUNT_STEER = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.inbox_open.is_(True))
    .values(steer_count=t.runs.c.steer_count + 1)
    .returning(t.runs.c.steer_count)
)

INSERT_STEER = t.steers.insert()

PENDING_STEERS = (
    select(t.steers.c.position, t.steers.c.kind, t.steers.c.text)
    .where(t.steers.c.run_id == b("run_id"), t.steers.c.position > b("cursor"))
    .order_by(t.steers.c.position)
)
