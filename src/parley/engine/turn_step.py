"""One step of a turn, in its phases: assemble the request (the history, the turn so far,
the input entering at this boundary), stream the model's answer while publishing every
delta, judge it (its tool calls through policy and approver, a final answer through the
contract's check and ``before_commit``), and commit it whole in one transaction.

A step with a call that must wait for a person's answer is held instead of committed
(:mod:`parley.engine.turn_approvals`).  A final answer that passes (or has nothing to
pass) ends the turn in its step's own transaction, unless a steer is pending.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, replace
from typing import cast

from parley.engine.attempt import Attempt
from parley.engine.call_admission import SHORT_WAIT_SECONDS, CallAdmission, Throttle
from parley.engine.context import assemble_request, turn_messages
from parley.engine.contract_check import CheckResult
from parley.engine.contract_terms import ContractTerms, failed_check_feedback
from parley.engine.driven_turn import StepSpec
from parley.engine.emitter import StreamingSink
from parley.engine.held_step import HeldStep
from parley.engine.steer_boundary import SteerBoundary
from parley.engine.step_committer import EndAt, StepCommitter
from parley.engine.tool_calls import Judgement, unique_ids
from parley.engine.turn_agents import AgentCalls
from parley.engine.turn_approvals import Approvals
from parley.engine.turn_finish import TurnFinisher
from parley.engine.turn_history import TurnHistory
from parley.engine.turn_setup import PreparedTurn
from parley.engine.turn_state import Ending, TurnState
from parley.engine.turn_waits import EventWaits
from parley.ports.admission import Demand, Priority
from parley.ports.backend import CommittedStep
from parley.ports.host import (
    ModelPending,
    ModelReply,
    ModelRequest,
    ModelThrottled,
    StreamAborted,
)
from parley.schemas.errors import Fenced, StoreError
from parley.schemas.messages import Message, Prefix, StepInput, StepPayload, request_digest
from parley.schemas.records import Steer, TurnStatus
from parley.telemetry import metrics, turn_spans

log = logging.getLogger("parley.engine")


@dataclass(frozen=True, kw_only=True)
class StepParts:
    """The parts of one attempt its steps use."""

    boundary: SteerBoundary
    terms: ContractTerms
    history: TurnHistory
    committer: StepCommitter
    approvals: Approvals
    agents: AgentCalls
    waits: EventWaits
    finisher: TurnFinisher
    admission: CallAdmission


@dataclass(frozen=True, kw_only=True)
class _Assembled:
    """A step's request, and what it consumes: the says it carries, the steers up to
    ``cursor``."""

    index: int
    says: list[Steer]
    inputs: list[StepInput]
    cursor: int
    prefix: Prefix
    messages: tuple[Message, ...]


@dataclass(frozen=True, kw_only=True)
class _Judged:
    """What became of a step's answer: the contract's ``verdict`` (None: not checked),
    whether it leaves the turn ``idle`` (its inbox closes with the step), and whether the
    step's transaction ``ends`` the turn."""

    verdict: CheckResult | None
    idle: bool
    ends: bool


class StepRunner:
    """Runs the steps of one prepared attempt."""

    def __init__(self, attempt: Attempt, prepared: PreparedTurn, parts: StepParts) -> None:
        self._attempt = attempt
        self._prepared = prepared
        self._parts = parts

    def run(self, state: TurnState, says: list[Steer], spec: StepSpec) -> Ending | None:
        """Run step ``len(state.steps)`` from its boundary, carrying ``says``: the ending
        it brought (the turn stops, waits or ended with it), or None once it committed."""
        step = self._assemble(state, says, spec)
        sink = state.streaming = StreamingSink(
            self._attempt.emitter,
            step.index,
            self._attempt.holding,
            lambda: self._parts.boundary.interrupt_listed(step.cursor),
        )
        reply = self._stream(step, sink)
        if isinstance(reply, Ending):
            return reply
        sink.settle(reply.text)
        calls = unique_ids(reply.tool_calls, step.index)
        tools = self._prepared.tool_runner
        judgements = self._parts.agents.bounded(
            tools.judge(call, offered=spec.offered) for call in calls
        )
        said = StepPayload(
            inputs=tuple(step.inputs),
            text=reply.text,
            tool_calls=calls,
            usage=reply.usage,
            request_digest=request_digest(step.prefix, step.messages),
            model=reply.model or self._attempt.host.model.name,
            label=spec.label,
        )
        if any(j.ask is not None for j in judgements):
            return self._hold(state, step, said, judgements)
        opening = self._parts.agents.spawning(judgements)
        if opening:
            return self._hold(state, step, said, judgements, opening)
        results = [tools.answer(j, step.index) for j in judgements]
        waiting = tools.take_waits()
        if waiting:
            # A call waits for an event or a time: the step is held with the others'
            # results, its says delivered, until its waits end.
            held = HeldStep(
                index=step.index, payload=said, cursor=step.cursor, judgements=tuple(judgements)
            )
            delivered = self._parts.committer.steer_events(step.says, step.index)
            return self._parts.waits.hold(state, held, results, waiting, delivered, tools)
        payload = replace(said, tool_results=tuple(results))
        return self._judge_and_commit(state, step, payload, final=spec.final, sink=sink)

    # ------------------------------------------------------------------ assemble

    def _assemble(self, state: TurnState, says: list[Steer], spec: StepSpec) -> _Assembled:
        """The step's request: the history, this turn so far (or what the driver built),
        the says and any failed check's output, under the prefix the step offers."""
        inputs = [StepInput(origin="steer", text=s.text) for s in says] + state.feedback
        prefix = self._prepared.request_prefix
        if spec.offered is not None:
            prefix = Prefix(
                system_prompt=prefix.system_prompt,
                tools=tuple(d for d in prefix.tools if d.name in spec.offered),
            )
        budget = self._attempt.host.context_budget
        messages = assemble_request(
            self._parts.history.messages(),
            turn_messages(self._attempt.turn.prompt, state.steps)
            if spec.current is None
            else spec.current,
            inputs,
            fit=(lambda past, now: budget.fit(prefix, past, now)) if budget else None,
        )
        return _Assembled(
            index=len(state.steps),
            says=says,
            inputs=inputs,
            cursor=max([state.cursor] + [s.position for s in state.pending]),
            prefix=prefix,
            messages=messages,
        )

    # ------------------------------------------------------------------ stream

    def _stream(self, step: _Assembled, sink: StreamingSink) -> ModelReply | Ending:
        """The model's answer to the step's request, streamed through ``sink`` once
        admission lets the call go (docs/admission.md); or how the attempt ends instead
        (interrupted, the model failed, or the turn lets go to wait for capacity)."""
        attempt = self._attempt
        request = ModelRequest(
            prefix=step.prefix,
            messages=step.messages,
            context=attempt.context,
            native=self._parts.history.native,
        )
        gate = self._parts.admission
        demand = gate.demand(
            attempt.host.model,
            request,
            priority=cast(Priority, attempt.claimed.run.priority),
            tenant=attempt.claimed.session.tenant or "",
        )
        try:
            while True:
                asked = time.time_ns()
                grant = gate.admit(demand, sink.raise_if_interrupted)
                turn_spans.waited_in_slot(asked, demand.model)
                if isinstance(grant, Throttle):
                    return _deferred(grant, demand)
                sink.on_report = lambda report, granted=grant: gate.observe(granted, report)
                try:
                    reply = self._call(step, request, sink)
                except ModelPending as exc:
                    # Not ready yet (a remote task runs): let go, and ask again then.
                    gate.unused(grant, demand)
                    pending = Throttle(model=demand.model, seconds=exc.seconds, reason="pending")
                    return Ending(status=TurnStatus.QUEUED, throttle=pending)
                except ModelThrottled as exc:
                    wait = gate.refused(grant, exc)
                    if wait > SHORT_WAIT_SECONDS:
                        return _deferred(
                            Throttle(model=demand.model, seconds=wait, reason="penalty"), demand
                        )
                    gate.pause(wait, sink.raise_if_interrupted)
                    continue
                except BaseException:
                    gate.unused(grant, demand)
                    raise
                if isinstance(reply, ModelReply):
                    gate.settle(grant, reply)
                else:
                    gate.unused(grant, demand)
                return reply
        except StreamAborted:  # interrupted while it waited for capacity
            return Ending(status=TurnStatus.CANCELLED)

    def _call(
        self, step: _Assembled, request: ModelRequest, sink: StreamingSink
    ) -> ModelReply | Ending:
        """One admitted call of the model, or how it ended the attempt; a 429 that is
        about rate (:class:`ModelThrottled`) propagates, for admission to handle."""
        attempt = self._attempt
        model = attempt.host.model
        with turn_spans.model_call(model.name, step.index, step.prefix, step.messages) as span:
            try:
                reply = model.stream(request, sink)
            except StreamAborted:
                turn_spans.stopped(span, "cancelled")
                return Ending(status=TurnStatus.CANCELLED, partial=sink.text or None)
            except ModelThrottled:
                turn_spans.stopped(span, "rate_limited")  # a 429: admission handles it
                raise
            except ModelPending:
                turn_spans.stopped(span, "pending")  # asked again after its wait
                raise
            except (Fenced, StoreError):
                raise
            except Exception as exc:
                turn_id = attempt.turn.turn_id
                log.warning("model failed on turn %s step %d", turn_id, step.index, exc_info=True)
                turn_spans.stopped(span, type(exc).__name__)
                # The step will not commit: retract what it streamed, or a resumed
                # attempt's tokens would be read as a continuation of it.
                sink.restart("failed")
                return Ending(
                    status=TurnStatus.FAILED, error=f"model failed: {type(exc).__name__}: {exc}"
                )
            turn_spans.replied(span, reply)
            return reply

    # ------------------------------------------------------------------ judge

    def _hold(
        self,
        state: TurnState,
        step: _Assembled,
        said: StepPayload,
        judgements: list[Judgement],
        opening: list[Judgement] | None = None,
    ) -> Ending:
        """A call asks, or agent calls open child turns (``opening``): the step is
        held, with its says delivered, until answered or until its children ended."""
        delivered = self._parts.committer.steer_events(step.says, step.index)
        held = HeldStep(
            index=step.index, payload=said, cursor=step.cursor, judgements=tuple(judgements)
        )
        if opening:
            return self._parts.agents.hold(state, held, delivered, opening)
        return self._parts.approvals.hold(state, held, delivered)

    def _judge_and_commit(
        self,
        state: TurnState,
        step: _Assembled,
        payload: StepPayload,
        *,
        final: bool,
        sink: StreamingSink,
    ) -> Ending | None:
        """Judge the step's answer and commit the step (unless ``before_commit`` vetoed
        the answer: then nothing of it commits)."""
        # A final answer is checked before its step commits (the check runs on the
        # workspace its tools left): one that passes, or has nothing to pass, ends the
        # turn in the step's own transaction unless a steer is pending, so that
        # before_commit can judge it before any of it is kept.  One that fails commits
        # its step and the model hears the check's output next, with any steer.  An
        # interrupt already waiting skips the check: the step commits and the boundary
        # stops the turn without waiting for it.
        answered = final and not payload.tool_calls  # a plan a driver asked for is not one
        verdict, idle = self._verdict(state, step, answered=answered)
        ending = Ending(status=self._parts.terms.answered, reply=payload.text)
        ends = idle
        if idle and self._attempt.hooks.before_commit is not None:
            # The hook sees (and may veto) that outcome before any of the step commits:
            # vetoed, a resume asks the model again instead of replaying the rejected
            # answer.  Only a final one: the inbox is closed first (atomically against
            # say(), which from then on gets TurnEnded), unless a steer is pending, and
            # then the turn goes on without asking.
            ends = not self._attempt.store.close_inbox(step.cursor)
            vetoed = self._vetoed(state, ending, payload) if ends else None
            if vetoed is not None:
                sink.retract("rejected")
                return vetoed
        judged = _Judged(verdict=verdict, idle=idle, ends=ends)
        return self._commit(state, step, payload, judged, ending)

    def _verdict(
        self, state: TurnState, step: _Assembled, *, answered: bool
    ) -> tuple[CheckResult | None, bool]:
        """The contract's check of an ``answered`` step (not run while an interrupt is
        listed), and whether the answer leaves the turn idle: it passed, or has nothing
        to pass."""
        terms = self._parts.terms
        judged = answered and terms.checks
        listed = judged and self._parts.boundary.interrupt_listed(step.cursor)
        verdict = terms.check(state, step.index) if judged and not listed else None
        idle = answered and (not judged or (verdict is not None and verdict.passed))
        return verdict, idle

    def _vetoed(self, state: TurnState, ending: Ending, payload: StepPayload) -> Ending | None:
        """``before_commit``'s failure of the outcome this step would end the turn with."""
        finisher = self._parts.finisher
        outcome = finisher.outcome(state, ending)
        vetoed = finisher.vetoed(
            replace(outcome, steps=len(state.steps) + 1, usage=state.usage + payload.usage),
            self._prepared.choice,
        )
        if vetoed is not None:
            vetoed.discarded = payload.usage  # spent, if never committed
        return vetoed

    # ------------------------------------------------------------------ commit

    def _commit(
        self,
        state: TurnState,
        step: _Assembled,
        payload: StepPayload,
        judged: _Judged,
        ending: Ending,
    ) -> Ending | None:
        """Commit the step (and the turn's end with it, when it ``ends`` the turn); the
        ending, if its transaction ended the turn."""
        end: EndAt | None = None
        if judged.ends:
            end = functools.partial(
                self._parts.finisher.end_of, ending, choice=self._prepared.choice
            )
        receipt = self._parts.committer.commit(
            state,
            CommittedStep(index=step.index, payload=payload),
            step.cursor,
            says=step.says,
            idle=judged.idle,
            end=end,
        )
        verdict = judged.verdict
        failed = verdict is not None and not verdict.passed
        state.feedback = failed_check_feedback(verdict) if failed and verdict else []
        state.inbox_closed = judged.idle and receipt.steer_count == step.cursor
        if receipt.finished is not None:
            ending.receipt = receipt.finished
            return ending
        return None


def _deferred(throttle: Throttle, demand: Demand) -> Ending:
    """The attempt ends to wait for capacity: the turn lets its session go, queued again
    until ``throttle.seconds`` from now (docs/admission.md)."""
    metrics.admission_waited(demand.model, demand.priority, throttle.seconds, let_go=True)
    return Ending(status=TurnStatus.QUEUED, throttle=throttle)
