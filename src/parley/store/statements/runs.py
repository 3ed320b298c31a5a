"""Statements on a run's row: finding it, the next to drive, its claim, each step's
commit, the inbox close, its end and its resume."""

from __future__ import annotations

from sqlalchemy import Boolean, case, func, insert, literal_column, null, select, text, update

from parley.schemas import tables as t
from parley.store.statements.binds import b
from parley.store.statements.run_status import (
    IS_UNFINISHED,
    QUEUED,
    RUNNING,
    WAITING_FOR_CAPACITY,
    WAITING_FOR_TIME,
    WAITING_IN_LINE,
)

RUN_BY_TURN = select(t.runs).where(t.runs.c.turn_id == b("turn_id"))

LOCK_RUN_BY_TURN = RUN_BY_TURN.with_for_update()

LOCK_RUN = select(t.runs.c.id).where(t.runs.c.id == b("run_id")).with_for_update()

RUN_BY_ID = select(t.runs).where(t.runs.c.id == b("run_id"))

SESSION_OF_TURN = select(t.runs.c.session_id).where(t.runs.c.turn_id == b("turn_id"))

RUN_ID_OF_TURN = select(t.runs.c.id).where(t.runs.c.turn_id == b("turn_id"))

RUN_STATUS = select(t.runs.c.status).where(t.runs.c.id == b("run_id"))

ACTIVE_RUNS = select(t.runs.c.id, t.runs.c.turn_id, t.runs.c.status).where(
    t.runs.c.session_id == b("session_id"), IS_UNFINISHED
)

# The run to drive next, locked: a stranded running one first, then the oldest queued,
# unless a waiting one comes before it (then nothing is runnable: the caller sees it).
NEXT_RUN = (
    select(
        t.runs,
        t.turns.c.parent_id,
        t.turns.c.prompt,
        t.turns.c.request_id,
        t.turns.c.created_at.label("turn_created_at"),
    )
    .join(t.turns, t.turns.c.id == t.runs.c.turn_id)
    .where(t.runs.c.session_id == b("session_id"), IS_UNFINISHED)
    .order_by(case((t.runs.c.status == RUNNING, 0), else_=1), t.runs.c.queue_position)
    .limit(1)
    .with_for_update(of=t.runs)
)

# Every column given, defaults included, so SQLAlchemy has none to fill in per call.
INSERT_RUN = insert(t.runs).values(
    id=b("run_id"),
    turn_id=b("turn_id"),
    session_id=b("session_id"),
    status=QUEUED,
    attempts=0,
    stalled_attempts=0,
    contract=b("contract"),
    host_context=b("host_context", type_=t.Json),
    trace_context=b("trace_context", type_=t.Json),
    waiting_since=b("now"),
    # A delayed turn waits for its time (docs/time.md#delayed-turns), any other for its
    # place in line.
    waiting_for=case(
        (b("not_before", type_=t.runs.c.not_before.type).is_(None), WAITING_IN_LINE),
        else_=WAITING_FOR_TIME,
    ),
    steps=0,
    input_tokens=0,
    output_tokens=0,
    cached_tokens=0,
    steer_count=0,
    steer_cursor=0,
    inbox_open=True,
    last_seq=1,
    # A delayed turn is in line from its time on: the batch window, which reads its
    # queue oldest first, reaches it only then.
    queued_at=func.coalesce(b("not_before", type_=t.runs.c.not_before.type), b("now")),
    queue_position=b("position"),
    priority=b("priority"),
    not_before=b("not_before", type_=t.runs.c.not_before.type),
    # The session's tenant, read in the same statement ("" for none).
    tenant=func.coalesce(
        select(t.sessions.c.tenant).where(t.sessions.c.id == b("session_id")).scalar_subquery(),
        literal_column("''"),
    ),
)

# What a turn spent on a step it threw away (nothing of the step is stored).
CHARGE_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"))
    .values(
        input_tokens=t.runs.c.input_tokens + b("input_tokens"),
        output_tokens=t.runs.c.output_tokens + b("output_tokens"),
        cached_tokens=t.runs.c.cached_tokens + b("cached_tokens"),
    )
)

CLAIM_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"))
    .values(
        status=RUNNING,
        attempts=t.runs.c.attempts + 1,
        stalled_attempts=t.runs.c.stalled_attempts + 1,
        worker=b("worker"),
        started_at=func.coalesce(t.runs.c.started_at, b("now")),
        inbox_open=True,
        last_seq=b("seq"),
        not_before=null(),
    )
)

# What committing a step adds to its run.
_STEP_VALUES = {
    "steps": t.runs.c.steps + 1,
    "input_tokens": t.runs.c.input_tokens + b("input_tokens"),
    "output_tokens": t.runs.c.output_tokens + b("output_tokens"),
    "cached_tokens": t.runs.c.cached_tokens + b("cached_tokens"),
    "steer_cursor": b("cursor"),
    # A committed step is progress: the attempts that count towards giving up start over.
    "stalled_attempts": 0,
    # A step that waited for answers is held no more once it commits.
    "held_step": null(),
}

# The step the caller thinks comes next, of a run that is still running: a replayed or
# stale commit matches nothing.
_NEXT_STEP = (t.runs.c.status == RUNNING, t.runs.c.steps == b("index"))

ADVANCE_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), *_NEXT_STEP)
    .values(
        **_STEP_VALUES,
        last_seq=case((t.runs.c.last_seq > b("last_seq"), t.runs.c.last_seq), else_=b("last_seq")),
        # The model stopped and no steer is pending: close the inbox in the same row
        # update that holds the lock a concurrent say() needs.
        inbox_open=case(
            (
                (b("close", type_=Boolean()) & (t.runs.c.steer_count == b("cursor"))),
                False,
            ),
            else_=t.runs.c.inbox_open,
        ),
    )
    .returning(t.runs.c.steer_count)
)

# A turn that waits for provider capacity lets its session go (docs/admission.md): its
# run is queued again in its place, not to be claimed before ``not_before``, and the
# claim that took it does not count towards giving up (it made no progress, nor failed).
DEFER_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.status == RUNNING)
    .values(
        status=QUEUED,
        not_before=b("not_before"),
        waiting_since=b("now"),
        waiting_for=WAITING_FOR_CAPACITY,
        worker=None,
        stalled_attempts=case(
            (t.runs.c.stalled_attempts > 0, t.runs.c.stalled_attempts - 1), else_=0
        ),
        last_seq=case((t.runs.c.last_seq > b("last_seq"), t.runs.c.last_seq), else_=b("last_seq")),
    )
)

# An interrupt must not wait for the capacity a deferred turn waits for: it is runnable
# at once (its next claim stops it at the boundary).
WAKE_DEFERRED = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.not_before.is_not(None))
    .values(not_before=null())
    .returning(t.runs.c.session_id)
)

# The queued runs whose time has come (a delayed turn's, or the capacity a deferred one
# waited for), oldest first, a bounded number at a time: read from ix_runs_due, which
# holds only runs with a time still ahead of them, so a sweep costs what is due, not
# what waits (docs/time.md#delayed-turns).
_DUE = (
    select(t.runs.c.id)
    .where(
        text(t.DUE_RUN),
        t.runs.c.not_before <= b("now"),
    )
    .order_by(t.runs.c.not_before)
    .limit(b("limit"))
    .scalar_subquery()
)
# Released: their time is cleared, which takes them out of ix_runs_due and puts them
# back among the active runs the sweeper reads (ix_runs_active); ``waiting_for`` stays
# what they waited for, for the wait span of their claim.
RELEASE_DUE = (
    update(t.runs)
    .where(t.runs.c.id.in_(_DUE), text(t.DUE_RUN))
    .values(not_before=null())
    .returning(t.runs.c.session_id, t.runs.c.priority)
)

# The first traced attempt of a run submitted without a trace context gives it its own
# (docs/operations.md#traces); a context already there is kept.
SET_TRACE_CONTEXT = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.trace_context.is_(None))
    .values(trace_context=b("trace_context", type_=t.Json))
)

CLOSE_INBOX = update(t.runs).where(t.runs.c.id == b("run_id")).values(inbox_open=False)

# Closing the inbox first takes the run row's lock for the rest of the turn commit; it
# returns what an earlier attempt's end reported undelivered, which this end keeps.
CLOSE_RUNNING = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.status == RUNNING)
    .values(inbox_open=False)
    .returning(t.runs.c.steer_count, t.runs.c.undelivered)
)

_END_VALUES = {
    "status": b("status"),
    "reply": b("reply"),
    "error": b("error"),
    "partial": b("partial"),
    "steer_cursor": b("cursor"),
    "ended_at": b("now"),
    "last_seq": b("seq"),
}

# ``undelivered``: every say of the run that never reached a committed step, this
# attempt's and those of the attempts before a resume.
END_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"))
    .values(**_END_VALUES, undelivered=b("undelivered", type_=t.Json))
)

# A final step and its turn's end in one row update (one statement where ADVANCE_RUN and
# END_RUN take two), which leaves ``undelivered`` as an earlier attempt's end left it
# (nothing is pending now).  It also requires that no steer was accepted past the cursor: the
# update takes the run row's lock that a concurrent say() needs, so a steer either
# counted before (and this matches nothing) or finds the inbox closed.
END_RUN_WITH_STEP = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), *_NEXT_STEP, t.runs.c.steer_count == b("cursor"))
    .values({**_STEP_VALUES, **_END_VALUES, "inbox_open": False})
)

RESUME_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"))
    .values(
        status=QUEUED,
        # A batch run waits for a place in the batch window again, as a new one does.
        placed_at=None,
        queued_at=b("now"),
        waiting_since=b("now"),
        waiting_for=WAITING_IN_LINE,
        queue_position=b("position"),
        # Whoever resumes a turn that gave up gives it a fresh set of attempts.
        stalled_attempts=0,
        inbox_open=True,
        error=None,
        reply=None,
        last_seq=b("seq"),
    )
)
