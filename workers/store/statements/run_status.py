"""The statuses of a run as the statements test them: in line, running, waiting."""

from __future__ import annotations

from sqlalchemy import or_

from schemas import tables as t
from schemas.records import TurnStatus, Waiting

QUEUED = TurnStatus.QUEUED.value
RUNNING = TurnStatus.RUNNING.value
WAITING = TurnStatus.WAITING.value
ACTIVE = (QUEUED, RUNNING)
UNFINISHED = (*ACTIVE, WAITING)
RESUMABLE = tuple(s.value for s in TurnStatus if s.resumable)
# What a run that waits to be claimed waits for (``runs.waiting_for``).
WAITING_IN_LINE = Waiting.QUEUE.value
WAITING_FOR_CAPACITY = Waiting.CAPACITY.value
WAITING_FOR_APPROVAL = Waiting.APPROVAL.value

# Queued or running, spelt with fixed binds rather than an IN list: SQLAlchemy expands an
# IN list on every execution, while this is the same SQL each time (prepared once, and
# run straight through psycopg; see workers.store.connection).
IS_ACTIVE = or_(t.runs.c.status == QUEUED, t.runs.c.status == RUNNING)
# Not ended: active, or waiting for answers (a waiting run holds its session's place in
# line: the turns after it wait too, though no driver holds the session meanwhile).
IS_UNFINISHED = or_(IS_ACTIVE, t.runs.c.status == WAITING)
