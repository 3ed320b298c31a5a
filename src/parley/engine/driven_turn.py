"""The :class:`~parley.ports.driver.DriverTurn` the engine hands a driver for one drive.

Every step a driver runs goes through the engine (:meth:`DrivenRun.step`): the boundary
(the lock still held, the steers taken, an interrupt obeyed), the budgets, the streamed
model call, the tools under policy and approver, the commit.  What stops the turn there
is kept here, and the engine acts on it whatever the driver does after: a driver that
catches :class:`TurnStopped`, or turns a lost session into its own error, cannot keep a
fenced or stopped turn going.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from parley.engine.context import turn_messages
from parley.engine.turn_state import Ending, TurnState
from parley.ports.backend import CommittedStep
from parley.ports.driver import DriverInput, DriverStep, TurnStopped
from parley.ports.host import TurnOptions
from parley.schemas.errors import Fenced, InvalidRequest, StoreError
from parley.schemas.messages import (
    AssistantMessage,
    Message,
    ToolDeclaration,
    ToolMessage,
    UserMessage,
)

MAX_LABEL = 64


@dataclass(frozen=True, kw_only=True)
class StepSpec:
    """What a driver asks of one step: the messages of its turn's part (None: parley's
    replay of the turn), the tools it offers (None: all the turn's), whether an answer
    without calls is the turn's final one, and the step's label."""

    current: tuple[Message, ...] | None = None
    offered: frozenset[str] | None = None
    final: bool = True
    label: str = ""


class DrivenRun(Protocol):
    """What a drive needs of the attempt it belongs to."""

    @property
    def prompt(self) -> str:
        """The turn's prompt."""
        ...

    @property
    def tools(self) -> tuple[ToolDeclaration, ...]:
        """The declarations the turn's requests offer."""
        ...

    @property
    def options(self) -> TurnOptions:
        """What the driver is told of the attempt."""
        ...

    def history(self) -> tuple[Message, ...]:
        """The committed history before the turn, as messages."""
        ...

    def step(self, state: TurnState, spec: StepSpec) -> Ending | None:
        """Run a step from its boundary: the ending that stops the turn there (or the
        one its commit made), or None once it committed."""
        ...


def driver_step(step: CommittedStep, *, ended: bool = False) -> DriverStep:
    """A committed step as a driver reads it."""
    payload = step.payload
    return DriverStep(
        index=step.index,
        text=payload.text,
        tool_calls=payload.tool_calls,
        tool_results=payload.tool_results,
        inputs=tuple(i.text for i in payload.inputs),
        label=payload.label,
        ended=ended,
    )


class DrivenTurn:
    """One drive of one turn attempt (see the module)."""

    def __init__(self, run: DrivenRun, state: TurnState, given: DriverInput) -> None:
        self._run = run
        self._state = state
        self._input = given
        self.stopped: Ending | None = None
        """Why the engine stopped the turn at a step (an interrupt, a budget, a hold …)."""
        self.lost: Fenced | StoreError | None = None
        """The session or the database was lost at a step: the attempt must end as is."""
        self.ended: Ending | None = None
        """A step's commit ended the turn."""
        self._over = False

    # ------------------------------------------------------------------ what it sees

    @property
    def prompt(self) -> str:
        return self._run.prompt

    @property
    def input(self) -> DriverInput:
        return self._input

    @property
    def history(self) -> tuple[Message, ...]:
        return self._run.history()

    @property
    def steps(self) -> tuple[DriverStep, ...]:
        return tuple(driver_step(s) for s in self._state.steps)

    @property
    def tools(self) -> tuple[ToolDeclaration, ...]:
        return self._run.tools

    @property
    def host_context(self) -> dict[str, Any]:
        return dict(self._run.options.host_context)

    @property
    def options(self) -> TurnOptions:
        return self._run.options

    def messages(self, steps: Sequence[DriverStep] | None = None) -> tuple[Message, ...]:
        committed = {s.index: s for s in self._state.steps}
        chosen = list(committed.values())
        if steps is not None:
            try:
                chosen = [committed[s.index] for s in steps]
            except (AttributeError, KeyError) as exc:
                raise InvalidRequest(
                    "messages(steps=...) takes steps of this turn (DriverTurn.steps)"
                ) from exc
        return tuple(turn_messages(self.prompt, chosen))

    # ------------------------------------------------------------------ what it does

    def step(
        self,
        *,
        messages: Sequence[Message] | None = None,
        tools: Sequence[str] | None = None,
        final: bool = True,
        label: str = "",
    ) -> DriverStep:
        if self.stopped is not None or self.lost is not None:
            raise TurnStopped("the turn has stopped")
        if self.ended is not None:
            raise InvalidRequest("the turn ended with its last step: the driver must return")
        if self._over:
            raise InvalidRequest("this drive is over: a driver runs steps only inside drive()")
        current = None if messages is None else _checked_messages(messages)
        offered = None if tools is None else self._offered(tools)
        if not isinstance(label, str) or len(label) > MAX_LABEL:
            raise InvalidRequest(f"step(label=...) is text of up to {MAX_LABEL} characters")
        spec = StepSpec(current=current, offered=offered, final=bool(final), label=label)
        try:
            ending = self._run.step(self._state, spec)
        except (Fenced, StoreError) as exc:
            self.lost = exc
            raise TurnStopped(f"{type(exc).__name__}: {exc}") from exc
        if ending is not None and ending.receipt is not None:
            self.ended = ending
            return driver_step(self._state.steps[-1], ended=True)
        if ending is not None:
            self.stopped = ending
            raise TurnStopped(ending.status.value)
        return driver_step(self._state.steps[-1])

    def close(self) -> None:
        """The drive returned: any later step is refused."""
        self._over = True

    def _offered(self, tools: Sequence[str]) -> frozenset[str]:
        if isinstance(tools, str) or not all(isinstance(t, str) for t in tools):
            raise InvalidRequest("step(tools=...) takes a list of tool names")
        known = {d.name for d in self.tools}
        unknown = sorted(set(tools) - known)
        if unknown:
            raise InvalidRequest(
                f"step(tools=...) names unknown tools {unknown}; the turn offers {sorted(known)}"
            )
        return frozenset(tools)


def _checked_messages(messages: Sequence[Message]) -> tuple[Message, ...]:
    if isinstance(messages, str | bytes) or not all(
        isinstance(m, UserMessage | AssistantMessage | ToolMessage) for m in messages
    ):
        raise InvalidRequest(
            "step(messages=...) takes a list of parley messages (UserMessage, "
            "AssistantMessage, ToolMessage from parley.transcript)"
        )
    return tuple(messages)
