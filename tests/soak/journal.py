"""What the soak's clients did and saw, as they recorded it: the half of the evidence the
checker reads beside the store.  Plain dataclasses, written to ``journal.json`` at the end
so a failed run can be checked again by hand."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Say:
    """A ``say`` a client sent: ``status`` ``accepted`` (202), ``ended`` (409: the turn
    had ended), ``refused`` (another answer) or ``unknown`` (the connection broke after the
    request may have arrived)."""

    text: str
    status: str


@dataclass
class Answer:
    """An approval a client answered, and what the gateway said: ``status`` of the first
    answer that got through (200, or 409 if a retry found it answered already), and of a
    deliberate second answer (which must be 409)."""

    approval_id: str
    decision: str
    status: int
    repeat_status: int | None = None


@dataclass
class Turn:
    turn_id: str
    session_id: str
    kind: str
    prompt: str
    request_id: str
    submitted_at: float
    """Wall time the client first sent the submission."""
    calm: bool
    """Submitted before the first fault."""
    outcome: str | None = None
    ended_at: float | None = None
    resumes: int = 0
    """Resumes the gateway accepted (each runs the turn again: one more end)."""
    first_token: float | None = None
    """Seconds from the submission to its first token, as a reader saw it."""
    says: list[Say] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    repeats: list[str] = field(default_factory=list)
    """Turn ids a repeated submission (same request id) answered with."""
    branched_from: str | None = None
    """The turn the session's head was moved to just before this submission."""


@dataclass
class Reader:
    """One reader following a turn over SSE, through connections to either gateway."""

    turn_id: str
    seqs: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    connections: int = 0
    ended: bool = False


@dataclass
class Batch:
    batch_id: str
    custom_ids: list[str]
    status: str | None = None


@dataclass
class Head:
    """A session as the gateway answered at the end: its head and its history."""

    session_id: str
    head_turn_id: str | None
    history: list[str]


@dataclass
class TreeSnapshot:
    """A session's tree as the gateway answered during the run: (turn, parent, prompt,
    status)."""

    session_id: str
    turns: list[tuple[str, str | None, str, str]]


@dataclass
class Journal:
    turns: dict[str, Turn] = field(default_factory=dict)
    order: dict[str, list[str]] = field(default_factory=dict)
    """Each session's turns in the order their submissions were accepted."""
    readers: list[Reader] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    heads: list[Head] = field(default_factory=list)
    snapshots: list[TreeSnapshot] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """What a client could not do at all (a submission never accepted, say)."""
    arrivals: int = 0
    """Users who came to submit a turn (each arrival of the load's rate)."""

    def accept(self, turn: Turn) -> None:
        self.turns[turn.turn_id] = turn
        self.order.setdefault(turn.session_id, []).append(turn.turn_id)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @staticmethod
    def load(path: Path) -> Journal:
        raw: dict[str, Any] = json.loads(path.read_text())
        turns = {k: Turn(**_turn_fields(v)) for k, v in raw["turns"].items()}
        return Journal(
            turns=turns,
            order=raw["order"],
            readers=[Reader(**r) for r in raw["readers"]],
            batches=[Batch(**b) for b in raw["batches"]],
            heads=[Head(**h) for h in raw["heads"]],
            snapshots=[
                TreeSnapshot(s["session_id"], [(t[0], t[1], t[2], t[3]) for t in s["turns"]])
                for s in raw["snapshots"]
            ],
            errors=raw["errors"],
            arrivals=raw["arrivals"],
        )


def _turn_fields(raw: dict[str, Any]) -> dict[str, Any]:
    return {
        **raw,
        "says": [Say(**s) for s in raw["says"]],
        "answers": [Answer(**a) for a in raw["answers"]],
    }
