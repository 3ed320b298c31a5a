"""A step whose calls wait for a person's answer (docs/approvals.md), as the run row keeps it.

When any call of a step asks, none of the step's calls runs yet: the model's output is
kept here with the steer cursor the step consumed and each call's judgement, the run
becomes ``waiting`` and the driver lets the session go.  Once every answer is in, the
next driver runs the calls in the model's order, as judged, and commits the step whole
(step row, results, usage) like any other; the held form is then cleared.  A step held
for agent calls whose children an interrupt of the turn cancelled is not committed: the
turn ends ``cancelled`` still holding it, and a resume of the turn resumes those
children and waits for them again (docs/sub-agents.md#6-control).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parley.engine.tool_calls import Judgement
from parley.schemas.messages import StepPayload

HELD_STEP_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class HeldStep:
    """Step ``index``'s model output (``payload``, with no results yet), the steer cursor
    it consumed, and the judgement of each of its calls, in order."""

    index: int
    payload: StepPayload
    cursor: int
    judgements: tuple[Judgement, ...]
    resumed: bool = False
    """Set by a resume of the turn an interrupt ended while the step waited for its
    agent calls' children: the driver resumes the children the interrupt cancelled."""

    @property
    def asked(self) -> tuple[Judgement, ...]:
        """The calls that wait for an answer."""
        return tuple(j for j in self.judgements if j.ask is not None)

    def to_json(self) -> dict[str, Any]:
        """The stored form (``runs.held_step``)."""
        return {
            "v": HELD_STEP_VERSION,
            "index": self.index,
            "payload": self.payload.to_json(),
            "cursor": self.cursor,
            "judgements": [j.to_json() for j in self.judgements],
            "resumed": self.resumed,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeldStep:
        """Load the stored form."""
        payload = StepPayload.from_json(data["payload"])
        calls = {call.id: call for call in payload.tool_calls}
        return cls(
            index=int(data["index"]),
            payload=payload,
            cursor=int(data["cursor"]),
            judgements=tuple(
                Judgement.from_json(calls[j["call_id"]], j) for j in data["judgements"]
            ),
            resumed=bool(data.get("resumed", False)),
        )
