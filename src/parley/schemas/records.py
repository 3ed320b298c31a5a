"""Frozen records handed across every boundary (never ORM objects)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from parley.schemas.errors import InvalidRequest


class TurnStatus(StrEnum):
    """A turn's status: ``queued``, ``running``, ``waiting`` (for a person's answer to a
    tool call, holding no worker) or one of the terminal outcomes."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    FINISHED = "finished"
    SUCCEEDED = "succeeded"
    CHECK_FAILED = "check_failed"
    BUDGET_EXCEEDED = "budget_exceeded"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        """True for the outcomes, false for ``queued``, ``running`` and ``waiting``."""
        return self not in (TurnStatus.QUEUED, TurnStatus.RUNNING, TurnStatus.WAITING)

    @property
    def has_reply(self) -> bool:
        """Only a turn the model itself ended carries a reply: the reply is the agent's last
        message, or nothing (a budget, a failed check, an interrupt or an error)."""
        return self in (TurnStatus.FINISHED, TurnStatus.SUCCEEDED)

    @property
    def resumable(self) -> bool:
        """An outcome ``resume`` may continue from its last committed step (a stranded
        ``running`` turn is resumed as well, but it has no outcome yet)."""
        return self in (TurnStatus.CANCELLED, TurnStatus.FAILED)

    @property
    def settled(self) -> bool:
        """An outcome that can never change again, nor its committed steps."""
        return self.terminal and not self.resumable

    @property
    def moves_head(self) -> bool:
        """A failed turn leaves the head where it was: its work never became part of the
        conversation (``before_commit`` rejected it, or the model broke)."""
        return self.terminal and self is not TurnStatus.FAILED


REPLAY_TURN_KEY = "parley_replay_of_turn"
"""The host context key naming the original turn a replay turn re-runs (docs/replay.md)."""


class SteerKind(StrEnum):
    """What an operator can send to a running turn."""

    SAY = "say"
    INTERRUPT = "interrupt"


class IfBusy(StrEnum):
    """What ``submit`` does when the session already has a turn queued or running."""

    ENQUEUE = "enqueue"
    REJECT = "reject"
    INTERRUPT = "interrupt"


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token usage of a step or a turn."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total(self) -> int:
        """Input plus output tokens: what budgets count."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
        )

    def to_json(self) -> dict[str, int]:
        """The stored form."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Usage:
        """Load the stored form (missing keys read as zero)."""
        return cls(
            input_tokens=int(data.get("input_tokens", 0)),
            output_tokens=int(data.get("output_tokens", 0)),
            cached_tokens=int(data.get("cached_tokens", 0)),
        )


@dataclass(frozen=True, kw_only=True)
class TurnUsage(Usage):
    """A turn's usage as its result gives it: its own tokens (``input_tokens``,
    ``output_tokens``, ``cached_tokens``: what its budgets count), and ``descendants``,
    those of its agent calls' child turns and theirs (docs/sub-agents.md#7-seen), so that
    ``total`` is the whole tree's input plus output tokens."""

    descendants: Usage = field(default_factory=Usage)

    @property
    def total(self) -> int:
        """Input plus output tokens of the turn and every descendant."""
        return self.input_tokens + self.output_tokens + self.descendants.total

    @property
    def tree(self) -> Usage:
        """The tokens of the turn and every descendant, by kind."""
        own = Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cached_tokens=self.cached_tokens,
        )
        return own + self.descendants


@dataclass(frozen=True, kw_only=True)
class SessionRecord:
    """A session as stored."""

    session_id: str
    root: str
    metadata: dict[str, Any]
    head_turn_id: str | None
    token_ceiling: int | None
    tokens_used: int
    created_at: datetime
    tenant: str | None = None
    """The gateway tenant that owns the session (None: created from Python)."""
    retention: timedelta | None = None
    """The session's own time to live past its newest activity (None: the host's)."""
    webhook_url: str | None = None
    """Where the session's turns' ends are posted (None: the host's URL, if any)."""
    last_active_at: datetime | None = None
    """The newest activity: the newest end of its turns, else its creation."""
    title: str | None = None
    """What a person reads in a list of sessions (None: not given, and no turn yet)."""
    batch_id: str | None = None
    """The batch whose line opened the session (None: a conversation)."""
    parent_turn_id: str | None = None
    """A child session's parent turn: the turn whose agent call opened it (None: no
    call opened it; docs/sub-agents.md)."""
    parent_call_id: str | None = None
    """The call of the parent turn that opened this child session."""
    agent: str | None = None
    """The path of the agent a child session runs (``writer/critic``)."""
    replay_of: str | None = None
    """The session this one replays (docs/replay.md; None: not a replay)."""


@dataclass(frozen=True, kw_only=True)
class TurnRecord:
    """A node of a session's tree, as ``Session.history()`` and ``Session.tree()`` list it."""

    turn_id: str
    session_id: str
    parent_id: str | None
    prompt: str
    status: TurnStatus
    reply: str | None
    run_id: str
    request_id: str | None
    created_at: datetime
    not_before: datetime | None = None
    """When the turn may start at the soonest (a delayed turn's time, or when the capacity
    it waits for is due); None for a turn that may start at once."""
    waiting_for: Waiting | None = None
    """While the turn waits: what for (``approval``, ``agents``, ``event``, ``time`` or
    ``capacity``); None while it runs, once it ended, and for one only in line."""
    waiting_event: str | None = None
    """While the turn waits for an event: its name (``not_before``: until when; None for
    a timer, docs/time.md#waiting-for-an-event)."""

    @property
    def outcome(self) -> TurnStatus | None:
        """The terminal outcome, or None while the turn is queued or running."""
        return self.status if self.status.terminal else None


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """What a finished turn returns (``Session.turn``, ``TurnHandle.wait``).

    ``undelivered`` lists the ``say`` texts that were accepted but could not reach the model
    because the turn stopped first (interrupt, budget): they are reported, never dropped
    silently.  ``partial`` is the display-only text of a stream cut by an interrupt.
    """

    turn_id: str
    run_id: str
    outcome: TurnStatus
    reply: str | None
    steps: int
    usage: Usage
    """The turn's tokens: a :class:`TurnUsage`, whose ``total`` counts its descendants'."""
    error: str | None = None
    undelivered: tuple[str, ...] = ()
    partial: str | None = None
    approvals: tuple[Approval, ...] = ()
    """Every call of the turn that asked for a person's answer, with the answer."""
    children: tuple[ChildRecord, ...] = ()
    """Each agent call's child turn (docs/sub-agents.md), in step and call order."""


@dataclass(frozen=True, kw_only=True)
class ChildRecord:
    """An agent call's child turn, as its parent's result lists it: the call, the agent's
    path, the child's turn and session, and its status (its outcome once it ended)."""

    step: int
    call_id: str
    agent: str
    turn_id: str
    session_id: str
    status: TurnStatus


class Decision(StrEnum):
    """A person's answer to a tool call that waited for one (docs/approvals.md)."""

    APPROVED = "approved"
    DENIED = "denied"


@dataclass(frozen=True, kw_only=True)
class Approval:
    """A tool call that asked for a person's answer, and the answer once given.

    ``accesses`` are the call's declared accesses (``{"mode", "path"}``); ``expires_at``
    is when an unanswered call becomes a denial ("timed out"), if the host set an
    ``approval_timeout``."""

    approval_id: str
    turn_id: str
    step: int
    call_id: str
    tool: str
    arguments: dict[str, Any]
    accesses: tuple[dict[str, str], ...]
    requested_at: datetime
    expires_at: datetime | None = None
    decision: Decision | None = None
    reason: str | None = None
    decided_at: datetime | None = None
    path: tuple[dict[str, str], ...] = ()
    """Where the call is, as a parent's ``approvals()`` lists its descendants' (docs/sub-
    agents.md): each agent call (``agent``, ``call_id``, ``turn_id``) from the parent down
    to the child turn that asked; empty for the turn's own calls."""

    @property
    def pending(self) -> bool:
        """Not answered yet."""
        return self.decision is None

    def to_json(self) -> dict[str, Any]:
        """The wire form (times ISO 8601)."""
        return {
            "approval_id": self.approval_id,
            "turn_id": self.turn_id,
            "step": self.step,
            "call_id": self.call_id,
            "tool": self.tool,
            "arguments": self.arguments,
            "accesses": [dict(a) for a in self.accesses],
            "requested_at": self.requested_at.isoformat(),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "decision": self.decision.value if self.decision else None,
            "reason": self.reason,
            "decided_at": self.decided_at.isoformat() if self.decided_at else None,
            **({"path": [dict(p) for p in self.path]} if self.path else {}),
        }


@dataclass(frozen=True, kw_only=True)
class Steer:
    """One message in a turn's steer inbox, numbered from 1 in acceptance order."""

    position: int
    kind: SteerKind
    text: str


class HasJsonForm(Protocol):
    """What ``to_json()`` gives the stored form of (``parley.mcp.McpServer`` among them:
    schemas cannot import parley)."""

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True)
class TaskContract:
    """A per-turn bound (``parley.TaskContract``): at most ``max_steps`` model calls and
    ``max_tokens`` tokens, and optionally a ``check`` shell command that must pass (run in
    the session root after the model stops; its failing output goes back to the model
    while budget remains).  It bounds only the turn that carries it."""

    max_steps: int | None = None
    max_tokens: int | None = None
    check: str | None = None
    check_timeout: float = 300.0
    mcp_servers: Sequence[Mapping[str, Any] | HasJsonForm] = ()
    """MCP servers for this turn only: ``parley.mcp.McpServer`` objects or their JSON
    forms, kept as a tuple of JSON forms (dicts); the host's policy must allow starting
    each."""

    def __post_init__(self) -> None:
        servers = self.mcp_servers
        if isinstance(servers, str | bytes | Mapping) or not isinstance(servers, Sequence):
            raise InvalidRequest("mcp_servers must be a list of MCP servers")
        stored = tuple(_stored_form(s) for s in servers)
        if not all(isinstance(s, dict) for s in stored):
            raise InvalidRequest("each of mcp_servers must be an McpServer or its JSON form")
        try:
            json.dumps(stored)  # stored with the turn: refused now, not at the submission
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"mcp_servers must be JSON: {exc}") from None
        object.__setattr__(self, "mcp_servers", stored)
        for name in ("max_steps", "max_tokens"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise InvalidRequest(f"{name} must be a positive integer or None, not {value!r}")
        if self.check is not None and (not isinstance(self.check, str) or not self.check.strip()):
            raise InvalidRequest("check must be a non-empty shell command or None")
        if self.check is not None and "\x00" in self.check:
            raise InvalidRequest("check contains a NUL character, which no shell can run")
        if self.check is not None and self.max_steps is None and self.max_tokens is None:
            # A failing check feeds back to the model while budget remains: without a
            # budget a check that never passes would loop forever.
            raise InvalidRequest("a contract with a check needs max_steps or max_tokens")
        timeout = self.check_timeout
        if (
            not isinstance(timeout, int | float)
            or isinstance(timeout, bool)
            or not 0 < timeout < float("inf")
        ):
            raise InvalidRequest("check_timeout must be a positive number of seconds")

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return {
            "max_steps": self.max_steps,
            "max_tokens": self.max_tokens,
            "check": self.check,
            "check_timeout": self.check_timeout,
            **({"mcp_servers": list(self.mcp_servers)} if self.mcp_servers else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> TaskContract | None:
        """Load the stored form; None stays None (an unbounded turn)."""
        if data is None:
            return None
        return cls(
            max_steps=data.get("max_steps"),
            max_tokens=data.get("max_tokens"),
            check=data.get("check"),
            check_timeout=float(data.get("check_timeout", 300.0)),
            mcp_servers=tuple(data.get("mcp_servers", ())),
        )


def _stored_form(server: Any) -> Any:
    """An MCP server spec as stored: its JSON form (schemas cannot import parley)."""
    to_json = getattr(server, "to_json", None)
    if callable(to_json):
        return to_json()
    return dict(server) if isinstance(server, Mapping) else server


class Waiting(StrEnum):
    """What a run that waits to be claimed waits for: its place in line (submitted or
    resumed), provider capacity (deferred), answers to a held step, its child turns
    (sub-agents), an event (a signal), or its time (a delayed turn).  The next claim
    makes a trace's wait span of it; every one but its place in line is what
    ``TurnRecord.waiting_for`` says while the turn waits."""

    QUEUE = "queue"
    CAPACITY = "capacity"
    APPROVAL = "approval"
    AGENTS = "agents"
    EVENT = "event"
    TIME = "time"


@dataclass(frozen=True, kw_only=True)
class RunState:
    """The execution record of a turn, as the engine needs it."""

    run_id: str
    turn_id: str
    session_id: str
    status: TurnStatus
    attempts: int
    steps: int
    usage: Usage
    steer_cursor: int
    contract: TaskContract | None
    reply: str | None
    partial: str | None
    error: str | None
    worker: str | None = None
    undelivered: tuple[str, ...] = field(default=())
    # The run's place in its session's queue (the session's turn count when it was
    # submitted or resumed).
    queue_position: int = 0
    # Claims in a row, this one's included once claimed, that committed no step.
    stalled_attempts: int = 0
    # A step whose calls wait for answers (``HeldStep.to_json()``): its model output, the
    # steer cursor it consumed and how each call is to go on.  None otherwise.
    held_step: dict[str, Any] | None = None
    # How many of its calls asked for an answer, over all its steps.
    approval_count: int = 0
    # When the run last ended (None while it has not).
    ended_at: datetime | None = None
    # The JSON object the submission carried for the host (docs/host.md#1-host-context).
    host_context: dict[str, Any] = field(default_factory=dict)
    # The run's lane for admission (docs/admission.md): "interactive" or "batch".
    priority: str = "interactive"
    # The W3C trace context its attempts' spans join (docs/operations.md#traces).
    trace_context: dict[str, str] | None = None
    # Since when, and for what, it waited to be claimed (as read by its claim).
    waiting_since: datetime | None = None
    waiting_for: Waiting | None = None
    # A run deferred for capacity: when its capacity was due (as read by its claim).
    not_before: datetime | None = None
