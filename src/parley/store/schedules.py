"""The store's side of schedules (docs/time.md#schedules): keeping them, and firing each
due slot exactly once fleet-wide.

A slot fires in one transaction that locks its schedule, claims the slot by inserting
its ``schedule_runs`` row (``ON CONFLICT DO NOTHING``: a row already there means the slot
was dealt with, and nothing is done again), submits the slot's turn (opening its session
if the schedule has none) or records it skipped or missed, and moves ``next_at`` to the
next slot.  Two beats, a beat killed before its commit, a database that restarts: the
slot's row and its turn commit together or not at all, so a slot fires once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from parley.schemas.cron_slots import next_slot, zone_of
from parley.schemas.errors import InvalidRequest, ScheduleNotFound, SessionNotFound
from parley.schemas.events import Event
from parley.schemas.records import IfBusy, SessionRecord, Steer
from parley.schemas.schedules import (
    Overlap,
    ScheduleRecord,
    ScheduleRun,
    SlotStatus,
)
from parley.store import statements as q
from parley.store.approvals import Answered
from parley.store.clock import utc_now
from parley.store.connection import StoreConnection, Transactions
from parley.store.ids import new_id
from parley.store.rows import aware, read_session
from parley.store.sessions import insert_session
from parley.store.submissions import SubmissionStore

SLOTS_PER_TRANSACTION = 100
"""Slots one firing deals with at most (a schedule that missed a week of minutes is
recorded over several transactions, each short)."""


@dataclass(frozen=True, kw_only=True)
class Firing:
    """A slot's turn, committed: what its caller publishes and kicks."""

    schedule_id: str
    slot_at: datetime
    session_id: str
    turn_id: str
    priority: str
    queued: Event | None
    interrupted: tuple[tuple[str, Steer], ...] = ()
    denied: tuple[Answered, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Fired:
    """What one firing transaction did to a schedule's due slots."""

    firings: tuple[Firing, ...]
    skipped: int
    missed: int


@dataclass(frozen=True, kw_only=True)
class ScheduleCounts:
    """The schedules of the store at a glance (``parley status``, the metrics)."""

    schedules: int
    paused: int
    next_at: datetime | None
    missed: int


class ScheduleStore:
    """Schedules and the firing of their slots (see the module docstring)."""

    def __init__(self, db: Transactions, submissions: SubmissionStore) -> None:
        self._db = db
        self._submissions = submissions

    # ------------------------------------------------------------------ keeping them

    def create_schedule(  # noqa: PLR0913 (the schedule's parts, by keyword, as asked)
        self,
        *,
        cron: str,
        timezone: str,
        prompt: str,
        session_id: str | None,
        root: str | None,
        tenant: str | None,
        priority: str,
        overlap: Overlap,
        name: str | None,
        misfire_grace_seconds: int,
    ) -> ScheduleRecord:
        """Store a schedule whose first slot is the first after now.  With
        ``session_id``, that session must exist and be the tenant's
        (:class:`SessionNotFound`); its tenant is the schedule's when none is given."""
        now = utc_now()
        with self._db.tx() as db:
            if session_id is not None:
                session = _tenants_session(db, session_id, tenant)
                tenant = session.tenant if tenant is None else tenant
            record = ScheduleRecord(
                schedule_id=new_id(),
                tenant=tenant,
                name=name,
                cron=cron,
                timezone=timezone,
                prompt=prompt,
                session_id=session_id,
                root=root,
                priority=priority,
                overlap=overlap,
                paused=False,
                misfire_grace_seconds=misfire_grace_seconds,
                next_at=next_slot(cron, zone_of(timezone), now),
                last_turn_id=None,
                created_at=now,
            )
            db.execute(q.INSERT_SCHEDULE, _schedule_row(record))
        return record

    def get_schedule(self, schedule_id: str, tenant: str | None = None) -> ScheduleRecord:
        """The schedule ``schedule_id`` (of ``tenant``, if given); else
        :class:`ScheduleNotFound`."""
        return self._db.reading(lambda db: _read_schedule(db, schedule_id, tenant))

    def list_schedules(self, tenant: str | None = None) -> list[ScheduleRecord]:
        """Every schedule (``tenant``'s only, if given), oldest first."""

        def read(db: StoreConnection) -> list[ScheduleRecord]:
            if tenant is None:
                return [_record(row) for row in db.execute(q.ALL_SCHEDULES)]
            rows = db.execute(q.SCHEDULES_OF_TENANT, {"b_tenant": tenant})
            return [_record(row) for row in rows]

        return self._db.reading(read)

    def update_schedule(
        self,
        schedule_id: str,
        *,
        tenant: str | None = None,
        cron: str | None = None,
        timezone: str | None = None,
        prompt: str | None = None,
        overlap: Overlap | None = None,
        paused: bool | None = None,
    ) -> ScheduleRecord:
        """Change a schedule (the parts given; each already checked).  Its next slot is
        the first after now by its (new) cron and zone, or none while paused: a change
        never fires a slot that has passed."""
        with self._db.tx() as db:
            current = _read_schedule(db, schedule_id, tenant, q.LOCK_SCHEDULE)
            changed = replace(
                current,
                cron=current.cron if cron is None else cron,
                timezone=current.timezone if timezone is None else timezone,
                prompt=current.prompt if prompt is None else prompt,
                overlap=current.overlap if overlap is None else overlap,
                paused=current.paused if paused is None else paused,
            )
            timing = (changed.cron, changed.timezone, changed.paused)
            if timing != (current.cron, current.timezone, current.paused):
                next_at = (
                    None
                    if changed.paused
                    else next_slot(changed.cron, zone_of(changed.timezone), utc_now())
                )
                changed = replace(changed, next_at=next_at)
            db.execute(
                q.UPDATE_SCHEDULE.values(
                    cron=changed.cron,
                    timezone=changed.timezone,
                    prompt=changed.prompt,
                    overlap=changed.overlap.value,
                    paused=changed.paused,
                    next_at=changed.next_at,
                ),
                {"b_schedule_id": schedule_id},
            )
        return changed

    def delete_schedule(self, schedule_id: str, tenant: str | None = None) -> None:
        """Delete a schedule and the record of its slots (its turns stay); else
        :class:`ScheduleNotFound`."""
        with self._db.tx() as db:
            _read_schedule(db, schedule_id, tenant, q.LOCK_SCHEDULE)
            db.execute(q.DELETE_SCHEDULE_RUNS, {"b_schedule_id": schedule_id})
            db.execute(q.DELETE_SCHEDULE, {"b_schedule_id": schedule_id})

    def schedule_runs(
        self, schedule_id: str, tenant: str | None = None, limit: int = 100
    ) -> list[ScheduleRun]:
        """A schedule's slots dealt with, the last ``limit`` of them, oldest first."""

        def read(db: StoreConnection) -> list[ScheduleRun]:
            _read_schedule(db, schedule_id, tenant)
            rows = db.execute(q.SCHEDULE_RUNS, {"b_schedule_id": schedule_id, "b_limit": limit})
            return [
                ScheduleRun(
                    at=aware(row.slot_at),
                    status=SlotStatus(row.status),
                    turn_id=row.turn_id,
                    session_id=row.session_id,
                    recorded_at=aware(row.recorded_at),
                )
                for row in reversed(list(rows))  # (read newest first: the last ones)
            ]

        return self._db.reading(read)

    def schedule_counts(self) -> ScheduleCounts:
        """How many schedules there are, paused, the soonest slot, and the slots missed."""

        def read(db: StoreConnection) -> ScheduleCounts:
            row = db.execute(q.SCHEDULE_COUNTS).one()
            missed = db.execute(q.MISSED_SLOT_COUNT).scalar_one()
            return ScheduleCounts(
                schedules=int(row.schedules),
                paused=int(row.paused),
                next_at=None if row.next_at is None else aware(row.next_at),
                missed=int(missed),
            )

        return self._db.reading(read)

    # ----------------------------------------------------------------------- firing

    def due_schedules(self, limit: int = 100) -> list[str]:
        """The schedules whose next slot has come, soonest first (from the index on
        ``next_at``: the look costs what is due, not what waits)."""
        return self._db.reading(
            lambda db: list(
                db.execute(q.DUE_SCHEDULES, {"b_now": utc_now(), "b_limit": limit}).scalars()
            )
        )

    def fire_schedule(
        self, schedule_id: str, trace_context: dict[str, str] | None = None
    ) -> Fired | None:
        """Deal with the due slots of ``schedule_id`` (at most
        ``SLOTS_PER_TRANSACTION``) in one transaction (the module docstring); None if
        it is not due, or another beat holds it.  ``trace_context`` is stored with the
        turns fired, which join the firing's trace."""
        with self._db.tx() as db:
            now = utc_now()
            row = db.execute(
                q.LOCK_DUE_SCHEDULE, {"b_schedule_id": schedule_id, "b_now": now}
            ).one_or_none()
            if row is None:
                return None
            firer = _Firer(self._submissions, self._db.q, db, _record(row), now)
            return firer.fire(trace_context)


class _Firer:
    """One firing transaction of one schedule, slot by slot."""

    def __init__(
        self,
        submissions: SubmissionStore,
        statements: q.DialectStatements,
        db: StoreConnection,
        schedule: ScheduleRecord,
        now: datetime,
    ) -> None:
        self._submissions = submissions
        self._statements = statements
        self._db = db
        self._schedule = schedule
        self._now = now
        self._trace_context: dict[str, str] | None = None
        self._last_turn_id = schedule.last_turn_id
        self._firings: list[Firing] = []
        self._counts = {SlotStatus.SKIPPED: 0, SlotStatus.MISSED: 0}

    def fire(self, trace_context: dict[str, str] | None) -> Fired:
        """Deal with the schedule's due slots and move its next slot on."""
        self._trace_context = trace_context
        schedule = self._schedule
        zone = zone_of(schedule.timezone)
        grace = timedelta(seconds=schedule.misfire_grace_seconds)
        slot: datetime | None = schedule.next_at
        paused = False
        for _ in range(SLOTS_PER_TRANSACTION):
            if slot is None or slot > self._now:
                break
            try:
                self._slot(slot, late=self._now - slot > grace)
            except SessionNotFound:
                # Its session was deleted (pruned): nothing to fire into any more.  The
                # slot is recorded missed and the schedule paused, for a person to see.
                self._set_slot(slot, SlotStatus.MISSED, None, None)
                self._counts[SlotStatus.MISSED] += 1
                paused = True
                slot = None
                break
            slot = next_slot(schedule.cron, zone, slot)
        self._db.execute(
            q.UPDATE_SCHEDULE.values(
                next_at=slot, last_turn_id=self._last_turn_id, paused=schedule.paused or paused
            ),
            {"b_schedule_id": schedule.schedule_id},
        )
        return Fired(
            firings=tuple(self._firings),
            skipped=self._counts[SlotStatus.SKIPPED],
            missed=self._counts[SlotStatus.MISSED],
        )

    def _slot(self, slot: datetime, *, late: bool) -> None:
        """Claim ``slot`` and deal with it: missed if ``late``, else skipped or fired
        as the schedule's overlap says."""
        if late:
            self._record(slot, SlotStatus.MISSED)
            return
        overlap = self._schedule.overlap
        busy = self._previous_unfinished()
        if busy and overlap is Overlap.SKIP:
            self._record(slot, SlotStatus.SKIPPED)
            return
        if not self._claim(slot, SlotStatus.FIRED):
            return
        firing = self._submit(slot, interrupt=busy and overlap is Overlap.INTERRUPT)
        self._set_slot(slot, SlotStatus.FIRED, firing.turn_id, firing.session_id)
        self._last_turn_id = firing.turn_id
        self._firings.append(firing)

    def _set_slot(
        self, slot: datetime, status: SlotStatus, turn_id: str | None, session_id: str | None
    ) -> None:
        """The claimed slot's row: what became of it."""
        self._db.execute(
            q.UPDATE_SLOT,
            {
                "b_schedule_id": self._schedule.schedule_id,
                "b_slot_at": slot,
                "b_status": status.value,
                "b_turn_id": turn_id,
                "b_session_id": session_id,
            },
        )

    def _record(self, slot: datetime, status: SlotStatus) -> None:
        if self._claim(slot, status):
            self._counts[status] += 1

    def _claim(self, slot: datetime, status: SlotStatus) -> bool:
        """Insert the slot's row; False if it was there (dealt with already)."""
        claimed = self._db.execute(
            self._statements.claim_slot,
            {
                "schedule_id": self._schedule.schedule_id,
                "slot_at": slot,
                "status": status.value,
                "turn_id": None,
                "session_id": None,
                "recorded_at": self._now,
            },
        ).one_or_none()
        return claimed is not None

    def _previous_unfinished(self) -> bool:
        """Whether the last firing's turn has not ended (queued, running or waiting)."""
        if self._last_turn_id is None:
            return False
        status = self._db.execute(
            q.RUN_STATUS_OF_TURN, {"b_turn_id": self._last_turn_id}
        ).scalar_one_or_none()
        return status in q.UNFINISHED

    def _submit(self, slot: datetime, *, interrupt: bool) -> Firing:
        schedule = self._schedule
        session_id = schedule.session_id
        interrupted: list[tuple[str, Steer]] = []
        denied: list[Answered] = []
        if session_id is None:
            if interrupt and self._last_turn_id is not None:
                # The previous firing opened a session of its own: its turns stop there.
                previous = self._db.execute(
                    q.SESSION_OF_TURN, {"b_turn_id": self._last_turn_id}
                ).scalar_one_or_none()
                if previous is not None:
                    interrupted, denied = self._submissions.make_way(
                        self._db, previous, IfBusy.INTERRUPT, self._now
                    )
            session_id = self._open_session(slot)
        receipt = self._submissions.submit_within(
            self._db,
            session_id=session_id,
            prompt=schedule.prompt,
            if_busy=IfBusy.INTERRUPT if interrupt else IfBusy.ENQUEUE,
            priority=schedule.priority,
            trace_context=self._trace_context,
        )
        return Firing(
            schedule_id=schedule.schedule_id,
            slot_at=slot,
            session_id=session_id,
            turn_id=receipt.turn.turn_id,
            priority=schedule.priority,
            queued=receipt.queued,
            interrupted=(*interrupted, *receipt.interrupted),
            denied=(*denied, *receipt.denied),
        )

    def _open_session(self, slot: datetime) -> str:
        """A new session for this slot's turn, the schedule's tenant's, on its root."""
        schedule = self._schedule
        record = SessionRecord(
            session_id=new_id(),
            root=schedule.root or ".",
            metadata={"schedule_id": schedule.schedule_id, "slot_at": slot.isoformat()},
            head_turn_id=None,
            token_ceiling=None,
            tokens_used=0,
            created_at=self._now,
            tenant=schedule.tenant,
            last_active_at=self._now,
            title=schedule.name,
        )
        insert_session(self._db, record)
        return record.session_id


def _tenants_session(db: StoreConnection, session_id: str, tenant: str | None) -> SessionRecord:
    try:
        session = read_session(db, session_id)
    except SessionNotFound:
        raise SessionNotFound(f"no session {session_id!r}") from None
    if tenant is not None and session.tenant != tenant:
        raise SessionNotFound(f"no session {session_id!r}")
    return session


def _read_schedule(
    db: StoreConnection, schedule_id: str, tenant: str | None, statement: Any = q.SCHEDULE
) -> ScheduleRecord:
    row = db.execute(statement, {"b_schedule_id": schedule_id}).one_or_none()
    if row is None or (tenant is not None and row.tenant != tenant):
        raise ScheduleNotFound(f"no schedule {schedule_id!r}")
    return _record(row)


def _record(row: Any) -> ScheduleRecord:
    try:
        overlap = Overlap(row.overlap)
    except ValueError as exc:  # (only a hand-edited row)
        raise InvalidRequest(f"schedule {row.id!r} has an unknown overlap {row.overlap!r}") from exc
    return ScheduleRecord(
        schedule_id=row.id,
        tenant=row.tenant,
        name=row.name,
        cron=row.cron,
        timezone=row.timezone,
        prompt=row.prompt,
        session_id=row.session_id,
        root=row.root,
        priority=row.priority,
        overlap=overlap,
        paused=bool(row.paused),
        misfire_grace_seconds=int(row.misfire_grace_seconds),
        next_at=None if row.next_at is None else aware(row.next_at),
        last_turn_id=row.last_turn_id,
        created_at=aware(row.created_at),
    )


def _schedule_row(record: ScheduleRecord) -> dict[str, Any]:
    return {
        "id": record.schedule_id,
        "tenant": record.tenant,
        "name": record.name,
        "cron": record.cron,
        "timezone": record.timezone,
        "prompt": record.prompt,
        "session_id": record.session_id,
        "root": record.root,
        "priority": record.priority,
        "overlap": record.overlap.value,
        "paused": record.paused,
        "misfire_grace_seconds": record.misfire_grace_seconds,
        "next_at": record.next_at,
        "last_turn_id": record.last_turn_id,
        "created_at": record.created_at,
    }
