"""What one attempt at a turn carries between its boundaries, and how it ends (shared by
the step loop, its steps, the approvals it holds a step for, and the turn a driver is
handed)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from parley.engine.call_admission import Throttle
from parley.engine.contract_check import CheckResult
from parley.engine.emitter import StreamingSink
from parley.ports.backend import CommittedStep, FinishReceipt, Spawned
from parley.schemas.messages import StepInput
from parley.schemas.records import Steer, SteerKind, TurnStatus, Usage


@dataclass(kw_only=True)
class Ending:
    """How one attempt at a turn ends: its outcome, and what its end commits."""

    status: TurnStatus
    reply: str | None = None
    error: str | None = None
    partial: str | None = None
    receipt: FinishReceipt | None = None
    """Set when the turn's end was committed with its last step."""
    discarded: Usage = field(default_factory=Usage)
    """What a step thrown away at the end cost (a vetoed answer): charged with the end."""
    throttle: Throttle | None = None
    """Set when the attempt lets go to wait for provider capacity (status ``queued``)."""
    spawned: Spawned | None = None
    """Set when a step is held for its agent calls' child turns (status ``waiting``)."""
    wake_in: float | None = None
    """Set when a step is held for events with a deadline (status ``waiting``): the
    seconds until its soonest, when the driver's process wakes it if it still waits."""


@dataclass(frozen=True, kw_only=True)
class Deferred:
    """What an attempt that let go to wait for capacity asks of its driver: a kick of
    its session in ``seconds``, on the queue of ``priority``."""

    seconds: float
    priority: str


@dataclass(kw_only=True)
class TurnState:
    """What one attempt at a turn knows between its boundaries."""

    steps: list[CommittedStep]
    cursor: int
    pending: list[Steer]
    # How many steers the run had accepted when the store last said (the claim, the
    # latest step commit): the steer list must hold those past the cursor to be trusted.
    steer_count: int
    usage: Usage
    session_tokens: int
    feedback: list[StepInput] = field(default_factory=list)
    # The steer list as read with the latest step's event, for the boundary after it.
    listed: list[Steer] | None = None
    inbox_closed: bool = False
    first_boundary: bool = True
    # The contract's check run on the final answer of the step at this index.
    contract_checked: tuple[int, CheckResult] | None = None
    # The boundary after the driver answered was looked at (steers taken, nothing to
    # stop for) when it brought a new input: the next drive's first step starts there.
    boundary_settled: bool = False
    # The sink of the step in flight, until that step commits (or is held): a step that
    # fails retracts what it streamed.
    streaming: StreamingSink | None = None


def has_interrupt(steers: Sequence[Any]) -> bool:
    """Whether an interrupt is among ``steers``."""
    return any(s.kind is SteerKind.INTERRUPT for s in steers)
