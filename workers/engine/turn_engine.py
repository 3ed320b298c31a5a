"""The step loop: runs (or continues) one turn under a fencing token.

Each step: take the steers pending at the boundary (an interrupt ends the turn), call the
model while publishing every delta, run the tool calls through policy and approver, then
commit the whole step in one transaction.  When the model stops, the inbox is closed in
the same transaction as the last step, or one more step runs for the steer that slipped in;
with nothing pending, that transaction also commits the turn's end (a contract's check runs
before it, on the final answer).
A step with a call that must wait for a person's answer is held instead of committed
(``workers.engine.turn_approvals``, ``workers.engine.held_step``): the turn waits,
holding no driver, and the driver that claims it once the answers are in runs the step's
calls and commits it before anything else.
The engine talks only to the ports in :mod:`workers.ports.host` (the host) and
:mod:`workers.ports.backend` (the store and the coordinator).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from schemas.errors import (
    DriverFailed,
    Fenced,
    InvalidRequest,
    ParleyError,
    PrefixFrozen,
    StoreError,
)
from schemas.events import (
    Checked,
    Event,
    Steered,
    StepCommitted,
    StepRestarted,
)
from schemas.messages import (
    Message,
    Prefix,
    StepInput,
    StepPayload,
    request_digest,
)
from schemas.records import Steer, SteerKind, TaskContract, TurnStatus
from workers.engine.context import assemble_request, history_messages, turn_messages, turn_replay
from workers.engine.contract_check import CheckResult, run_contract_check
from workers.engine.driven_turn import DrivenTurn
from workers.engine.emitter import Emitter, StreamingSink
from workers.engine.held_step import HeldStep
from workers.engine.holding import ensure_holding
from workers.engine.replay_cache import ReplayCache
from workers.engine.tool_calls import ToolRunner, unique_ids
from workers.engine.transcript import rows as transcript_rows
from workers.engine.turn_approvals import approvals_summary, go_on, hold
from workers.engine.turn_state import Ending, TurnState, has_interrupt
from workers.ports.backend import (
    Claim,
    ClaimedTurn,
    CommittedStep,
    Coordinator,
    FinishReceipt,
    PathTurn,
    Store,
    TurnEnd,
)
from workers.ports.driver import DriverInput, TurnStopped
from workers.ports.host import (
    CommitReceipt,
    HostPort,
    ModelRequest,
    PrefixSnapshot,
    SessionStateView,
    StreamAborted,
    Tool,
    ToolContext,
    TurnOptions,
    TurnOutcome,
    TurnPreparation,
    TurnRequest,
)
from workers.telemetry import metrics

log = logging.getLogger("parley.engine")

MAX_ATTEMPTS = 10
"""A turn claimed this many times in a row without committing a step ends ``failed`` (a
crash loop).  Claims that made progress do not count: a long turn may be taken over any
number of times."""


def _always() -> bool:
    return True


def _never() -> bool:
    return False


def _nothing() -> None:
    return None


@functools.cache
def _host() -> str:
    return socket.gethostname()  # a system call: asked once per process


def worker_name() -> str:
    """host:pid:thread, stored on the run so an operator can tell who ran it."""
    return f"{_host()}:{os.getpid()}:{threading.current_thread().name}"


class TurnEngine:
    """Runs turns for one host against one store and one coordinator."""

    def __init__(
        self,
        *,
        store: Store,
        coordinator: Coordinator,
        host: HostPort,
        label: str | None = None,
    ) -> None:
        """``label`` names this process on the runs it drives (default host:pid:thread)."""
        self.store = store
        self.coordinator = coordinator
        self.host = host
        self.label = label
        self.replay_cache = ReplayCache()

    # ------------------------------------------------------------------ entry

    def run_label(self) -> str:
        """The name stored on the runs this engine claims (their ``worker`` column)."""
        return self.label or worker_name()

    def run_claimed(
        self,
        claim: Claim,
        fence: int,
        *,
        holding: Callable[[], bool] = _always,
        claim_next: Callable[[], bool] = _never,
    ) -> tuple[TurnStatus, FinishReceipt | None]:
        """Run a claimed turn to its end; returns its outcome and what its final
        transaction committed (``waiting`` and None: a step waits for answers, and the
        turn holds no driver until they are in).  Raises :class:`Fenced` if another driver took
        over (nothing of this attempt after that point is committed).  ``holding`` says
        whether the session lock is still ours: checked at every step boundary, so a
        driver that lost it stops before paying for another model call.  While
        ``claim_next`` says so (asked when the turn ends), the turn's final transaction
        also claims the session's next runnable turn (the receipt's ``next_claim``)."""
        claimed, started = claim
        emitter = Emitter(claimed.turn.turn_id, claimed.next_seq, self.coordinator, fence)
        # Sent from this thread: left to the flusher, its send would hold up the first
        # token's.
        emitter.publish(started, now=True)
        return _TurnRun(self, claimed, fence, emitter, holding, claim_next).run()


class _TurnRun:
    """One attempt at one turn."""

    def __init__(
        self,
        engine: TurnEngine,
        claimed: ClaimedTurn,
        fence: int,
        emitter: Emitter,
        holding: Callable[[], bool],
        claim_next: Callable[[], bool],
    ):
        self.engine = engine
        self.store = engine.store
        self.host = engine.host
        self.hooks = engine.host.hook_set
        self.driver = engine.host.driver
        self.claimed = claimed
        self.fence = fence
        self.emitter = emitter
        self.holding = holding
        self.claim_next = claim_next
        self.turn = claimed.turn
        self.run_id = claimed.run.run_id
        self.contract: TaskContract | None = claimed.run.contract
        # A final answer the model gives is checked by the contract's command, if any; one
        # that passes (or has nothing to pass) ends the turn with this outcome.
        self.contract_checks = bool(self.contract and self.contract.check)
        self.answered = TurnStatus.SUCCEEDED if self.contract_checks else TurnStatus.FINISHED
        self.root = claimed.session.root
        self.context = ToolContext(
            root=self.root,
            session_id=claimed.session.session_id,
            turn_id=claimed.turn.turn_id,
            host_context=claimed.run.host_context,
        )
        self.options = TurnOptions(
            request_id=claimed.turn.request_id,
            session_id=claimed.session.session_id,
            turn_id=claimed.turn.turn_id,
            run_id=claimed.run.run_id,
            attempt=claimed.run.attempts + 1,
            resume=_resume_kind(claimed),
            host_context=claimed.run.host_context,
            cancelled=self._interrupt_accepted,
        )
        self.tools: dict[str, Tool] = {}
        self.tool_runner: ToolRunner  # once the tools are settled (_prepare)
        self.prefix: Prefix | None = None
        self.request_prefix: Prefix | None = None
        self._close_tools: Callable[[], None] = _nothing
        self.refresh_prefix = False
        self.history: tuple[Message, ...] | None = None
        # The sink of the step in flight, until that step commits.
        self.streaming: StreamingSink | None = None
        held = claimed.run.held_step
        # A step that waited for answers, to run and commit before anything else.
        self.held: HeldStep | None = HeldStep.from_json(held) if held else None
        # Whether any call of the turn ever asked (its end then lists the answers).
        self.asked = claimed.run.approval_count > 0

    def _interrupt_accepted(self) -> bool:
        """Whether an interrupt was accepted for this turn (the options' cancellation
        check): the turn's steer list, past the steers this attempt has consumed."""
        coordinator = self.engine.coordinator
        cursor = self.claimed.run.steer_cursor  # those before it were obeyed already
        return has_interrupt(coordinator.steers_after(self.turn.turn_id, cursor))

    # ------------------------------------------------------------------ turn

    def run(self) -> tuple[TurnStatus, FinishReceipt | None]:
        claimed = self.claimed
        state = TurnState(
            steps=list(claimed.steps),
            cursor=claimed.run.steer_cursor,
            pending=list(claimed.pending),
            steer_count=claimed.run.steer_cursor + len(claimed.pending),
            usage=claimed.run.usage,
            session_tokens=claimed.session.tokens_used,
        )
        if claimed.previous_status == TurnStatus.RUNNING or claimed.run.partial:
            # A step of an earlier attempt streamed and never committed: tell readers to
            # drop its provisional text before the redone step's tokens arrive.
            self.emitter.emit(StepRestarted(step=len(state.steps), reason="resumed"))
            if self.held is not None and self.held.payload.text:
                # A held step's calls are redone, not its model output: its kept text is
                # what it streams this time, as its tokens after the restart.
                self.emitter.emit_delta(self.held.index, self.held.payload.text)
        if claimed.run.stalled_attempts + 1 > MAX_ATTEMPTS:
            # Something kills every driver of this turn before it commits a step: stop
            # paying for it.
            ending = Ending(
                status=TurnStatus.FAILED,
                error=(
                    f"gave up after {claimed.run.stalled_attempts} attempts in a row "
                    "that committed no step"
                ),
            )
            return self._finish(state, ending)
        try:
            try:
                self._prepare()
                ending = self._loop(state)
            finally:
                self._close_turn_tools()
        except (Fenced, StoreError):
            # Lost the session, or the database failed: leave the turn running for the
            # next driver, which continues it from its last committed step.
            raise
        except Exception as exc:
            if not isinstance(exc, ParleyError):
                log.warning("turn %s failed in host code", self.turn.turn_id, exc_info=True)
            if self.streaming is not None:
                # Its step will not commit: a resumed attempt's tokens for it must not
                # read as a continuation of what it streamed.
                self.streaming.retract("failed")
            ending = Ending(status=TurnStatus.FAILED, error=f"{type(exc).__name__}: {exc}")
        return self._finish(state, ending)

    def _prepare(self) -> None:
        """Settle the prefix and the tools for this turn (``before_turn`` may change both)."""
        host = self.host
        # Opening the toolset may start the contract's MCP servers (processes of their
        # own): not for a driver that lost the session while before it.
        ensure_holding(self.holding, "before the turn's tools opened")
        toolset = host.toolset(self.contract, self.context)
        self._close_tools = toolset.close
        tools = toolset.stable
        candidate = Prefix(
            system_prompt=host.system_prompt, tools=tuple(t.declaration for t in tools)
        )
        preparation = self._before_turn()
        snapshot: PrefixSnapshot | None = preparation.prefix if preparation else None
        if preparation is not None and preparation.tools is not None:
            tools = preparation.tools
            if snapshot is None:
                candidate = Prefix(
                    system_prompt=candidate.system_prompt,
                    tools=tuple(t.declaration for t in tools),
                )
        frozen = self.claimed.prefix
        if frozen is None:
            self.prefix = snapshot.prefix if snapshot else candidate
        elif snapshot is not None and snapshot.refresh:
            self.prefix, self.refresh_prefix = snapshot.prefix, True
        elif snapshot is not None and snapshot.prefix != frozen:
            raise PrefixFrozen(
                "the session's prefix is frozen after its first committed turn; "
                "use PrefixSnapshot.refreshing(...) to replace it"
            )
        else:
            self.prefix = frozen
        self.tools = {t.declaration.name: t for t in (*tools, *toolset.extra)}
        self.tool_runner = ToolRunner(
            tools=self.tools,
            policy=host.policy,
            approver=host.approver,
            context=self.context,
            emitter=self.emitter,
            holding=self.holding,
            output_limit=host.tool_output_limit,
        )
        if toolset.extra:
            # This turn's own tools come after the frozen declarations: what providers
            # cache (system prompt and the session's tools) stays byte-identical.
            self.request_prefix = Prefix(
                system_prompt=self.prefix.system_prompt,
                tools=(*self.prefix.tools, *(t.declaration for t in toolset.extra)),
            )
        else:
            self.request_prefix = self.prefix

    def _close_turn_tools(self) -> None:
        """Stop what the turn opened (its contract's MCP servers).  A failure to stop is
        logged: it must not turn a finished turn into a failed one, nor hide a fence."""
        try:
            self._close_tools()
        except Exception:
            log.warning("closing the tools of turn %s failed", self.turn.turn_id, exc_info=True)

    def _before_turn(self) -> TurnPreparation | None:
        hook = self.hooks.before_turn
        if hook is None:
            return None
        claimed = self.claimed
        request = TurnRequest(
            session_id=claimed.session.session_id,
            turn_id=self.turn.turn_id,
            run_id=self.run_id,
            prompt=self.turn.prompt,
            contract=self.contract,
        )
        view = SessionStateView(
            session=claimed.session,
            prefix=claimed.prefix,
            history=tuple(p.turn for p in claimed.history),
        )
        try:
            result = hook(request, self.options, view)
        except ParleyError:
            raise
        except Exception as exc:
            raise InvalidRequest(f"before_turn failed: {type(exc).__name__}: {exc}") from exc
        if result is not None and not isinstance(result, TurnPreparation):
            raise InvalidRequest(
                f"before_turn returned {type(result).__name__}, not TurnPreparation"
            )
        return result

    def _loop(self, state: TurnState) -> Ending:
        """Drive the turn: the prompt (or, when steps committed already, a resume), then
        each new input that arrives after the driver answered, until the turn ends."""
        if self.held is not None:
            go_on(self, state, self.held)
            self.held = None
        given = (
            DriverInput(kind="resume")
            if state.steps
            else DriverInput(kind="prompt", texts=(self.turn.prompt,))
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

    def _drive(self, state: TurnState, given: DriverInput) -> Ending | None:
        """One drive of the host's driver for ``given``; the ending a step brought (the
        turn ended, or must stop), or None once the driver answered its input."""
        turn = DrivenTurn(self, state, given, self._history)
        try:
            self.driver.drive(turn)
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
                self.turn.turn_id,
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
            name = type(self.driver).__name__
            return Ending(
                status=TurnStatus.FAILED, error=f"the driver {name} returned before any step"
            ), None
        state.boundary_settled = False
        while True:
            if self._interrupted_at_boundary(state):
                return Ending(status=TurnStatus.CANCELLED), None
            says = [s for s in state.pending if s.kind is SteerKind.SAY]
            exceeded = self._budget_exceeded(state)
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

    def driven_step(
        self,
        state: TurnState,
        *,
        current: tuple[Message, ...] | None,
        offered: frozenset[str] | None,
        final: bool,
        label: str,
    ) -> Ending | None:
        """A step a driver asked for, from its boundary: the ending that stops the turn
        here (or the one its commit made), or None once it committed."""
        if state.boundary_settled:
            state.boundary_settled = False
        elif self._interrupted_at_boundary(state):
            return Ending(status=TurnStatus.CANCELLED)
        exceeded = self._budget_exceeded(state)
        if exceeded:
            return Ending(status=TurnStatus.BUDGET_EXCEEDED, error=exceeded)
        says = [s for s in state.pending if s.kind is SteerKind.SAY]
        return self._step(state, says, current=current, offered=offered, final=final, label=label)

    def _interrupted_at_boundary(self, state: TurnState) -> bool:
        """A step boundary: the lock still ours (or :class:`Fenced`), the pending steers
        taken; whether an interrupt is among them."""
        ensure_holding(self.holding, "at a step boundary")
        self.take_steers(state)
        return has_interrupt(state.pending)

    def _history(self) -> tuple[Message, ...]:
        """The committed history before this turn, as messages (built once per attempt)."""
        if self.history is None:
            self.history = history_messages(self.claimed.history, self._replay_turn)
        return self.history

    def take_steers(self, state: TurnState) -> None:
        """Settle the steers pending at this boundary: the turn's steer list, read in the
        look the boundary makes anyway, unless it lacks steers the store counted (lost
        with Redis, a push that failed or has not landed yet); then the store's inbox."""
        # The first boundary looks afresh: the claim read the inbox before the turn was
        # prepared (hooks, tools), and a steer that arrived meanwhile must reach it.
        fresh, state.first_boundary = state.first_boundary, False
        listed = self._listed_steers(state, fresh=fresh)
        if listed is None and not fresh:
            listed = self._listed_steers(state, fresh=True)  # a look too old to trust
        if listed is not None:
            state.pending = listed
        elif len(state.pending) < state.steer_count - state.cursor:
            state.pending = list(self.store.pending_steers(self.run_id, state.cursor))
        state.steer_count = max(state.steer_count, state.cursor + len(state.pending))

    def _listed_steers(self, state: TurnState, *, fresh: bool) -> list[Steer] | None:
        """The steers pending past the cursor as the steer list has them, or None when
        the list cannot be trusted: a position missing among them, or fewer than the
        store counted."""
        listed, state.listed = state.listed, None
        if listed is None or fresh:
            coordinator = self.engine.coordinator
            listed = coordinator.steers_after(self.turn.turn_id, state.cursor, fresh=fresh)
        if listed:
            # Listed only once committed: the store has at least as many.
            state.steer_count = max(state.steer_count, listed[-1].position)
        in_order = all(s.position == state.cursor + n for n, s in enumerate(listed, 1))
        return listed if in_order and len(listed) >= state.steer_count - state.cursor else None

    def _model_stopped(self, state: TurnState, *, more_steps: bool) -> Ending | None:
        """The model answered without tool calls: check, close the inbox, or go on (only
        while ``more_steps`` are allowed)."""
        reply = state.steps[-1].payload.text
        result = self._contract_check(state, len(state.steps) - 1)
        if result is not None and not result.passed:
            if not more_steps:
                return Ending(status=TurnStatus.CHECK_FAILED, error="the check still fails")
            state.feedback = _failed_check_feedback(result)
            return None
        if not state.inbox_closed and more_steps:
            state.pending = list(
                self.store.close_inbox(
                    run_id=self.run_id,
                    session_id=self.claimed.session.session_id,
                    fence=self.fence,
                    cursor=state.cursor,
                )
            )
            if state.pending:
                return None  # a steer slipped in: run one more step for it
        return Ending(status=self.answered, reply=reply)

    def _contract_check(self, state: TurnState, index: int) -> CheckResult | None:
        """The contract's check of the final answer of step ``index`` (None without a
        check): run once per answer, and announced by a ``check`` event."""
        contract = self.contract
        if contract is None or not contract.check:  # self.contract_checks, in terms mypy can narrow
            return None
        if state.contract_checked is not None and state.contract_checked[0] == index:
            return state.contract_checked[1]
        # It runs before the step commits: a driver that lost the session must not run
        # it in the workspace beside the one that took over.
        ensure_holding(self.holding, "before the check")
        result = run_contract_check(contract.check, self.root, contract.check_timeout)
        self.emitter.emit(
            Checked(passed=result.passed, exit_code=result.exit_code, output=result.output)
        )
        state.contract_checked = (index, result)
        return result

    def _budget_exceeded(self, state: TurnState) -> str | None:
        contract = self.contract
        if contract is not None:
            if contract.max_steps is not None and len(state.steps) >= contract.max_steps:
                return f"max_steps {contract.max_steps} reached"
            if contract.max_tokens is not None and state.usage.total >= contract.max_tokens:
                return f"max_tokens {contract.max_tokens} reached ({state.usage.total} used)"
        ceiling = self.claimed.session.token_ceiling
        if ceiling is not None and state.session_tokens >= ceiling:
            return f"the session's token ceiling {ceiling} is reached"
        return None

    # ------------------------------------------------------------------ step

    def _step(
        self,
        state: TurnState,
        says: list[Any],
        *,
        current: tuple[Message, ...] | None = None,
        offered: frozenset[str] | None = None,
        final: bool = True,
        label: str = "",
    ) -> Ending | None:
        index = len(state.steps)
        inputs = [StepInput(origin="steer", text=s.text) for s in says] + state.feedback
        cursor = max([state.cursor] + [s.position for s in state.pending])
        prefix = self.request_prefix
        assert prefix is not None
        if offered is not None:
            prefix = Prefix(
                system_prompt=prefix.system_prompt,
                tools=tuple(d for d in prefix.tools if d.name in offered),
            )
        budget = self.host.context_budget
        messages = assemble_request(
            self._history(),
            turn_messages(self.turn.prompt, state.steps) if current is None else current,
            inputs,
            fit=(lambda past, now: budget.fit(prefix, past, now)) if budget else None,
        )
        request = ModelRequest(prefix=prefix, messages=messages, context=self.context)

        coordinator = self.engine.coordinator

        def interrupt_pending() -> bool:
            # A listed interrupt is one the store accepted (listed after its commit); past
            # the cursor, it is not one the turn obeyed already.
            return has_interrupt(coordinator.steers_after(self.turn.turn_id, cursor))

        sink = self.streaming = StreamingSink(self.emitter, index, self.holding, interrupt_pending)
        try:
            reply = self.host.model.stream(request, sink)
        except StreamAborted:
            return Ending(status=TurnStatus.CANCELLED, partial=sink.text or None)
        except (Fenced, StoreError):
            raise
        except Exception as exc:
            log.warning("model failed on turn %s step %d", self.turn.turn_id, index, exc_info=True)
            # The step will not commit: retract what it streamed, or a resumed attempt's
            # tokens would be read as a continuation of it.
            sink.restart("failed")
            return Ending(
                status=TurnStatus.FAILED, error=f"model failed: {type(exc).__name__}: {exc}"
            )
        sink.settle(reply.text)
        calls = unique_ids(reply.tool_calls, index)
        judgements = [self.tool_runner.judge(call, offered=offered) for call in calls]
        said = StepPayload(
            inputs=tuple(inputs),
            text=reply.text,
            tool_calls=calls,
            usage=reply.usage,
            request_digest=request_digest(prefix, messages),
            model=reply.model or self.host.model.name,
            label=label,
        )
        if any(j.ask is not None for j in judgements):
            return hold(self, index, said, judgements, cursor, self._delivered(says, index))
        results = [self.tool_runner.answer(j, index) for j in judgements]
        payload = replace(said, tool_results=tuple(results))
        # A final answer is checked before its step commits (the check runs on the
        # workspace its tools left): one that passes, or has nothing to pass, ends the
        # turn in the step's own transaction unless a steer is pending, so that
        # before_commit can judge it before any of it is kept.  One that fails commits
        # its step and the model hears the check's output next, with any steer.  An
        # interrupt already waiting skips the check: the step commits and the boundary
        # stops the turn without waiting for it.
        answered = final and not calls  # a plan a driver asked for is not an answer
        judged = answered and self.contract_checks
        verdict = self._contract_check(state, index) if judged and not interrupt_pending() else None
        idle = answered and (not judged or (verdict is not None and verdict.passed))
        ending = Ending(status=self.answered, reply=reply.text)
        ends_here = idle
        if idle and self.hooks.before_commit is not None:
            # The hook sees (and may veto) that outcome before any of the step commits:
            # vetoed, a resume asks the model again instead of replaying the rejected
            # answer.  Only a final one: the inbox is closed first (atomically against
            # say(), which from then on gets TurnEnded), unless a steer is pending, and
            # then the turn goes on without asking.
            ends_here = not self.store.close_inbox(
                run_id=self.run_id,
                session_id=self.claimed.session.session_id,
                fence=self.fence,
                cursor=cursor,
            )
            if ends_here:
                outcome = self._outcome(state, ending)
                vetoed = self._vetoed(
                    replace(outcome, steps=index + 1, usage=state.usage + reply.usage)
                )
                if vetoed is not None:
                    sink.retract("rejected")
                    vetoed.discarded = reply.usage  # spent, if never committed
                    return vetoed
        announced = self._delivered(says, index)
        announced.append(
            self.emitter.allocate(
                StepCommitted(step=index, text=reply.text, tool_calls=calls, usage=reply.usage)
            )
        )
        receipt = self.store.commit_step(
            run_id=self.run_id,
            session_id=self.claimed.session.session_id,
            fence=self.fence,
            index=index,
            payload=payload,
            steer_cursor=cursor,
            events=[*self.emitter.take_unstored(), *announced],
            close_inbox_if_idle=idle,
            end=self._turn_end(ending, self.emitter.next_seq) if ends_here else None,
        )
        self.committed(state, index, payload, cursor, announced, receipt.steer_count)
        failed = verdict is not None and not verdict.passed
        state.feedback = _failed_check_feedback(verdict) if failed and verdict else []
        state.inbox_closed = idle and receipt.steer_count == cursor
        if receipt.finished is not None:
            self.emitter.skip()  # the seq the committed end took
            ending.receipt = receipt.finished
            return ending
        return None

    def _delivered(self, says: list[Steer], index: int) -> list[Event]:
        """The ``steer`` events of the says in step ``index``'s request, numbered to be
        stored and published with the step: a say is delivered only once a step that
        carries it commits (or is held, to commit once answered), so one taken into a
        step that never commits is reported undelivered at the end, never both."""
        return [
            self.emitter.allocate(Steered(position=s.position, text=s.text, step=index))
            for s in says
        ]

    def committed(
        self,
        state: TurnState,
        index: int,
        payload: StepPayload,
        cursor: int,
        announced: list[Event],
        steer_count: int,
    ) -> None:
        """Step ``index`` committed: publish what it ``announced`` (its steers, then its
        ``step`` event) and move the state past it."""
        self.streaming = None
        metrics.step_committed(payload)
        if steer_count > cursor:
            # Steers are pending, so the next boundary needs the steer list: read in the
            # round trip that sends the step's events.
            state.listed = self.emitter.publish_listing_steers(announced, cursor)
        else:
            for event in announced:
                self.emitter.publish(event)
        state.steps.append(CommittedStep(index=index, payload=payload))
        state.cursor = cursor
        state.pending = []  # those the commit counted past the cursor: read at the boundary
        state.steer_count = max(state.steer_count, steer_count)
        state.usage = state.usage + payload.usage
        state.session_tokens += payload.usage.total

    def _replay_turn(self, node: PathTurn) -> tuple[Message, ...]:
        """One history turn as checked messages, from the replay cache where it can."""
        cache = self.engine.replay_cache
        turn = node.turn
        replay = cache.get(turn.turn_id) if node.steps is None else None
        if replay is None:
            # Not loaded with the claim (cached then) or evicted since: load it now.
            steps = node.steps if node.steps is not None else self.store.steps_of(turn.turn_id)
            replay = turn_replay(turn.prompt, steps)
            cache.put(turn.turn_id, turn.status, replay)
        return replay

    # ------------------------------------------------------------------ end

    def _finish(self, state: TurnState, ending: Ending) -> tuple[TurnStatus, FinishReceipt | None]:
        if ending.status is TurnStatus.WAITING:
            # Held, not ended: no end, no hooks, no receipt; the driver lets the session
            # go (the turn holds its session's line, so nothing after it is claimed).
            return ending.status, None
        outcome = self._outcome(state, ending)
        hooks = self.hooks
        completed = ending.status not in (TurnStatus.CANCELLED, TurnStatus.FAILED)
        receipt = ending.receipt
        if receipt is None:
            vetoed = self._vetoed(outcome) if completed else None
            if vetoed is not None:
                ending, completed = vetoed, False
                outcome = self._outcome(state, ending)
            receipt = self.store.finish_turn(
                run_id=self.run_id,
                session_id=self.claimed.session.session_id,
                fence=self.fence,
                cursor=state.cursor,
                events=self.emitter.take_unstored(),
                end=self._turn_end(ending, self.emitter.skip()),
            )
        if ending.status.settled:
            self.engine.replay_cache.put(
                self.turn.turn_id, ending.status, turn_replay(self.turn.prompt, state.steps)
            )
        self.emitter.publish(receipt.end_event)
        if completed:
            _observe(
                hooks.after_commit,
                CommitReceipt(
                    outcome=outcome,
                    head_turn_id=receipt.head_turn_id,
                    prefix_generation=receipt.prefix_generation,
                    committed_at=datetime.now(UTC),
                    options=self.options,
                    host_context=self.options.host_context,
                    path=(*(p.turn.turn_id for p in self.claimed.history), self.turn.turn_id),
                    delta=tuple(transcript_rows(self.turn.turn_id, self.turn.prompt, state.steps)),
                ),
            )
        _observe(hooks.on_terminal, outcome)
        return ending.status, receipt

    def _vetoed(self, outcome: TurnOutcome) -> Ending | None:
        """The failure ``before_commit`` makes of ``outcome``, if it rejects it."""
        before_commit = self.hooks.before_commit
        if before_commit is None:
            return None
        try:
            before_commit(outcome, {"prefix": self.prefix})
        except Exception as exc:
            return Ending(
                status=TurnStatus.FAILED,
                error=f"rejected by before_commit: {type(exc).__name__}: {exc}",
            )
        return None

    def _turn_end(self, ending: Ending, end_seq: int) -> TurnEnd:
        """What the turn's final transaction commits for ``ending``."""
        cache = self.engine.replay_cache
        turn_id, settles = self.turn.turn_id, ending.status.settled

        def known(candidate: str) -> bool:
            # The turn finishing now heads the next turn's history; it is cached once its
            # final transaction has committed.
            return (settles and candidate == turn_id) or cache.knows(candidate)

        return TurnEnd(
            turn_id=turn_id,
            status=ending.status,
            end_seq=end_seq,
            reply=ending.reply,
            error=ending.error,
            partial=ending.partial,
            prefix=self.prefix,
            refresh_prefix=self.refresh_prefix,
            claim_next=self.engine.coordinator.adopt if self.claim_next() else None,
            known=known,
            worker=self.engine.run_label(),
            position=self.claimed.run.queue_position,
            path=(*(p.turn for p in self.claimed.history), self.turn),
            discarded=ending.discarded,
            approvals=approvals_summary(self),
            webhook_url=self.host.webhook_url,  # the end's outbox row: see workers.store.outbox
        )

    def _outcome(self, state: TurnState, ending: Ending) -> TurnOutcome:
        return TurnOutcome(
            session_id=self.claimed.session.session_id,
            turn_id=self.turn.turn_id,
            run_id=self.run_id,
            outcome=ending.status.value,
            reply=ending.reply if ending.status.has_reply else None,
            steps=len(state.steps),
            usage=state.usage + ending.discarded,
            error=ending.error,
        )


def _failed_check_feedback(failed: CheckResult) -> list[StepInput]:
    """What the model hears of a failed check, with its next request."""
    return [StepInput(origin="check", text=failed.feedback())]


def _resume_kind(claimed: ClaimedTurn) -> str | None:
    """How this attempt continues its turn (TurnOptions.resume), if it does."""
    if claimed.run.attempts == 0:
        return None
    if claimed.previous_status == TurnStatus.RUNNING:
        return "takeover"
    if claimed.run.held_step is not None:
        return "answers"
    return "resume"


def _observe(hook: Any, argument: Any) -> None:
    """Call an observational hook; its failure is logged and cannot undo the commit."""
    if hook is None:
        return
    try:
        hook(argument)
    except Exception:
        log.warning("observational hook %r failed", hook, exc_info=True)
