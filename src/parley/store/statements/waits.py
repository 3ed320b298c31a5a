"""Statements on calls that wait for an event (docs/time.md#waiting-for-an-event): the
held step's waits, the signals kept for them, each wait ended once, and the runs whose
deadline has come, read by deadline."""

from __future__ import annotations

from sqlalchemy import case, func, select, text, update

from parley.schemas import tables as t
from parley.store.statements.binds import b
from parley.store.statements.run_status import (
    QUEUED,
    RUNNING,
    WAITING,
    WAITING_FOR_EVENT,
    hold_step,
)

# What becomes of a wait (``event_waits.state``).
WAIT_WAITING = "waiting"
WAIT_SIGNALLED = "signalled"
WAIT_TIMED_OUT = "timed_out"
WAIT_CANCELLED = "cancelled"

w = t.event_waits
s = t.signals

# A driver's step waits for events: the run waits, holding its step, until the soonest
# deadline among its waits (``not_before``, None: no deadline), read by the release
# through ix_runs_wait_due.
HOLD_FOR_EVENT = hold_step(
    WAITING_FOR_EVENT, not_before=b("not_before"), waiting_event=b("waiting_event")
)

# Every wait of the step ended at once (signals kept for it, or an interrupt): the step
# is kept with the run still running, and its driver goes on with it in the same
# attempt (a driver that takes over after a crash goes on with the kept step); the
# events stored with it count towards the run's last seq, as a hold's do.
KEEP_HELD_STEP = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.status == RUNNING)
    .values(
        held_step=b("held_step", type_=t.Json),
        last_seq=case((t.runs.c.last_seq > b("last_seq"), t.runs.c.last_seq), else_=b("last_seq")),
    )
)

INSERT_WAIT = w.insert()
INSERT_SIGNAL = s.insert()

# The oldest signal of a name kept for a run (sent before any wait took it).
KEPT_SIGNAL = (
    select(s.c.id)
    .where(text("wait_id IS NULL"), s.c.run_id == b("run_id"), s.c.name == b("name"))
    .order_by(s.c.sent_at, s.c.id)
    .limit(1)
)

# The first call of a run still waiting for an event of this name, in step and call order.
FIRST_WAITING = (
    select(w.c.id)
    .where(
        text("state = 'waiting'"),
        w.c.run_id == b("run_id"),
        w.c.event == b("name"),
    )
    .order_by(w.c.step_index, w.c.position)
    .limit(1)
)

# A signal delivered to a wait: each is written only from its undelivered, waiting state,
# in the transaction that holds the run row, so a signal wakes one wait, once.
DELIVER_SIGNAL = (
    update(s).where(s.c.id == b("signal_id"), s.c.wait_id.is_(None)).values(wait_id=b("wait_id"))
)
SIGNAL_WAIT = (
    update(w)
    .where(w.c.id == b("wait_id"), w.c.state == WAIT_WAITING)
    .values(state=WAIT_SIGNALLED, signal_id=b("signal_id"), ended_at=b("now"))
)

# The deadline has come: the run's waits whose ``until`` has passed time out.
TIME_OUT_WAITS = (
    update(w)
    .where(
        w.c.run_id == b("run_id"),
        w.c.state == WAIT_WAITING,
        w.c.until.is_not(None),
        w.c.until <= b("now"),
    )
    .values(state=WAIT_TIMED_OUT, ended_at=b("now"))
)

# An interrupt: every wait of the run still waiting is cancelled.
CANCEL_WAITS = (
    update(w)
    .where(w.c.run_id == b("run_id"), w.c.state == WAIT_WAITING)
    .values(state=WAIT_CANCELLED, ended_at=b("now"))
)

# What a run still waits for: how many waits, and the soonest deadline among them.
STILL_WAITING = select(
    func.count().label("left"),
    func.min(w.c.until).label("until"),
    func.min(w.c.event).label("event"),
).where(w.c.run_id == b("run_id"), w.c.state == WAIT_WAITING)

# Nothing left to wait for: the run is runnable again, in its place in the session's
# line (its deadline cleared: it leaves ix_runs_wait_due); ``waiting_for`` stays
# ``event``, for the wait span of its next claim, as an answered run's stays ``approval``.
REQUEUE_WAITED = (
    update(t.runs)
    .where(
        t.runs.c.id == b("run_id"),
        t.runs.c.status == WAITING,
        t.runs.c.waiting_for == WAITING_FOR_EVENT,
    )
    .values(status=QUEUED, not_before=None, waiting_event=None)
    .returning(t.runs.c.session_id, t.runs.c.priority)
)

# Some waits timed out and others still wait: the run's deadline moves to their soonest.
MOVE_DEADLINE = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.status == WAITING)
    .values(not_before=b("not_before"), waiting_event=b("waiting_event"))
)

# The runs waiting for an event whose deadline has come, oldest first, a bounded number
# at a time, read from ix_runs_wait_due: a sweep costs what is due, not what waits.
DUE_WAITS = (
    select(t.runs.c.id)
    .where(text(t.WAIT_DUE_RUN), t.runs.c.not_before <= b("now"))
    .order_by(t.runs.c.not_before)
    .limit(b("limit"))
)

# A run's waits, with the payload of the signal that ended each (the held step's driver
# gives each waiting call its result from these).
WAITS_OF_STEP = (
    select(w, s.c.payload, s.c.name.label("signal_name"))
    .select_from(w.outerjoin(s, s.c.id == w.c.signal_id))
    .where(w.c.run_id == b("run_id"), w.c.step_index == b("step"))
    .order_by(w.c.position)
)

# Turns waiting for an event, per tenant (the metrics, every sweep): in the words of
# ix_runs_waiting_event, which holds only them.
WAITING_FOR_EVENTS = (
    select(
        t.runs.c.tenant,
        func.count().label("waiting"),
        func.min(t.runs.c.not_before).label("until"),
    )
    .where(text(t.EVENT_RUN))
    .group_by(t.runs.c.tenant)
)
