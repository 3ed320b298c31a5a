"""Statements that store an imported conversation as a session's first turns."""

from __future__ import annotations

from sqlalchemy import insert, select, update

from parley.schemas import tables as t
from parley.store.statements.binds import b

SEED_TURN = insert(t.turns)
SEED_RUN = insert(t.runs)
INSERT_SEED = insert(t.seeds)
SEED_OF_SESSION = select(t.seeds).where(t.seeds.c.session_id == b("session_id"))
# The seeded turns ended as they were stored: the session's newest activity.
SET_TURN_COUNT = (
    update(t.sessions)
    .where(t.sessions.c.id == b("session_id"))
    .values(turn_count=b("count"), last_active_at=b("now"))
)
