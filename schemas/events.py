"""Events a subscriber sees while a turn runs, ordered by a per-turn ``seq`` that grows by
one per event (it jumps where a turn cut off mid-run is taken over, past anything the
attempt cut off may have published)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class EventKind(StrEnum):
    """Every kind of event (SPEC §4).  Only ``token`` is ephemeral; the rest are durable."""

    QUEUED = "queued"
    STARTED = "started"
    TOKEN = "token"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    REFUSAL = "refusal"
    STEER = "steer"
    CHECK = "check"
    STEP = "step"
    STEP_RESTARTED = "step_restarted"
    END = "end"

    @property
    def durable(self) -> bool:
        """Durable events are stored in the database with their seq; tokens are not."""
        return self is not EventKind.TOKEN


@dataclass(frozen=True, kw_only=True)
class Event:
    """One event of one turn."""

    turn_id: str
    seq: int
    kind: EventKind
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {"turn_id": self.turn_id, "seq": self.seq, "kind": str(self.kind), "data": self.data}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        """Load the wire form."""
        return cls(
            turn_id=str(data["turn_id"]),
            seq=int(data["seq"]),
            kind=EventKind(data["kind"]),
            data=dict(data["data"]),
        )
