"""The contract a host author implements: the model, tools, policy, approver and hooks
a host supplies, and what parley hands them (requests, contexts, outcomes, receipts).
``parley`` objects (models, tools, policy, hosts) satisfy these protocols structurally;
a host author imports them from ``parley``.  (What a back end implements, the store and
the coordinator, is in :mod:`parley.ports.backend`.)"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from parley.ports.admission import Limits, ProviderReport
from parley.ports.budget import ContextBudget
from parley.ports.compaction import Compaction
from parley.ports.driver import SessionDriver
from parley.schemas.compactions import NativeItem
from parley.schemas.errors import InvalidRequest
from parley.schemas.messages import Message, Prefix, ToolCall, ToolDeclaration
from parley.schemas.records import SessionRecord, TaskContract, TurnRecord, Usage

# ---------------------------------------------------------------------------- model


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a model or a tool may know about the turn calling it: where, which turn, and
    the host context its submission carried (``submit(context=...)``: the caller's user,
    tenant, request metadata; never part of the conversation)."""

    root: str
    session_id: str
    turn_id: str
    host_context: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TurnOptions:
    """What ``before_turn`` (and a driver) is told about the call running a turn.

    ``resume`` says whether this attempt continues the turn, and why: ``None`` for its
    first attempt, ``"takeover"`` when a driver died mid-turn, ``"resume"`` for an
    explicit ``resume`` of a cancelled or failed turn, ``"answers"`` when it goes on after
    its waiting calls were answered.  ``streaming``: the turn's deltas are published to
    its readers (always, in parley).  ``cancelled()`` says whether an interrupt has been
    accepted for the turn (the next boundary stops it)."""

    request_id: str | None
    session_id: str
    turn_id: str
    run_id: str
    attempt: int
    resume: str | None
    host_context: Mapping[str, Any]
    streaming: bool = True
    cancelled: Callable[[], bool] = field(default=lambda: False, compare=False)

    def __getitem__(self, key: str) -> Any:
        """The options as the mapping ``before_turn`` once received (``options["attempt"]``)."""
        return getattr(self, key)


@dataclass(frozen=True, kw_only=True)
class ModelRequest:
    """One model call: the frozen prefix and the model-visible messages, plus who is
    asking (for a provider's tracing or user fields; never sent as conversation)."""

    prefix: Prefix
    messages: tuple[Message, ...]
    context: ToolContext | None = None
    native: NativeItem | None = None
    """A native compaction item the request starts with, before ``messages``
    (docs/compaction.md#native): only ever one of the model's own provider."""


@dataclass(frozen=True, kw_only=True)
class ModelReply:
    """What one model call returned."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    limits: Limits | None = None
    """The model's limits as its provider reported them with this answer (rate-limit
    headers), learned by admission for the whole fleet (docs/admission.md)."""


class DeltaSink(Protocol):
    """Receives each text delta as the model streams it.  It raises
    :class:`StreamAborted` when the turn was interrupted while streaming; models must let
    that exception propagate."""

    def __call__(self, text: str) -> None:
        """One more piece of the step's text."""
        ...

    def restart(self, reason: str) -> None:
        """Forget everything streamed so far in this call: the model is starting the
        answer over (a retry after a cut stream, or a fallover to another provider).
        Readers are told with a ``step_restarted`` event and drop the provisional text.
        Raises :class:`StreamAborted` if the turn was interrupted meanwhile."""
        ...

    def raise_if_interrupted(self) -> None:
        """Raise :class:`StreamAborted` if the turn was interrupted: a model that waits
        between attempts asks, so a pause does not hold an interrupt up."""
        ...

    def provider_report(self, report: ProviderReport) -> None:
        """What the provider's rate-limit headers said as its answer began (parley's
        models say it before the first delta): admission learns the model's limits from
        it at once, without waiting for the answer's end, and holds the model's buckets
        to what the provider has left (docs/admission.md).  A model may never call it."""
        ...


class StreamAborted(Exception):
    """Raised through a model's stream when an interrupt arrives mid-stream."""


class ModelThrottled(Exception):
    """Raised by a model whose provider refused the call for its rate (a 429 that is not
    about an exhausted quota), before anything streamed.  Admission slows the model
    fleet-wide and the call is asked again after ``retry_after`` seconds (the provider's,
    capped by ``PARLEY_MAX_RETRY_AFTER``; None: the provider named none).  ``limits`` are
    the model's limits if the refusal reported them."""

    def __init__(
        self, message: str, *, retry_after: float | None = None, limits: Limits | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.limits = limits


class ModelPending(Exception):
    """Raised by a model whose answer is not ready yet, before anything streamed (a
    remote agent's task still runs: docs/sub-agents.md#8-remote-agents).  The turn lets
    go of its worker, its run queued again for ``seconds``, and the same call is made
    again then, on any worker: the wait holds nothing.  A model that raises it may have
    ``abandon(request)``, called when the turn is interrupted while it waits so (the
    call is not made again), to stop what it waited for."""

    def __init__(self, message: str, *, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


class Model(Protocol):
    """Anything that answers a request, streaming its text to a sink."""

    @property
    def name(self) -> str:
        """A label stored with each step."""
        ...

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        """Answer ``request``, calling ``on_delta`` with each piece of text in order."""
        ...


@dataclass(frozen=True, kw_only=True)
class NativeCompaction:
    """What a provider's own compaction of a request's conversation returned: its item
    (opaque), the text a person may read of it, and what the call cost."""

    item: NativeItem
    text: str
    usage: Usage


class NativeCompactor(Protocol):
    """A model whose provider compacts a conversation itself (docs/compaction.md#native)."""

    @property
    def native_provider(self) -> str:
        """The provider whose items it makes and reads (``anthropic``)."""
        ...

    def compact_natively(self, request: ModelRequest) -> NativeCompaction:
        """The provider's compaction of ``request``'s conversation (its native item, if
        it has one, and its messages)."""
        ...


def native_provider_of(model: object) -> str:
    """The provider whose native compaction items ``model`` reads (``""``: none)."""
    provider = getattr(model, "native_provider", None)
    return provider if isinstance(provider, str) else ""


# ---------------------------------------------------------------------------- tools

AccessMode = Literal["read", "write", "execute", "mcp", "mcp_server"]
"""``read``/``write`` a path in the root; ``execute`` a command line; ``mcp`` call a tool
of an MCP server (``<server>/<tool>``); ``mcp_server`` start a server a turn's contract
names (its command line or URL)."""


@dataclass(frozen=True, kw_only=True)
class Access:
    """One thing a tool call would touch, as the policy sees it."""

    mode: AccessMode
    path: str


class Tool(Protocol):
    """A callable the model may ask for."""

    @property
    def declaration(self) -> ToolDeclaration:
        """Name, description and JSON schema shown to the model."""
        ...

    def parse(self, arguments: str) -> dict[str, Any]:
        """Validate the model's raw argument text; raise ``InvalidRequest`` if malformed."""
        ...

    def accesses(self, arguments: dict[str, Any]) -> Sequence[Access]:
        """What the call would read, write or execute (checked by the policy first)."""
        ...

    def run(self, arguments: dict[str, Any], context: ToolContext) -> str | WaitFor:
        """Do the work; an exception becomes an error result for the model.  A
        :class:`WaitFor` parks the turn until its event or its time instead."""
        ...


EVENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")
"""What an event (a signal's name) may be called: what fits in a URL path and a log line."""

MAX_WAIT_SECONDS = 10 * 365 * 24 * 3600
"""The longest a call may wait (ten years, as for a delayed turn)."""


@dataclass(frozen=True)
class WaitFor:
    """A tool's answer that parks its turn (docs/time.md#waiting-for-an-event): the turn
    waits, holding nothing, until a signal named ``event`` is sent to it (its payload is
    the call's result) or ``timeout`` seconds have passed (the result says so).  No
    ``event``: a timer of ``timeout`` seconds."""

    event: str | None
    timeout: float | None = None

    def __post_init__(self) -> None:
        check_event_name(self.event, "WaitFor event", optional=True)
        timeout = self.timeout
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int | float):
                raise InvalidRequest(
                    f"WaitFor timeout must be a number of seconds, not {timeout!r}"
                )
            if not math.isfinite(timeout) or not 0 < timeout <= MAX_WAIT_SECONDS:
                raise InvalidRequest(
                    f"WaitFor timeout must be more than 0 and at most {MAX_WAIT_SECONDS} "
                    f"seconds, not {timeout!r}"
                )
        if self.event is None and timeout is None:
            raise InvalidRequest("WaitFor needs an event, a timeout, or both")


def check_event_name(name: object, what: str, *, optional: bool = False) -> str | None:
    """``name`` if it is a valid event name (None too, when ``optional``); else
    :class:`InvalidRequest` naming ``what``."""
    if name is None and optional:
        return None
    if not isinstance(name, str) or not EVENT_NAME.fullmatch(name):
        raise InvalidRequest(
            f"{what} must be 1 to 128 letters, digits and _ . : / - (starting with a letter "
            f"or digit), not {name!r}"
        )
    return name


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """Why a tool call was not run: the rule that refused it, and a sentence for the model."""

    rule: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Ask:
    """A call that may run only once a person approves it (docs/approvals.md): the policy's or the
    approver's answer instead of yes or no.  ``rule`` names what asked."""

    rule: str
    reason: str = ""


class PolicyPort(Protocol):
    """Decides, from a call's name and accesses, whether it may run (``parley.Policy`` is
    parley's own)."""

    def check(self, tool: str, accesses: Sequence[Access], root: str) -> Refusal | Ask | None:
        """None to allow, a refusal naming the rule, or :class:`Ask` to have a person
        answer first."""
        ...


@dataclass(frozen=True, kw_only=True)
class ApprovalRequest:
    """A tool call the policy allowed, awaiting the host's approver."""

    session_id: str
    turn_id: str
    tool: str
    arguments: dict[str, Any]
    accesses: tuple[Access, ...]


class Approver(Protocol):
    """The host's last word on a call the policy allowed."""

    def approve(self, request: ApprovalRequest) -> bool | Ask:
        """True to run the call, False to refuse it, :class:`Ask` to have a person
        answer (the turn then waits, holding no worker)."""
        ...


@dataclass(frozen=True, kw_only=True)
class Toolset:
    """The tools one turn runs with.  ``stable`` tools (the host's own and its MCP
    servers') are declared in the session's frozen prefix; ``extra`` tools (MCP servers
    named by the turn's contract) are declared after it, for this turn only, so the
    prefix stays byte-identical.  ``close`` releases what the turn opened."""

    stable: tuple[Tool, ...]
    extra: tuple[Tool, ...] = ()
    close: Callable[[], None] = field(default=lambda: None)


# ---------------------------------------------------------------------------- hooks


@dataclass(frozen=True, kw_only=True)
class PrefixSnapshot:
    """A prefix offered by ``before_turn``.  An ordinary snapshot may only set the prefix
    of a session that has none yet; a refreshing one replaces a frozen prefix with a new
    generation once the turn commits (an identical one is a no-op)."""

    prefix: Prefix
    refresh: bool = False

    @classmethod
    def refreshing(cls, system_prompt: str, tools: Sequence[ToolDeclaration]) -> PrefixSnapshot:
        """A snapshot that explicitly replaces the frozen prefix."""
        return cls(prefix=Prefix(system_prompt=system_prompt, tools=tuple(tools)), refresh=True)

    @classmethod
    def initial(cls, system_prompt: str, tools: Sequence[ToolDeclaration]) -> PrefixSnapshot:
        """A snapshot that sets the prefix before the first committed turn."""
        return cls(prefix=Prefix(system_prompt=system_prompt, tools=tuple(tools)))


@dataclass(frozen=True, kw_only=True)
class TurnPreparation:
    """What ``before_turn`` may change for one turn: the prefix, and a tool snapshot used
    for this call only (it is not stored for the following turn)."""

    prefix: PrefixSnapshot | None = None
    tools: tuple[Tool, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class TurnRequest:
    """The turn as ``before_turn`` sees it."""

    session_id: str
    turn_id: str
    run_id: str
    prompt: str
    contract: TaskContract | None


@dataclass(frozen=True, kw_only=True)
class SessionStateView:
    """A read-only view of the session for ``before_turn``."""

    session: SessionRecord
    prefix: Prefix | None
    history: tuple[TurnRecord, ...]


@dataclass(frozen=True, kw_only=True)
class TurnOutcome:
    """A turn's outcome, as ``before_commit`` and ``on_terminal`` see it."""

    session_id: str
    turn_id: str
    run_id: str
    outcome: str
    reply: str | None
    steps: int
    usage: Usage
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class CommitReceipt:
    """Handed to ``after_commit`` once a turn's outcome is durable."""

    outcome: TurnOutcome
    head_turn_id: str | None
    prefix_generation: int
    committed_at: datetime
    options: TurnOptions | None = None
    """The options the turn ran with (its host context among them), as a snapshot."""
    host_context: Mapping[str, Any] = field(default_factory=dict)
    path: tuple[str, ...] = ()
    """The transcript path: the turn ids from the session's root to this turn."""
    delta: tuple[Any, ...] = ()
    """The rows this turn appended (``parley.transcript`` rows: its prompt, and per step
    its inputs, the assistant's message and the tool results)."""


HOOK_NAMES = ("before_turn", "before_commit", "after_commit", "on_terminal")


class SessionHooks:
    """A host's hooks around a turn's commit (``Host(hooks=...)``).  Subclass it and
    override what you need: a hook left as it is does nothing, and the engine skips it
    (``before_commit`` costs a transaction when present).  Any object with some of these
    methods serves as well."""

    def before_turn(
        self, request: TurnRequest, options: TurnOptions, state: SessionStateView
    ) -> TurnPreparation | None:
        """Before a turn's first step: may set the initial or a refreshing prefix and a
        tool snapshot for this call (return None to change nothing)."""
        return None

    def before_commit(self, outcome: TurnOutcome, context: dict[str, Any]) -> None:
        """Before a completed turn's outcome commits: raise to reject it (it fails, and
        nothing of its final answer is kept)."""

    def after_commit(self, receipt: CommitReceipt) -> None:
        """Once a completed turn's outcome is durable.  Its errors are logged: they
        cannot undo the commit."""

    def on_terminal(self, outcome: TurnOutcome) -> None:
        """After every end, cancelled and failed ones included.  Errors are logged."""


BeforeTurn = Callable[[TurnRequest, TurnOptions, SessionStateView], "TurnPreparation | None"]


@dataclass(frozen=True, kw_only=True)
class HookSet:
    """The hooks a host has, each None when it has none: what the engine calls."""

    before_turn: BeforeTurn | None = None
    before_commit: Callable[[TurnOutcome, dict[str, Any]], object] | None = None
    after_commit: Callable[[CommitReceipt], object] | None = None
    on_terminal: Callable[[TurnOutcome], object] | None = None

    @classmethod
    def of(cls, hooks: object | None) -> HookSet:
        """The hooks of ``hooks``: the methods of those names it has, but those a
        :class:`SessionHooks` subclass left as they are.  :class:`InvalidRequest` for an
        attribute of a hook's name that is not callable."""
        found: dict[str, Any] = {}
        for name in HOOK_NAMES if hooks is not None else ():
            method = getattr(hooks, name, None)
            if method is None:
                continue
            if not callable(method):
                raise InvalidRequest(f"Host.hooks.{name} must be a method, not {method!r}")
            if isinstance(hooks, SessionHooks) and getattr(type(hooks), name, None) is getattr(
                SessionHooks, name
            ):
                continue  # the base class's: nothing to call
            found[name] = method
        return cls(**found)


# ---------------------------------------------------------------------------- host


AGENT_PATH_SEPARATOR = "/"
"""Joins the names of an agent's path (``writer/critic``); no agent name holds it."""


def agent_path(text: str | None) -> tuple[str, ...]:
    """The names of a stored agent path (``writer/critic``); none for the host's own."""
    return tuple(text.split(AGENT_PATH_SEPARATOR)) if text else ()


class AgentPort(Protocol):
    """An agent the model may hand a task to (``parley.Agent``; docs/sub-agents.md), as
    the engine reads it when it opens a call's child turn."""

    @property
    def name(self) -> str: ...

    @property
    def contract(self) -> TaskContract | None:
        """The contract its child turns run under (None: the parent turn's)."""
        ...


class RecordedAnswers(Protocol):
    """How a ``recorded`` replay's turn answers its agents' calls (docs/replay.md): a
    host that replays one offers it as ``replaying``."""

    def agent_result(self, name: str, arguments: str) -> tuple[str, bool] | None:
        """A call's result without a child turn (content, is error), or None: it runs."""
        ...


class HostPort(Protocol):
    """What the application supplies to run turns (``parley.Host`` is parley's own)."""

    @property
    def model(self) -> Model: ...

    @property
    def system_prompt(self) -> str: ...

    @property
    def tools(self) -> Sequence[Tool]: ...

    @property
    def policy(self) -> PolicyPort: ...

    @property
    def approver(self) -> Approver: ...

    @property
    def hook_set(self) -> HookSet:
        """The host's hooks, resolved once."""
        ...

    @property
    def tool_output_limit(self) -> int: ...

    @property
    def context_budget(self) -> ContextBudget | None: ...

    @property
    def compaction(self) -> Compaction | None:
        """When turns compact their session first (docs/compaction.md#when; None: never)."""
        ...

    @property
    def retention(self) -> timedelta | None:
        """The time to live of ended sessions that set none of their own (None: none)."""
        ...

    @property
    def webhook_url(self) -> str | None:
        """Where every turn's end is posted, unless its session names its own URL."""
        ...

    @property
    def approval_timeout(self) -> float | None:
        """Seconds an asked call may wait for its answer (None: no limit)."""
        ...

    @property
    def driver(self) -> SessionDriver:
        """What runs each turn's steps (parley's own loop unless the host brings one)."""
        ...

    @property
    def limits(self) -> Mapping[str, Limits]:
        """Each model's provider limits by its name (docs/admission.md)."""
        ...

    def toolset(self, contract: TaskContract | None, context: ToolContext) -> Toolset:
        """The tools of one turn (opening MCP servers as needed); closed at its end."""
        ...

    @property
    def agents(self) -> Sequence[AgentPort]:
        """The agents the model may call, each offered as a tool of its name."""
        ...

    @property
    def max_parallel_agents(self) -> int:
        """How many agent calls of one step run at once."""
        ...

    @property
    def max_agent_depth(self) -> int:
        """How deep child turns may nest (the top turn is depth 0)."""
        ...

    def for_agent(self, path: Sequence[str]) -> HostPort:
        """The host the child turns of the agent at ``path`` run with."""
        ...
