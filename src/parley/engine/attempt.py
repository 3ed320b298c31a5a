"""One attempt at a turn, as the parts that run it read it: the claim it runs, the host,
the fenced store, its event writer, the holding check, and what the host's code is told
of it (the tool context, the turn options).  Set once, when the turn is claimed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from parley.engine.emitter import Emitter
from parley.engine.fenced_run import FencedStore
from parley.ports.backend import ClaimedTurn
from parley.ports.host import HookSet, HostPort, ToolContext, TurnOptions
from parley.schemas.records import TurnRecord, TurnStatus


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """What every part of one attempt shares (none of it changes during the attempt)."""

    claimed: ClaimedTurn
    host: HostPort
    store: FencedStore
    emitter: Emitter
    holding: Callable[[], bool]
    """Whether the session lock is still ours (asked before what only its driver may do)."""
    context: ToolContext
    options: TurnOptions

    @property
    def turn(self) -> TurnRecord:
        return self.claimed.turn

    @property
    def hooks(self) -> HookSet:
        return self.host.hook_set


def tool_context_of(claimed: ClaimedTurn) -> ToolContext:
    """What a model or a tool is told of the turn calling it."""
    return ToolContext(
        root=claimed.session.root,
        session_id=claimed.session.session_id,
        turn_id=claimed.turn.turn_id,
        host_context=claimed.run.host_context,
    )


def options_of(claimed: ClaimedTurn, cancelled: Callable[[], bool]) -> TurnOptions:
    """What ``before_turn`` and a driver are told of this attempt; ``cancelled`` says
    whether an interrupt was accepted for the turn."""
    return TurnOptions(
        request_id=claimed.turn.request_id,
        session_id=claimed.session.session_id,
        turn_id=claimed.turn.turn_id,
        run_id=claimed.run.run_id,
        attempt=claimed.run.attempts + 1,
        resume=_resume_kind(claimed),
        host_context=claimed.run.host_context,
        cancelled=cancelled,
    )


def _resume_kind(claimed: ClaimedTurn) -> str | None:
    """How this attempt continues its turn (TurnOptions.resume), if it does."""
    if claimed.run.attempts == 0:
        return None
    if claimed.previous_status == TurnStatus.RUNNING:
        return "takeover"
    held = claimed.run.held_step
    if held is not None and not held.get("resumed"):
        return "answers"  # (a held step marked resumed: the turn's resume, docs/sub-agents.md)
    return "resume"
