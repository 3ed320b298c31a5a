"""Statements on the fleet's state: the unfinished work of every session, by status
(``parley status``), whether the database answers, and each table's size."""

from __future__ import annotations

from sqlalchemy import func, literal_column, select

from schemas import tables as t
from workers.store.statements.binds import b
from workers.store.statements.run_status import IS_UNFINISHED

# How many runs are queued, running and waiting, and the oldest ``queued_at`` of each:
# the unfinished work of every session (``parley status``).
UNFINISHED_BY_STATUS = (
    select(
        t.runs.c.status,
        func.count().label("runs"),
        func.min(t.runs.c.queued_at).label("oldest"),
    )
    .where(IS_UNFINISHED)
    .group_by(t.runs.c.status)
)

# The runs of one unfinished status, oldest in line first, at most ``limit``; a waiting
# one with the time its oldest unanswered call asked.
UNFINISHED_OF_STATUS = (
    select(
        t.runs.c.turn_id,
        t.runs.c.session_id,
        t.runs.c.status,
        t.runs.c.worker,
        t.runs.c.steps,
        t.runs.c.attempts,
        t.runs.c.queued_at,
        t.runs.c.started_at,
        select(func.min(t.approvals.c.requested_at))
        .where(t.approvals.c.run_id == t.runs.c.id, t.approvals.c.decision.is_(None))
        .scalar_subquery()
        .label("asked_at"),
    )
    .where(t.runs.c.status == b("status"))
    .order_by(t.runs.c.queued_at, t.runs.c.id)
    .limit(b("limit"))
)

# A session's tenant, "" for none.  The "" is SQL text, not a bound parameter: the same
# expression in the select list and in GROUP BY must be the same text for PostgreSQL,
# and two parameters ($1, $5) of one value are not (it refuses the query).
_TENANT = func.coalesce(t.sessions.c.tenant, literal_column("''"))

# The unfinished runs by tenant and lane, and how many of them wait for provider
# capacity (deferred: docs/admission.md): what an operator sees queued for each.
WORK_BY_LANE = (
    select(
        _TENANT.label("tenant"),
        t.runs.c.priority,
        func.count().label("runs"),
        func.count(t.runs.c.not_before).label("deferred"),
    )
    .join(t.sessions, t.sessions.c.id == t.runs.c.session_id)
    .where(IS_UNFINISHED)
    .group_by(_TENANT, t.runs.c.priority)
)

# Whether the database answers now (readiness checks).
PING = select(1)

# Each table's name and the count of its rows (benchmarks and storage checks).
ROW_COUNTS = tuple(
    (table.name, select(func.count()).select_from(table)) for table in t.metadata.sorted_tables
)
