"""What a schedule is to its callers (docs/time.md#schedules): its record and each slot's
fate."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class Overlap(StrEnum):
    """What a firing does while the previous firing's turn has not ended."""

    SKIP = "skip"
    """Nothing: the slot is recorded ``skipped``."""
    ENQUEUE = "enqueue"
    """Fire anyway (in the schedule's session, the turn waits behind the other)."""
    INTERRUPT = "interrupt"
    """Interrupt the previous turn, then fire."""


class SlotStatus(StrEnum):
    """A slot's fate."""

    FIRED = "fired"
    SKIPPED = "skipped"
    MISSED = "missed"
    """Later than the schedule's misfire grace when a beat came to it."""


DEFAULT_MISFIRE_GRACE_SECONDS = 3600


@dataclass(frozen=True, kw_only=True)
class ScheduleRecord:
    """A schedule as stored."""

    schedule_id: str
    tenant: str | None
    name: str | None
    cron: str
    timezone: str
    prompt: str
    session_id: str | None
    root: str | None
    priority: str
    overlap: Overlap
    paused: bool
    misfire_grace_seconds: int
    next_at: datetime | None
    """The next slot, in UTC (None while paused)."""
    last_turn_id: str | None
    created_at: datetime

    def to_json(self) -> dict[str, Any]:
        """The HTTP form (docs/http.md#9-schedules)."""
        return {
            "id": self.schedule_id,
            "name": self.name,
            "cron": self.cron,
            "timezone": self.timezone,
            "prompt": self.prompt,
            "session_id": self.session_id,
            "priority": self.priority,
            "overlap": self.overlap.value,
            "paused": self.paused,
            "misfire_grace_seconds": self.misfire_grace_seconds,
            "next_at": None if self.next_at is None else self.next_at.isoformat(),
            "last_turn_id": self.last_turn_id,
            "created_at": self.created_at.isoformat(),
        }


@dataclass(frozen=True, kw_only=True)
class ScheduleRun:
    """One slot of a schedule: when, what became of it, and its turn if it fired."""

    at: datetime
    status: SlotStatus
    turn_id: str | None
    session_id: str | None
    recorded_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "status": self.status.value,
            "turn_id": self.turn_id,
            "session_id": self.session_id,
            "recorded_at": self.recorded_at.isoformat(),
        }
