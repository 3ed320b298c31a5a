"""The setting up of one attempt at a turn, before its first step: its tools opened (a
contract's MCP servers among them), ``before_turn`` asked, and the prefix settled (the
session's frozen one, a first one, or a refresh), then closing what the tools opened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from parley.engine.attempt import Attempt
from parley.engine.holding import ensure_holding
from parley.engine.tool_calls import ToolRunner
from parley.engine.turn_history import whole_path
from parley.ports.host import (
    PrefixSnapshot,
    SessionStateView,
    Tool,
    Toolset,
    TurnPreparation,
    TurnRequest,
)
from parley.schemas.errors import InvalidRequest, ParleyError, PrefixFrozen
from parley.schemas.messages import Prefix

log = logging.getLogger("parley.engine")


@dataclass(frozen=True, kw_only=True)
class PrefixChoice:
    """The prefix a turn runs with, as its end commits it: the session's frozen one,
    the turn's first one, or a refresh (``refresh``) that becomes a new generation.  None
    until the turn is prepared."""

    prefix: Prefix | None = None
    refresh: bool = False


@dataclass(frozen=True, kw_only=True)
class PreparedTurn:
    """What the steps of a prepared turn run with."""

    choice: PrefixChoice
    request_prefix: Prefix
    """The prefix its requests carry: the chosen one, then the turn's own tools."""
    tool_runner: ToolRunner


class TurnSetup:
    """Prepares one attempt's turn and closes its tools at its end."""

    def __init__(self, attempt: Attempt) -> None:
        self._attempt = attempt
        self._close_tools: Callable[[], None] = _nothing

    def prepare(self) -> PreparedTurn:
        """Settle the prefix and the tools for this turn (``before_turn`` may change both)."""
        attempt = self._attempt
        # Opening the toolset may start the contract's MCP servers (processes of their
        # own): not for a driver that lost the session while before it.
        ensure_holding(attempt.holding, "before the turn's tools opened")
        toolset = attempt.host.toolset(attempt.claimed.run.contract, attempt.context)
        self._close_tools = toolset.close
        tools = toolset.stable
        candidate = _prefix(attempt.host.system_prompt, tools)
        preparation = self._before_turn()
        snapshot: PrefixSnapshot | None = preparation.prefix if preparation else None
        if preparation is not None and preparation.tools is not None:
            tools = preparation.tools
            if snapshot is None:
                candidate = _prefix(candidate.system_prompt, tools)
        choice = _chosen_prefix(attempt.claimed.prefix, snapshot, candidate)
        return self._prepared(choice, tools, toolset)

    def close(self) -> None:
        """Stop what the turn opened (its contract's MCP servers).  A failure to stop is
        logged: it must not turn a finished turn into a failed one, nor hide a fence."""
        try:
            self._close_tools()
        except Exception:
            turn_id = self._attempt.turn.turn_id
            log.warning("closing the tools of turn %s failed", turn_id, exc_info=True)

    def _prepared(
        self, choice: PrefixChoice, tools: Sequence[Tool], toolset: Toolset
    ) -> PreparedTurn:
        attempt, host = self._attempt, self._attempt.host
        prefix = choice.prefix
        assert prefix is not None  # chosen: the frozen one, or one the turn offers
        runner = ToolRunner(
            tools={t.declaration.name: t for t in (*tools, *toolset.extra)},
            policy=host.policy,
            approver=host.approver,
            context=attempt.context,
            emitter=attempt.emitter,
            holding=attempt.holding,
            output_limit=host.tool_output_limit,
        )
        request_prefix = prefix
        if toolset.extra:
            # This turn's own tools come after the frozen declarations: what providers
            # cache (system prompt and the session's tools) stays byte-identical.
            request_prefix = Prefix(
                system_prompt=prefix.system_prompt,
                tools=(*prefix.tools, *(t.declaration for t in toolset.extra)),
            )
        return PreparedTurn(choice=choice, request_prefix=request_prefix, tool_runner=runner)

    def _before_turn(self) -> TurnPreparation | None:
        attempt = self._attempt
        hook = attempt.hooks.before_turn
        if hook is None:
            return None
        claimed, turn = attempt.claimed, attempt.turn
        request = TurnRequest(
            session_id=claimed.session.session_id,
            turn_id=turn.turn_id,
            run_id=claimed.run.run_id,
            prompt=turn.prompt,
            contract=claimed.run.contract,
        )
        view = SessionStateView(
            session=claimed.session,
            prefix=claimed.prefix,
            history=whole_path(claimed, attempt.store.path),
        )
        try:
            result = hook(request, attempt.options, view)
        except ParleyError:
            raise
        except Exception as exc:
            raise InvalidRequest(f"before_turn failed: {type(exc).__name__}: {exc}") from exc
        if result is not None and not isinstance(result, TurnPreparation):
            raise InvalidRequest(
                f"before_turn returned {type(result).__name__}, not TurnPreparation"
            )
        return result


def _chosen_prefix(
    frozen: Prefix | None, snapshot: PrefixSnapshot | None, candidate: Prefix
) -> PrefixChoice:
    """The session's ``frozen`` prefix, unless it has none yet (then the ``snapshot``
    before_turn offered, else the host's ``candidate``) or the snapshot refreshes it."""
    if frozen is None:
        return PrefixChoice(prefix=snapshot.prefix if snapshot else candidate)
    if snapshot is not None and snapshot.refresh:
        return PrefixChoice(prefix=snapshot.prefix, refresh=True)
    if snapshot is not None and snapshot.prefix != frozen:
        raise PrefixFrozen(
            "the session's prefix is frozen after its first committed turn; "
            "use PrefixSnapshot.refreshing(...) to replace it"
        )
    return PrefixChoice(prefix=frozen)


def _prefix(system_prompt: str, tools: Sequence[Tool]) -> Prefix:
    return Prefix(system_prompt=system_prompt, tools=tuple(t.declaration for t in tools))


def _nothing() -> None:
    return None
