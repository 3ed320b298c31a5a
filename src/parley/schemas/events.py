"""Events a subscriber sees while a turn runs, ordered by a per-turn ``seq`` that grows by
one per event (it jumps where a turn cut off mid-run is taken over, past anything the
attempt cut off may have published).

Each kind has a declared payload: a frozen dataclass below, built by the engine and the
store and read by every consumer through :attr:`Event.payload`.  An event travels and is
stored in its wire form (``Event.to_json()``: ``turn_id``, ``seq``, ``kind``, ``data``),
whose ``data`` keys are the public interface's and never change meaning; a payload field added
later gets a default, so old stored events stay loadable.  One name per concept in
Python: the step an event belongs to is ``step`` on every payload, though the wire form
says ``index`` for the ``step`` and ``step_restarted`` events (as it always has).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from typing import Annotated, Any, ClassVar, Protocol, get_args

from pydantic import Field, TypeAdapter, ValidationError

from parley.schemas.errors import CodecError
from parley.schemas.messages import ToolCall, ToolResult
from parley.schemas.records import Usage


class EventKind(StrEnum):
    """Every kind of event a subscriber can see.  Only ``token`` is ephemeral; the rest are
    durable."""

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
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_ANSWERED = "approval_answered"
    THROTTLED = "throttled"
    WAITING = "waiting"
    COMPACTED = "compacted"
    AGENT_STARTED = "agent_started"
    AGENT_ENDED = "agent_ended"
    END = "end"

    @property
    def durable(self) -> bool:
        """Durable events are stored in the database with their seq; tokens are not."""
        return self is not EventKind.TOKEN


class EventPayload(Protocol):
    """What every payload class below has: its kind and its wire form."""

    KIND: ClassVar[EventKind]

    def to_json(self) -> dict[str, Any]: ...


# The index of the step an event belongs to, read from the wire key ``index``.
_StepIndex = Annotated[int, Field(validation_alias="index")]


@dataclass(frozen=True, kw_only=True)
class Queued:
    """The turn was accepted (``resume``: again, by a resume), and waits for a driver."""

    KIND: ClassVar[EventKind] = EventKind.QUEUED
    run_id: str
    resume: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "resume": True} if self.resume else {"run_id": self.run_id}


@dataclass(frozen=True, kw_only=True)
class Started:
    """A driver claimed the turn: its ``attempt`` (1 for the first), and who it is."""

    KIND: ClassVar[EventKind] = EventKind.STARTED
    run_id: str
    attempt: int
    worker: str

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "attempt": self.attempt, "worker": self.worker}


@dataclass(frozen=True, kw_only=True)
class Token:
    """Provisional text the model streamed in a step (render it, do not act on it)."""

    KIND: ClassVar[EventKind] = EventKind.TOKEN
    step: int
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "text": self.text}


@dataclass(frozen=True, kw_only=True)
class ToolCalled:
    """The model asked for a tool call (``arguments``: its JSON text, as the model gave
    it); announced before the policy judges it."""

    KIND: ClassVar[EventKind] = EventKind.TOOL_CALL
    step: int
    call_id: str
    name: str
    arguments: str

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments,
        }


@dataclass(frozen=True, kw_only=True)
class ToolAnswered(ToolResult):
    """The result the model gets for a call of step ``step``: the tool's output, an
    error, or a refusal (``refusal`` names the rule)."""

    KIND: ClassVar[EventKind] = EventKind.TOOL_RESULT
    step: int

    @classmethod
    def of(cls, step: int, result: ToolResult) -> ToolAnswered:
        """The event payload of ``result``."""
        return cls(step=step, **vars(result))

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, **super().to_json()}


@dataclass(frozen=True, kw_only=True)
class Refused:
    """The policy (``rule``) or the approver refused a call."""

    KIND: ClassVar[EventKind] = EventKind.REFUSAL
    call_id: str
    tool: str
    rule: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "rule": self.rule,
            "reason": self.reason,
        }


@dataclass(frozen=True, kw_only=True)
class Steered:
    """A ``say`` (its inbox ``position`` and text) was delivered: it is in the request of
    ``step``, which committed (or is held for answers, and commits once they are in).
    Stored and published with that step, so a steer taken into a step that never
    commits has no such event: it is reported undelivered instead."""

    KIND: ClassVar[EventKind] = EventKind.STEER
    position: int
    text: str
    step: int | None = None
    """None in events stored before the step was recorded."""

    def to_json(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"position": self.position, "text": self.text}
        return wire if self.step is None else {**wire, "step": self.step}


@dataclass(frozen=True, kw_only=True)
class Checked:
    """The contract's check ran on a final answer (``exit_code`` None: it did not
    finish, or could not start)."""

    KIND: ClassVar[EventKind] = EventKind.CHECK
    passed: bool
    exit_code: int | None
    output: str

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "exit_code": self.exit_code, "output": self.output}


@dataclass(frozen=True, kw_only=True)
class StepCommitted:
    """A step committed whole: its text, the calls it asked for, what it cost."""

    KIND: ClassVar[EventKind] = EventKind.STEP
    step: _StepIndex
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.step,
            "text": self.text,
            "tool_calls": [c.to_json() for c in self.tool_calls],
            "usage": self.usage.to_json(),
        }


@dataclass(frozen=True, kw_only=True)
class StepRestarted:
    """Drop the text streamed so far for this step: it will not commit as streamed
    (``reason``: ``resumed``, ``failed``, ``diverged``, ``rejected``, or a provider's)."""

    KIND: ClassVar[EventKind] = EventKind.STEP_RESTARTED
    step: _StepIndex
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"index": self.step, "reason": self.reason}


@dataclass(frozen=True, kw_only=True)
class ApprovalRequested:
    """A call of step ``step`` waits for a person's answer (``approval_id``); the turn
    holds no worker meanwhile.  ``rule`` is what asked (a policy rule, or ``approver``)."""

    KIND: ClassVar[EventKind] = EventKind.APPROVAL_REQUESTED
    approval_id: str
    step: int
    call_id: str
    tool: str
    arguments: dict[str, Any]
    accesses: tuple[dict[str, str], ...] = ()
    rule: str = ""
    expires_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "approval_id": self.approval_id,
            "step": self.step,
            "call_id": self.call_id,
            "tool": self.tool,
            "arguments": self.arguments,
            "accesses": [dict(a) for a in self.accesses],
            "rule": self.rule,
            "expires_at": self.expires_at,
        }


@dataclass(frozen=True, kw_only=True)
class ApprovalAnswered:
    """A waiting call got its answer: ``approved`` or ``denied`` (with the reason: the
    person's, ``timed out`` or ``interrupted``)."""

    KIND: ClassVar[EventKind] = EventKind.APPROVAL_ANSWERED
    approval_id: str
    decision: str
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id, "decision": self.decision, "reason": self.reason}


@dataclass(frozen=True, kw_only=True)
class Throttled:
    """The turn waits about ``seconds`` for capacity of ``model`` at its provider
    (docs/admission.md): it holds no worker meanwhile, and goes on by itself, from its
    last committed step, once the capacity is due (``reason``: ``requests``, ``tokens``,
    ``interactive`` or ``penalty``, a 429's ``retry-after``; or ``pending``: the model's
    answer is not ready, a remote agent's task still runs, and it is asked again then)."""

    KIND: ClassVar[EventKind] = EventKind.THROTTLED
    model: str
    seconds: float
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "seconds": self.seconds, "reason": self.reason}


@dataclass(frozen=True, kw_only=True)
class WaitingForEvent:
    """A call of step ``step`` waits (docs/time.md#waiting-for-an-event): for the signal
    ``event`` (None: only for its time), until ``until`` (an ISO 8601 time in UTC; None:
    as long as it takes).  The turn holds no worker meanwhile; the call's
    ``tool_result`` comes when its wait ends (the signal's payload, or a result saying
    the time ran out or the turn was interrupted)."""

    KIND: ClassVar[EventKind] = EventKind.WAITING
    step: _StepIndex
    call_id: str
    event: str | None = None
    until: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.step,
            "call_id": self.call_id,
            "event": self.event,
            "until": self.until,
        }


@dataclass(frozen=True, kw_only=True)
class Compacted:
    """A compaction now stands for the session's path through ``through_turn_id``
    (docs/compaction.md): the model sees ``text``'s form of those turns from the next
    request on; the turns themselves stay stored.  On the turn that made it, before its
    first model call; one made on request is announced on the head turn, after its end."""

    KIND: ClassVar[EventKind] = EventKind.COMPACTED
    compaction_id: str
    through_turn_id: str
    strategy: str
    text: str
    tokens_before: int
    tokens_after: int

    def to_json(self) -> dict[str, Any]:
        return {
            "compaction_id": self.compaction_id,
            "through_turn_id": self.through_turn_id,
            "strategy": self.strategy,
            "text": self.text,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
        }


@dataclass(frozen=True, kw_only=True)
class AgentStarted:
    """An agent call of the step opened its child turn (docs/sub-agents.md): the call,
    the agent's path, and the child's turn and session (attach to them to follow it)."""

    KIND: ClassVar[EventKind] = EventKind.AGENT_STARTED
    call_id: str
    agent: str
    turn_id: str
    session_id: str

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "agent": self.agent,
            "turn_id": self.turn_id,
            "session_id": self.session_id,
        }


@dataclass(frozen=True, kw_only=True)
class AgentEnded:
    """An agent call's child turn ended, with ``outcome`` (a terminal status); the
    call's result is given when the parent's step goes on."""

    KIND: ClassVar[EventKind] = EventKind.AGENT_ENDED
    call_id: str
    outcome: str
    agent: str = ""
    turn_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "outcome": self.outcome,
            "agent": self.agent,
            "turn_id": self.turn_id,
        }


@dataclass(frozen=True, kw_only=True)
class Ended:
    """The turn's outcome (a terminal :class:`TurnStatus`), its reply, why it failed, and the
    steers that were accepted but never reached the model."""

    KIND: ClassVar[EventKind] = EventKind.END
    outcome: str
    reply: str | None = None
    error: str | None = None
    undelivered: tuple[str, ...] = ()
    approvals: tuple[dict[str, Any], ...] = ()
    """Every call that asked for an answer: ``approval_id``, ``tool``, ``decision``,
    ``reason``."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "outcome": self.outcome,
            "reply": self.reply,
            "error": self.error,
            "undelivered": list(self.undelivered),
        }
        if self.approvals:
            data["approvals"] = [dict(a) for a in self.approvals]
        return data


Payload = (
    Queued
    | Started
    | Token
    | ToolCalled
    | ToolAnswered
    | Refused
    | Steered
    | Checked
    | StepCommitted
    | StepRestarted
    | ApprovalRequested
    | ApprovalAnswered
    | Throttled
    | WaitingForEvent
    | Compacted
    | AgentStarted
    | AgentEnded
    | Ended
)
"""Any event's payload, and the one list of the payload classes: narrow it with
``isinstance`` or ``match``.  A class added here is a mypy error in every projection of
the gateway until it shows it (CONTRIBUTING.md, "How to add an event kind")."""

PAYLOADS: dict[EventKind, type[Payload]] = {cls.KIND: cls for cls in get_args(Payload)}
"""The payload class of each kind (read off :data:`Payload`)."""


@cache
def payload_adapter(kind: EventKind) -> TypeAdapter[Any]:
    """The validating adapter of ``kind``'s payload (also its JSON schema)."""
    return TypeAdapter(PAYLOADS[kind])


def payload_of(kind: EventKind, data: dict[str, Any]) -> Payload:
    """The typed payload of a wire ``data`` object; :class:`CodecError` if it does not
    fit its kind (keys it does not know are ignored: a newer writer's)."""
    try:
        payload: Payload = payload_adapter(kind).validate_python(data)
    except ValidationError as exc:
        raise CodecError(f"a {kind.value} event's data does not fit: {exc}") from exc
    return payload


@dataclass(frozen=True, kw_only=True)
class Event:
    """One event of one turn.  ``data`` is the payload's wire form; build events with
    :meth:`of` and read them through :attr:`payload`."""

    turn_id: str
    seq: int
    kind: EventKind
    data: dict[str, Any]

    @classmethod
    def of(cls, turn_id: str, seq: int, payload: EventPayload) -> Event:
        """The event ``seq`` of a turn, carrying ``payload``."""
        return cls(turn_id=turn_id, seq=seq, kind=payload.KIND, data=payload.to_json())

    @property
    def payload(self) -> Payload:
        """The typed payload (one of the classes in :data:`PAYLOADS`, by kind)."""
        return payload_of(self.kind, self.data)

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
