"""The driver seam (docs/drivers.md): what runs a turn's steps.

parley's engine owns everything durable about a turn: the claim and its fencing token,
the steers, the budgets, the policy and the approver, the commit of each step and of the
turn's end.  A :class:`SessionDriver` owns only the *shape* of the turn: which requests
the model is sent, in what order, and when the turn has answered its input.  It gets a
:class:`DriverTurn` holding the committed history and exactly one new input, and runs each
step with :meth:`DriverTurn.step`, which goes through parley's sink, tools, policy,
approver and commit path, so fencing, streaming, steering, budgets and crash resume hold
for any driver as for parley's own loop (:class:`parley.engine.agent_loop.AgentLoop`).

A driver is **re-entrant from its committed steps**: a turn taken over after a crash, or
going on once a person answered a held call, is driven again with ``input.kind ==
"resume"`` and ``turn.steps`` holding what committed, and the driver continues from
there.  Anything it keeps between steps must therefore be derivable from the steps (a
plan it asked the model for is the text of the step that asked), never held in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from parley.schemas.messages import Message, ToolCall, ToolDeclaration, ToolResult

InputKind = Literal["prompt", "steer", "check", "resume"]


@dataclass(frozen=True, kw_only=True)
class DriverInput:
    """The one new input a drive answers.

    ``prompt``: the turn's prompt (``texts`` holds it).  ``steer``: what the operator
    said at a boundary after the driver had answered (each steer's text).  ``check``: the
    task contract's check failed on the answer (its report).  ``resume``: nothing new; the
    turn goes on from its committed steps (a takeover, or the answers to a held step).

    Steers and check reports also reach the model by themselves: :meth:`DriverTurn.step`
    adds the inputs pending at its boundary to whatever request the driver builds, and
    stores them with that step, so a driver never places them itself."""

    kind: InputKind
    texts: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The input's texts as one (blank-line separated)."""
        return "\n\n".join(self.texts)


@dataclass(frozen=True, kw_only=True)
class DriverStep:
    """One committed step of the turn, as a driver reads it."""

    index: int
    text: str
    tool_calls: tuple[ToolCall, ...]
    tool_results: tuple[ToolResult, ...]
    inputs: tuple[str, ...]
    """The steers and check reports delivered with this step."""
    label: str = ""
    """The label the driver gave the step (``step(label=...)``)."""
    ended: bool = False
    """This step's commit also ended the turn (its answer was final and nothing was
    pending): the driver must return."""


@runtime_checkable
class DriverTurn(Protocol):
    """The turn as a driver sees it, and the only way it runs a step."""

    @property
    def prompt(self) -> str: ...

    @property
    def input(self) -> DriverInput: ...

    @property
    def history(self) -> tuple[Message, ...]:
        """The committed conversation before this turn, checked (complete tool rounds)."""
        ...

    @property
    def steps(self) -> tuple[DriverStep, ...]:
        """This turn's committed steps, oldest first (it grows as steps commit)."""
        ...

    @property
    def tools(self) -> tuple[ToolDeclaration, ...]:
        """The tools the turn offers (a step may offer fewer)."""
        ...

    @property
    def host_context(self) -> dict[str, Any]: ...

    @property
    def options(self) -> Any:
        """The turn's :class:`~parley.ports.host.TurnOptions`."""
        ...

    def messages(self, steps: Sequence[DriverStep] | None = None) -> tuple[Message, ...]:
        """This turn's conversation as parley replays it: the prompt, then ``steps``
        (default: every committed step) with their inputs, calls and results."""
        ...

    def step(
        self,
        *,
        messages: Sequence[Message] | None = None,
        tools: Sequence[str] | None = None,
        final: bool = True,
        label: str = "",
    ) -> DriverStep:
        """Run one step at a boundary and commit it; returns it once committed.

        ``messages`` is this turn's part of the request (default :meth:`messages`):
        parley puts the committed history before it and the inputs pending at this
        boundary after it, fits the whole to the host's context budget and checks it (an
        incomplete tool round fails the turn with ``CodecError``).  ``tools`` names the
        tools this step offers (default all); a call to another is answered with an
        error result.  ``final``: an answer without tool calls is the turn's reply, and
        the turn ends with this step's commit when nothing is pending (``ended``);
        False for a step whose answer the driver uses itself (a plan).  ``label``
        (up to 64 characters) is stored with the step, for the driver to find it again.

        When the turn must stop instead (an interrupt, a spent budget, a call that waits
        for a person, a failed model, a lost session), this raises :class:`TurnStopped`,
        which a driver must let through (it derives from ``BaseException`` so that an
        ``except Exception`` does not swallow it)."""
        ...


@runtime_checkable
class SessionDriver(Protocol):
    """Runs a turn's steps for one input (see the module's contract)."""

    def drive(self, turn: DriverTurn) -> None:
        """Run steps until the input is answered, then return.  The last committed step's
        text is the turn's reply.  Raise :class:`~parley.errors.DriverFailed` (with what
        was accumulated as ``partial``) to fail the turn."""
        ...


class TurnStopped(BaseException):
    """The turn stops at this step (why is the engine's): raised by
    :meth:`DriverTurn.step` to unwind the driver.  A driver's ``finally`` blocks run; a
    driver that catches it anyway cannot keep the turn going (the engine knows)."""
