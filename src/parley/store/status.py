"""The store's side of ``parley status``: the unfinished work of every session, as the
database has it (queued, running and waiting turns; the oldest in line)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from parley.schemas.records import TurnStatus, Waiting
from parley.store import statements as q
from parley.store.connection import StoreConnection, Transactions
from parley.store.rows import aware

UNFINISHED = (TurnStatus.QUEUED, TurnStatus.RUNNING, TurnStatus.WAITING)


@dataclass(frozen=True, kw_only=True)
class UnfinishedTurn:
    """A turn that has not ended, as its run row stands."""

    turn_id: str
    session_id: str
    status: TurnStatus
    worker: str | None
    """Who claimed it last (``host:pid:thread``; None if never claimed)."""
    steps: int
    attempts: int
    queued_at: datetime
    """When it was submitted, or last resumed."""
    started_at: datetime | None
    asked_at: datetime | None
    """For a waiting turn: when its oldest unanswered call asked."""
    event: str | None = None
    """For a turn waiting for an event: the event (docs/time.md#waiting-for-an-event)."""
    until: datetime | None = None
    """For a turn waiting for an event: until when (None: as long as it takes)."""


@dataclass(frozen=True, kw_only=True)
class UnfinishedWork:
    """How many turns are queued, running and waiting, and the first few of each."""

    counts: dict[TurnStatus, int]
    oldest_queued_at: datetime | None
    turns: dict[TurnStatus, tuple[UnfinishedTurn, ...]]


@dataclass(frozen=True, kw_only=True)
class LaneWork:
    """A tenant's unfinished turns in one lane, and how many of them wait for provider
    capacity."""

    tenant: str
    priority: str
    unfinished: int
    waiting_capacity: int
    delayed: int = 0
    """Of them, the turns waiting for their time (docs/time.md#delayed-turns)."""
    next_due: datetime | None = None
    """The soonest of those times."""
    waiting_event: int = 0
    """Of them, the turns waiting for an event (docs/time.md#waiting-for-an-event)."""
    event_deadline: datetime | None = None
    """The soonest of their deadlines (None: none has one)."""


@dataclass(frozen=True, kw_only=True)
class AgentWork:
    """Sub-agents at work (docs/sub-agents.md#9-counts): child turns running, child turns
    waiting to run (queued, or waiting for a place among their step's), and parents
    whose step waits for their children."""

    running: int = 0
    waiting: int = 0
    parents_waiting: int = 0

    def to_json(self) -> dict[str, int]:
        return {
            "running": self.running,
            "waiting": self.waiting,
            "parents_waiting": self.parents_waiting,
        }


class StatusStore:
    """Reads for an operator (see the module docstring)."""

    def __init__(self, db: Transactions) -> None:
        self._db = db

    def work_by_lane(self) -> list[LaneWork]:
        """Unfinished turns by tenant and lane (docs/admission.md)."""
        rows = self._db.reading(lambda db: db.execute(q.WORK_BY_LANE, {}).all())
        return sorted(
            (
                LaneWork(
                    tenant=row.tenant,
                    priority=row.priority,
                    unfinished=int(row.runs),
                    waiting_capacity=int(row.deferred),
                    delayed=int(row.delayed),
                    next_due=None if row.next_due is None else aware(row.next_due),
                    waiting_event=int(row.waiting_event),
                    event_deadline=_moment(row.event_deadline),
                )
                for row in rows
            ),
            key=lambda lane: (lane.priority != "interactive", lane.tenant),
        )

    def waiting_for_capacity(self) -> dict[tuple[str, str], int]:
        """Turns waiting for provider capacity now, by (tenant, priority)."""
        # (Read every sweep: from the index of these runs alone, not every unfinished one.)
        rows = self._db.reading(lambda db: db.execute(q.CAPACITY_BY_LANE, {}).all())
        return {(row.tenant or "", row.priority): int(row.runs) for row in rows}

    def agent_work(self) -> AgentWork:
        """Sub-agents at work now (read every sweep: from the indexes of active runs and
        of runs waiting for agents, not every run)."""
        rows = self._db.reading(lambda db: db.execute(q.AGENT_WORK, {}).all())
        counts = {str(row.kind): int(row.runs) for row in rows}
        return AgentWork(
            running=counts.get(TurnStatus.RUNNING.value, 0),
            waiting=counts.get(TurnStatus.QUEUED.value, 0) + counts.get("placing", 0),
            parents_waiting=counts.get("parents", 0),
        )

    def unfinished_work(self, limit: int = 20) -> UnfinishedWork:
        """Every session's unfinished turns: counted, and up to ``limit`` of each status
        listed, oldest in line first."""

        def read(db: StoreConnection) -> UnfinishedWork:
            counts = dict.fromkeys(UNFINISHED, 0)
            oldest = None
            for row in db.execute(q.UNFINISHED_BY_STATUS, {}).all():
                status = TurnStatus(row.status)
                counts[status] = int(row.runs)
                if status is TurnStatus.QUEUED:
                    oldest = _moment(row.oldest)
            turns = {
                status: tuple(
                    _unfinished(row)
                    for row in db.execute(
                        q.UNFINISHED_OF_STATUS, {"b_status": status.value, "b_limit": limit}
                    ).all()
                )
                if counts[status]
                else ()
                for status in UNFINISHED
            }
            return UnfinishedWork(counts=counts, oldest_queued_at=oldest, turns=turns)

        return self._db.reading(read)


def _unfinished(row: Any) -> UnfinishedTurn:
    queued_at = _moment(row.queued_at)
    assert queued_at is not None  # (the column is NOT NULL)
    return UnfinishedTurn(
        turn_id=row.turn_id,
        session_id=row.session_id,
        status=TurnStatus(row.status),
        worker=row.worker,
        steps=int(row.steps),
        attempts=int(row.attempts),
        queued_at=queued_at,
        started_at=_moment(row.started_at),
        asked_at=_moment(row.asked_at),
        event=row.event if row.waiting_for == Waiting.EVENT.value else None,
        until=_moment(row.not_before) if row.waiting_for == Waiting.EVENT.value else None,
    )


def _moment(value: datetime | str | None) -> datetime | None:
    """A stored time as an aware datetime (SQLite hands an aggregate's back as text)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return aware(value)
