"""Statements on schedules and their slots (docs/time.md#schedules)."""

from __future__ import annotations

from sqlalchemy import delete, func, select, update

from parley.schemas import tables as t
from parley.store.statements.binds import b

_s = t.schedules
_r = t.schedule_runs

INSERT_SCHEDULE = _s.insert()

SCHEDULE = select(_s).where(_s.c.id == b("schedule_id"))

ALL_SCHEDULES = select(_s).order_by(_s.c.created_at, _s.c.id)
SCHEDULES_OF_TENANT = ALL_SCHEDULES.where(_s.c.tenant == b("tenant"))

# The schedules whose next slot has come, soonest first: read from ix_schedules_next_at,
# so a look costs what is due, not what waits (a paused one has no next_at).
DUE_SCHEDULES = (
    select(_s.c.id).where(_s.c.next_at <= b("now")).order_by(_s.c.next_at).limit(b("limit"))
)

# The firing's lock on its schedule: a beat that finds it taken leaves it to the one
# holding it (SKIP LOCKED), and finds it no longer due once that one committed.  On
# SQLite, BEGIN IMMEDIATE serialises the writers instead (the FOR UPDATE is not rendered).
LOCK_DUE_SCHEDULE = (
    select(_s)
    .where(_s.c.id == b("schedule_id"), _s.c.next_at <= b("now"))
    .with_for_update(skip_locked=True)
)
LOCK_SCHEDULE = select(_s).where(_s.c.id == b("schedule_id")).with_for_update()

UPDATE_SCHEDULE = update(_s).where(_s.c.id == b("schedule_id"))

# A fired slot's row names its turn once the turn is submitted (in the same transaction),
# or says it was missed after all (its session was gone).
UPDATE_SLOT = (
    update(_r)
    .where(_r.c.schedule_id == b("schedule_id"), _r.c.slot_at == b("slot_at"))
    .values(status=b("status"), turn_id=b("turn_id"), session_id=b("session_id"))
)

DELETE_SCHEDULE_RUNS = delete(_r).where(_r.c.schedule_id == b("schedule_id"))
DELETE_SCHEDULE = delete(_s).where(_s.c.id == b("schedule_id"))

SCHEDULE_RUNS = (
    select(_r)
    .where(_r.c.schedule_id == b("schedule_id"))
    .order_by(_r.c.slot_at.desc())
    .limit(b("limit"))
)

RUN_STATUS_OF_TURN = select(t.runs.c.status).where(t.runs.c.turn_id == b("turn_id"))

# A status view's counts (`parley status`, the metrics): schedules, paused ones, the
# soonest next slot, and the slots missed.
SCHEDULE_COUNTS = select(
    func.count().label("schedules"),
    func.count().filter(_s.c.paused).label("paused"),
    func.min(_s.c.next_at).label("next_at"),
)
MISSED_SLOT_COUNT = select(func.count()).select_from(_r).where(_r.c.status == "missed")
