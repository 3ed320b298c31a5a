"""Statements on the fleet's state: the unfinished work of every session, by status
(``parley status``), whether the database answers, and each table's size."""

from __future__ import annotations

from sqlalchemy import and_, case, exists, func, literal_column, select, text

from parley.schemas import tables as t
from parley.store.statements.binds import b
from parley.store.statements.run_status import (
    IS_UNFINISHED,
    WAITING,
    WAITING_FOR_CAPACITY,
    WAITING_FOR_EVENT,
    WAITING_FOR_TIME,
)

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
        # For a turn waiting for an event: the event (the first its calls wait for) and
        # until when (docs/time.md#waiting-for-an-event).
        t.runs.c.waiting_for,
        t.runs.c.not_before,
        select(func.min(t.event_waits.c.event))
        .where(
            t.event_waits.c.run_id == t.runs.c.id,
            t.event_waits.c.state == literal_column("'waiting'"),
        )
        .scalar_subquery()
        .label("event"),
    )
    .where(t.runs.c.status == b("status"))
    .order_by(t.runs.c.queued_at, t.runs.c.id)
    .limit(b("limit"))
)

# A session's tenant, "" for none.  The "" is SQL text, not a bound parameter: the same
# expression in the select list and in GROUP BY must be the same text for PostgreSQL,
# and two parameters ($1, $5) of one value are not (it refuses the query).
_TENANT = func.coalesce(t.sessions.c.tenant, literal_column("''"))

_WAITING_EVENT = and_(t.runs.c.status == WAITING, t.runs.c.waiting_for == WAITING_FOR_EVENT)

# The unfinished runs by tenant and lane, how many of them wait for provider capacity
# (deferred: docs/admission.md) and for their time (delayed: docs/time.md), and the
# soonest such time: what an operator sees queued for each.
WORK_BY_LANE = (
    select(
        _TENANT.label("tenant"),
        t.runs.c.priority,
        func.count().label("runs"),
        # (A delayed turn's time is not capacity waited for.)
        func.count(case((t.runs.c.waiting_for == WAITING_FOR_CAPACITY, t.runs.c.not_before))).label(
            "deferred"
        ),
        # Delayed turns (docs/time.md) and the soonest of their times.
        func.count(case((t.runs.c.waiting_for == WAITING_FOR_TIME, t.runs.c.not_before))).label(
            "delayed"
        ),
        func.min(case((t.runs.c.waiting_for == WAITING_FOR_TIME, t.runs.c.not_before))).label(
            "next_due"
        ),
        # Turns waiting for an event (docs/time.md#waiting-for-an-event), and the soonest
        # of their deadlines.
        func.count(case((_WAITING_EVENT, t.runs.c.id))).label("waiting_event"),
        func.min(case((_WAITING_EVENT, t.runs.c.not_before))).label("event_deadline"),
    )
    .join(t.sessions, t.sessions.c.id == t.runs.c.session_id)
    .where(IS_UNFINISHED)
    .group_by(_TENANT, t.runs.c.priority)
)

# The turns waiting for provider capacity by tenant and lane, for the metrics every
# sweep: in the words of ix_runs_capacity, which holds only them.
CAPACITY_BY_LANE = (
    select(t.runs.c.tenant, t.runs.c.priority, func.count().label("runs"))
    .where(text(t.CAPACITY_RUN))
    .group_by(t.runs.c.tenant, t.runs.c.priority)
)

# Sub-agents at work (docs/sub-agents.md#9-counts), by kind: child turns queued or
# running, read from ix_runs_active (a child's session names its parent run: one
# primary-key look per active run) ...
_ACTIVE_CHILDREN = (
    select(t.runs.c.status.label("kind"), func.count().label("runs"))
    .where(
        text(t.ACTIVE_RUN),
        exists()
        .where(t.sessions.c.id == t.runs.c.session_id, t.sessions.c.parent_run_id.is_not(None))
        .correlate(t.runs),
    )
    .group_by(t.runs.c.status)
)
# ... and the runs waiting for agents, from ix_runs_agents: parents (their step held
# for their children) and children waiting for a place among their step's.
_AGENT_WAITS = (
    select(
        # SQL text, not binds: the same statement every sweep (and EXPLAIN reads it).
        case(
            (t.runs.c.held_step.is_(None), literal_column("'placing'")),
            else_=literal_column("'parents'"),
        ).label("kind"),
        func.count().label("runs"),
    )
    .where(text(t.AGENT_WAIT_RUN))
    .group_by(literal_column("kind"))
)
AGENT_WORK = _ACTIVE_CHILDREN.union_all(_AGENT_WAITS)

# Whether the database answers now (readiness checks).
PING = select(1)

# Each table's name and the count of its rows (benchmarks and storage checks).
ROW_COUNTS = tuple(
    (table.name, select(func.count()).select_from(table)) for table in t.metadata.sorted_tables
)
