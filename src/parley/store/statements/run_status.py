"""The statuses of a run as the statements test them: in line, running, waiting."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Update, case, or_, update

from parley.schemas import tables as t
from parley.schemas.records import TurnStatus, Waiting
from parley.store.statements.binds import b

QUEUED = TurnStatus.QUEUED.value
RUNNING = TurnStatus.RUNNING.value
WAITING = TurnStatus.WAITING.value
CANCELLED = TurnStatus.CANCELLED.value
ACTIVE = (QUEUED, RUNNING)
UNFINISHED = (*ACTIVE, WAITING)
RESUMABLE = tuple(s.value for s in TurnStatus if s.resumable)
# What a run that waits to be claimed waits for (``runs.waiting_for``).
WAITING_IN_LINE = Waiting.QUEUE.value
WAITING_FOR_CAPACITY = Waiting.CAPACITY.value
WAITING_FOR_APPROVAL = Waiting.APPROVAL.value
WAITING_FOR_AGENTS = Waiting.AGENTS.value
WAITING_FOR_TIME = Waiting.TIME.value
WAITING_FOR_EVENT = Waiting.EVENT.value

# Queued or running, spelt with fixed binds rather than an IN list: SQLAlchemy expands an
# IN list on every execution, while this is the same SQL each time (prepared once, and
# run straight through psycopg; see parley.store.connection).
IS_ACTIVE = or_(t.runs.c.status == QUEUED, t.runs.c.status == RUNNING)
# Not ended: active, or waiting for answers (a waiting run holds its session's place in
# line: the turns after it wait too, though no driver holds the session meanwhile).
IS_UNFINISHED = or_(IS_ACTIVE, t.runs.c.status == WAITING)


def hold_step(waiting_for: str, **more: Any) -> Update:
    """A driver's step waits (for ``waiting_for``: answers, or child agents): the run
    waits, holding its step (fenced by the session row the caller locked, and only while
    it runs), and gives a place it held in the batch window back (it waits for one again
    once what it waits for is in); ``more`` are further values to set."""
    return (
        update(t.runs)
        .where(t.runs.c.id == b("run_id"), t.runs.c.status == RUNNING)
        .values(
            status=WAITING,
            placed_at=None,
            held_step=b("held_step", type_=t.Json),
            waiting_since=b("now"),
            waiting_for=waiting_for,
            **more,
            last_seq=case(
                (t.runs.c.last_seq > b("last_seq"), t.runs.c.last_seq), else_=b("last_seq")
            ),
            worker=None,
        )
    )
