"""The drives of one prepared attempt: the host's driver is handed the turn for its input
(the prompt, a resume, steers said since it answered, a failed check's output) and runs
its steps through the engine, each from a boundary (the lock still held, the steers
taken, an interrupt obeyed) and within the contract's budgets.  When the driver answers,
the turn ends with that answer (checked, the inbox closed in the same transaction) or is
driven again for what came after it.
"""

from __future__ import annotations

import logging

from parley.engine.attempt import Attempt
from parley.engine.contract_terms import failed_check_feedback
from parley.engine.driven_turn import DrivenTurn, StepSpec
from parley.engine.held_step import HeldStep
from parley.engine.turn_setup import PreparedTurn
from parley.engine.turn_state import Ending, TurnState, has_interrupt
from parley.engine.turn_step import StepParts, StepRunner
from parley.ports.driver import DriverInput, TurnStopped
from parley.ports.host import ModelRequest, TurnOptions
from parley.schemas.errors import DriverFailed
from parley.schemas.messages import Message, ToolDeclaration, UserMessage
from parley.schemas.records import SteerKind, TurnStatus, Waiting

log = logging.getLogger("parley.engine")


class TurnLoop:
    """Drives one prepared attempt's turn to its ending (a :class:`DrivenRun` to each
    drive)."""

    def __init__(self, attempt: Attempt, prepared: PreparedTurn, parts: StepParts) -> None:
        self._attempt = attempt
        self._prepared = prepared
        self._parts = parts
        self._steps = StepRunner(attempt, prepared, parts)

    def run(self, state: TurnState, held: HeldStep | None) -> Ending:
        """Drive the turn: the ``held`` step first, if it waited for answers; then the
        prompt (or, when steps committed already, a resume), then each new input that
        arrives after the driver answered, until the turn ends."""
        if held is not None:
            self._parts.boundary.take(state)
            interrupted = has_interrupt(state.pending)
            tools = self._prepared.tool_runner
            agents = self._parts.agents
            if any(j.waits for j in held.judgements):
                # Its waits for events ended (or were cancelled by the interrupt).
                self._parts.waits.go_on(state, held, tools)
            else:
                if interrupted and agents.cancelled_children(held):
                    # The interrupt reached the step's children: the step stays held,
                    # uncommitted, so that a resume of the turn resumes the children it
                    # cancelled and goes on with their new results.
                    return Ending(status=TurnStatus.CANCELLED)
                if not interrupted:
                    # A resume: the children the interrupt cancelled run again.  Else
                    # the answers are in: approved agent calls open their children now.
                    opened = agents.resume_cancelled(state, held) or agents.open_answered(
                        state, held
                    )
                    if opened is not None:
                        return opened
                children = agents.results(held)
                waits = self._parts.approvals.go_on(
                    state,
                    held,
                    tools,
                    interrupted=interrupted,
                    children=children,
                    waits=self._parts.waits,
                )
                if waits is not None:
                    return waits
        given = (
            DriverInput(kind="resume")
            if state.steps
            else DriverInput(kind="prompt", texts=(self._attempt.turn.prompt,))
        )
        while True:
            ending = self._drive(state, given)
            if ending is not None:
                return ending
            ending, next_input = self._answered(state)
            if ending is not None:
                return ending
            assert next_input is not None
            given = next_input

    # ------------------------------------------------------------------ DrivenRun

    @property
    def prompt(self) -> str:
        return self._attempt.turn.prompt

    @property
    def tools(self) -> tuple[ToolDeclaration, ...]:
        return self._prepared.request_prefix.tools

    @property
    def options(self) -> TurnOptions:
        return self._attempt.options

    def history(self) -> tuple[Message, ...]:
        return self._parts.history.messages()

    def step(self, state: TurnState, spec: StepSpec) -> Ending | None:
        """A step a driver asked for, from its boundary: the ending that stops the turn
        here (or the one its commit made), or None once it committed."""
        if state.boundary_settled:
            state.boundary_settled = False
        elif self._parts.boundary.interrupted(state):
            self._abandon(state)
            return Ending(status=TurnStatus.CANCELLED)
        exceeded = self._parts.terms.exceeded(state)
        if exceeded:
            return Ending(status=TurnStatus.BUDGET_EXCEEDED, error=exceeded)
        says = [s for s in state.pending if s.kind is SteerKind.SAY]
        return self._steps.run(state, says, spec)

    def _abandon(self, state: TurnState) -> None:
        """The turn is interrupted while its model's answer was pending (its run was
        deferred by :class:`ModelPending`, docs/sub-agents.md#8-remote-agents): the call is
        not made again, so the model's ``abandon`` (if it has one) stops what it waited
        for, the remote task.  A failure there is logged: the turn ends cancelled anyway."""
        attempt = self._attempt
        if attempt.claimed.run.waiting_for is not Waiting.CAPACITY or state.steps:
            return
        abandon = getattr(attempt.host.model, "abandon", None)
        if not callable(abandon):
            return
        request = ModelRequest(
            prefix=self._prepared.request_prefix,
            messages=(UserMessage(text=attempt.turn.prompt),),
            context=attempt.context,
        )
        try:
            abandon(request)
        except Exception:
            log.warning(
                "abandoning turn %s's pending call failed", attempt.turn.turn_id, exc_info=True
            )

    # ------------------------------------------------------------------ drives

    def _drive(self, state: TurnState, given: DriverInput) -> Ending | None:
        """One drive of the host's driver for ``given``; the ending a step brought (the
        turn ended, or must stop), or None once the driver answered its input."""
        turn = DrivenTurn(self, state, given)
        try:
            self._attempt.host.driver.drive(turn)
        except TurnStopped:
            pass
        except DriverFailed as exc:
            if turn.lost is None and turn.stopped is None and turn.ended is None:
                partial = exc.partial if isinstance(exc.partial, str) else None
                return Ending(
                    status=TurnStatus.FAILED, error=f"driver failed: {exc}", partial=partial
                )
        except Exception:
            if turn.lost is None and turn.stopped is None and turn.ended is None:
                raise
            # What stopped the turn at a step comes first: a driver's own failure while
            # it unwinds (or after the turn ended) cannot change the outcome.
            log.warning(
                "the driver of turn %s failed after its turn stopped",
                self._attempt.turn.turn_id,
                exc_info=True,
            )
        finally:
            turn.close()
        if turn.lost is not None:
            raise turn.lost
        return turn.stopped or turn.ended

    def _answered(self, state: TurnState) -> tuple[Ending | None, DriverInput | None]:
        """The driver answered its input: end the turn with that answer (checked, the
        inbox closed), or find the next input (steers said since, a failed check)."""
        if not state.steps:
            name = type(self._attempt.host.driver).__name__
            return Ending(
                status=TurnStatus.FAILED, error=f"the driver {name} returned before any step"
            ), None
        state.boundary_settled = False
        while True:
            if self._parts.boundary.interrupted(state):
                return Ending(status=TurnStatus.CANCELLED), None
            says = [s for s in state.pending if s.kind is SteerKind.SAY]
            exceeded = self._parts.terms.exceeded(state)
            if exceeded is None and (says or state.feedback):
                state.boundary_settled = True
                if says:
                    return None, DriverInput(kind="steer", texts=tuple(s.text for s in says))
                return None, DriverInput(kind="check", texts=tuple(f.text for f in state.feedback))
            # With no budget left for another step, a late steer cannot turn the answer
            # into a budget failure: it is reported undelivered.
            ending = self._model_stopped(state, more_steps=exceeded is None)
            if ending is not None:
                return ending, None
            # A steer slipped in before the inbox closed, or the check failed: look again.

    def _model_stopped(self, state: TurnState, *, more_steps: bool) -> Ending | None:
        """The model answered without tool calls: check, close the inbox, or go on (only
        while ``more_steps`` are allowed)."""
        reply = state.steps[-1].payload.text
        terms = self._parts.terms
        result = terms.check(state, len(state.steps) - 1)
        if result is not None and not result.passed:
            if not more_steps:
                return Ending(status=TurnStatus.CHECK_FAILED, error="the check still fails")
            state.feedback = failed_check_feedback(result)
            return None
        if not state.inbox_closed and more_steps:
            state.pending = list(self._attempt.store.close_inbox(state.cursor))
            if state.pending:
                return None  # a steer slipped in: run one more step for it
        return Ending(status=terms.answered, reply=reply)
