"""What a replay session's turns run with (docs/replay.md): the host's, or the replay's
model and system prompt, and its tools wrapped so that a call the original made gets
the recorded result instead of running again.

The engine asks the host for it (:meth:`parley.Host.for_replay`) whenever it runs a turn
of a session marked ``replay_of``, on whichever process runs it: what the replay chose
travels in the session's metadata (``REPLAY_KEY``), and a model or host given as a
Python object (an embedded client's) in this process's :data:`LOCAL_CHOICES`."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from parley.errors import InvalidRequest
from parley.ports.backend import CommittedStep
from parley.ports.host import (
    Access,
    DeltaSink,
    Model,
    ModelReply,
    ModelRequest,
    Tool,
    ToolContext,
    WaitFor,
)
from parley.schemas.messages import ToolDeclaration

REPLAY_KEY = "parley_replay"
"""The session metadata key holding what the replay chose (tools mode, model, prompt)."""
DEFAULT_READ_ONLY_TOOLS = ("read_file", "list_files", "search_files")
"""The built-in tools that only read: they may run in a ``recorded`` replay."""
NOT_RUN = (
    "This tool call was not run: this conversation is a replay, the call matches no "
    "recorded one (same tool, same arguments), and the tool is not read-only."
)

ToolsMode = Literal["recorded", "live"]


@dataclass(frozen=True)
class LocalChoice:
    """A replay's model or host given as Python objects, held by this process."""

    model: Model | None = None
    host: Any = None


LOCAL_CHOICES: dict[str, LocalChoice] = {}
"""Replay session id → the objects its replay was given here (embedded clients)."""
_LOCK = threading.Lock()


def remember(session_id: str, choice: LocalChoice) -> None:
    """Hold ``choice`` for the replay session ``session_id`` in this process."""
    with _LOCK:
        LOCAL_CHOICES[session_id] = choice


def local_choice(session_id: str) -> LocalChoice:
    """What this process was given for the replay session (nothing: empty)."""
    with _LOCK:
        return LOCAL_CHOICES.get(session_id, LocalChoice())


def call_key(name: str, arguments: str) -> tuple[str, str]:
    """What makes two calls the same: the tool and its arguments, compared as JSON values
    (key order and spacing do not count), else as text."""
    try:
        canonical = json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except ValueError:
        canonical = arguments
    return name, canonical


@dataclass
class RecordedCalls:
    """The original's calls and their results: each key's results in order, handed out
    in turn (a key called more often than recorded gets its last result again)."""

    results: dict[tuple[str, str], list[tuple[str, bool]]] = field(default_factory=dict)
    used: dict[tuple[str, str], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of(cls, steps: Iterable[CommittedStep]) -> RecordedCalls:
        """The calls of ``steps`` (every step of the original's turns)."""
        recorded = cls()
        for step in steps:
            by_id = {r.call_id: r for r in step.payload.tool_results}
            for call in step.payload.tool_calls:
                result = by_id.get(call.id)
                if result is None or result.refusal is not None:
                    continue  # never ran: nothing recorded to give back
                key = call_key(call.name, call.arguments)
                recorded.results.setdefault(key, []).append((result.content, result.is_error))
        return recorded

    def take(self, name: str, arguments: str) -> tuple[str, bool] | None:
        """The next recorded result of this call, or None if it was never made."""
        key = call_key(name, arguments)
        with self.lock:
            found = self.results.get(key)
            if not found:
                return None
            index = self.used.get(key, 0)
            self.used[key] = index + 1
            return found[min(index, len(found) - 1)]


class RecordedError(Exception):
    """A recorded call that failed: the replay gives the model the same error text."""


@dataclass(frozen=True)
class ReplayedTool:
    """A host tool in a ``recorded`` replay: a recorded call's result, else the tool
    itself if it is read-only, else a result saying it was not run."""

    tool: Tool
    recorded: RecordedCalls
    read_only: bool

    @property
    def declaration(self) -> ToolDeclaration:
        """The wrapped tool's."""
        return self.tool.declaration

    def parse(self, arguments: str) -> dict[str, Any]:
        """The wrapped tool's."""
        return self.tool.parse(arguments)

    def accesses(self, arguments: dict[str, Any]) -> Sequence[Access]:
        """The wrapped tool's: the policy judges a replayed call as it judged the original."""
        return self.tool.accesses(arguments)

    def run(self, arguments: dict[str, Any], context: ToolContext) -> str | WaitFor:
        """The recorded result, the tool's own (read-only), or :data:`NOT_RUN`."""
        # The engine hands run() the parsed arguments; the recorded ones are the model's
        # text, compared as JSON values, so dumping the parsed ones compares the same.
        found = self.recorded.take(self.declaration.name, json.dumps(arguments))
        if found is not None:
            content, is_error = found
            if is_error:
                raise RecordedError(content)
            return content
        if self.read_only:
            return self.tool.run(arguments, context)
        return NOT_RUN


@dataclass(frozen=True)
class ReplayAnswers:
    """How a ``recorded`` replay's turn answers its calls (docs/replay.md#tools-recorded-or-live):
    the host's tools and its MCP servers' are wrapped (:meth:`wrap`); an agent's call,
    which would open a child turn, is answered here (:meth:`agent_result`)."""

    calls: RecordedCalls
    read_only: frozenset[str]

    def wrap(self, tool: Tool) -> ReplayedTool:
        """``tool`` as the replay runs it."""
        return ReplayedTool(tool, self.calls, tool.declaration.name in self.read_only)

    def agent_result(self, name: str, arguments: str) -> tuple[str, bool] | None:
        """The result of a call of the agent ``name`` (its content, and whether it is an
        error) without a child turn: the recorded one (the original child's reply), or,
        unmatched, :data:`NOT_RUN`; None only for an unmatched call of an agent the
        policy marks read-only, which runs (as a child turn)."""
        found = self.calls.take(name, arguments)
        if found is not None:
            return found
        if name in self.read_only:
            return None
        return NOT_RUN, False


@dataclass
class SteeringModel:
    """The replay's model, placing the original turn's steers: one that entered before
    step ``k`` is sent while step ``k - 1``'s calls run, so the next boundary takes it."""

    model: Model
    steers: Mapping[int, list[str]]
    steer: Callable[[str], None]
    calls: int = 0

    @property
    def name(self) -> str:
        """The wrapped model's."""
        return self.model.name

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        """The wrapped model's answer; then the steers of the next step are sent."""
        reply = self.model.stream(request, on_delta)
        self.calls += 1
        if reply.tool_calls:
            for text in self.steers.get(self.calls, ()):
                self.steer(text)
        return reply

    def __getattr__(self, name: str) -> Any:
        # What else a model offers (validate_tools, limits, …) is the wrapped model's.
        return getattr(self.model, name)


def steers_by_step(steps: Iterable[CommittedStep]) -> dict[int, list[str]]:
    """The steers of one recorded turn by the step they entered before."""
    found: dict[int, list[str]] = {}
    for step in steps:
        for item in step.payload.inputs:
            if item.origin == "steer":
                found.setdefault(step.index, []).append(item.text)
    return found


def replay_choice(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """What the replay chose, as its session's metadata holds it."""
    chosen = metadata.get(REPLAY_KEY)
    if not isinstance(chosen, dict):
        raise InvalidRequest("a replay session's metadata lacks what the replay chose")
    return chosen
