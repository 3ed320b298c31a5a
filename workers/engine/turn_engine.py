"""The turn engine: runs (or continues) one claimed turn under a fencing token.

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

An attempt's parts, each a module of its own: its fenced identity and writes
(:mod:`~workers.engine.fenced_run`), its setup (:mod:`~workers.engine.turn_setup`), its
drives (:mod:`~workers.engine.turn_loop`), the phases of a step
(:mod:`~workers.engine.turn_step`), the boundary (:mod:`~workers.engine.steer_boundary`),
the commit (:mod:`~workers.engine.step_committer`), the contract
(:mod:`~workers.engine.contract_terms`) and the end (:mod:`~workers.engine.turn_finish`).
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

from schemas.errors import Fenced, ParleyError, StoreError
from schemas.events import StepRestarted
from schemas.records import TurnStatus
from workers.engine.attempt import Attempt, options_of, tool_context_of
from workers.engine.call_admission import AdmissionSettings, CallAdmission
from workers.engine.contract_terms import ContractTerms
from workers.engine.emitter import Emitter
from workers.engine.fenced_run import FencedRun, FencedStore
from workers.engine.held_step import HeldStep
from workers.engine.replay_cache import ReplayCache
from workers.engine.steer_boundary import SteerBoundary
from workers.engine.step_committer import StepCommitter
from workers.engine.turn_approvals import Approvals
from workers.engine.turn_finish import TurnFinisher
from workers.engine.turn_history import TurnHistory
from workers.engine.turn_loop import TurnLoop
from workers.engine.turn_setup import PrefixChoice, TurnSetup
from workers.engine.turn_state import Deferred, Ending, TurnState
from workers.engine.turn_step import StepParts
from workers.ports.admission import Admission
from workers.ports.backend import (
    Claim,
    ClaimedTurn,
    Coordinator,
    FinishReceipt,
    SeqFloor,
    Store,
)
from workers.ports.host import HostPort

log = logging.getLogger("parley.engine")

MAX_ATTEMPTS = 10
"""A turn claimed this many times in a row without committing a step ends ``failed`` (a
crash loop).  Claims that made progress do not count: a long turn may be taken over any
number of times."""


def _always() -> bool:
    return True


def _never() -> bool:
    return False


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
        admission: Admission | None = None,
        admission_settings: AdmissionSettings | None = None,
    ) -> None:
        """``label`` names this process on the runs it drives (default host:pid:thread).
        ``admission`` shares each model's provider limits with every other caller
        (docs/admission.md; None: every call goes at once), under ``admission_settings``
        (default: from the environment)."""
        self.store = store
        self.coordinator = coordinator
        self.host = host
        self.label = label
        self.replay_cache = ReplayCache()
        self.admission = CallAdmission(
            admission,
            admission_settings or AdmissionSettings.from_env(),
            getattr(host, "limits", None) or {},
        )

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
    ) -> tuple[TurnStatus, FinishReceipt | Deferred | None]:
        """Run a claimed turn to its end; returns its outcome and what its final
        transaction committed (``waiting`` and None: a step waits for answers, and the
        turn holds no driver until they are in; ``queued`` and a :class:`Deferred`: it
        waits for provider capacity, and its session wants a kick when that is due).
        Raises :class:`Fenced` if another driver took over (nothing of this attempt
        after that point is committed).  ``holding`` says
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
    """One attempt at one turn: its parts wired, then run from its claim to its end."""

    def __init__(
        self,
        engine: TurnEngine,
        claimed: ClaimedTurn,
        fence: int,
        emitter: Emitter,
        holding: Callable[[], bool],
        claim_next: Callable[[], bool],
    ):
        identity = FencedRun(
            run_id=claimed.run.run_id, session_id=claimed.session.session_id, fence=fence
        )
        store = FencedStore(engine.store, identity)
        boundary = SteerBoundary(engine.coordinator, store, claimed.turn.turn_id, holding)
        # The options' cancellation check: an interrupt listed past the steers the claim
        # found obeyed already.
        cancelled = functools.partial(boundary.interrupt_listed, claimed.run.steer_cursor)
        self.attempt = Attempt(
            claimed=claimed,
            host=engine.host,
            store=store,
            emitter=emitter,
            holding=holding,
            context=tool_context_of(claimed),
            options=options_of(claimed, cancelled),
        )
        self.setup = TurnSetup(self.attempt)
        self.finisher = TurnFinisher(
            self.attempt,
            engine.replay_cache,
            claim_next=functools.partial(_next_claim, engine.coordinator, claim_next),
            worker=engine.run_label,
        )
        self.parts = _step_parts(engine, self.attempt, boundary, self.finisher)
        held = claimed.run.held_step
        # A step that waited for answers, to run and commit before anything else.
        self.held: HeldStep | None = HeldStep.from_json(held) if held else None

    def run(self) -> tuple[TurnStatus, FinishReceipt | Deferred | None]:
        claimed = self.attempt.claimed
        state = TurnState(
            steps=list(claimed.steps),
            cursor=claimed.run.steer_cursor,
            pending=list(claimed.pending),
            steer_count=claimed.run.steer_cursor + len(claimed.pending),
            usage=claimed.run.usage,
            session_tokens=claimed.session.tokens_used,
        )
        if claimed.previous_status == TurnStatus.RUNNING or claimed.run.partial:
            self._restarted(len(state.steps))
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
            return self.finisher.finish(state, ending, PrefixChoice())
        ending, choice = self._attempted(state)
        return self.finisher.finish(state, ending, choice)

    def _restarted(self, index: int) -> None:
        """A step of an earlier attempt streamed and never committed: tell readers to
        drop its provisional text before the redone step's tokens arrive."""
        emitter = self.attempt.emitter
        emitter.emit(StepRestarted(step=index, reason="resumed"))
        if self.held is not None and self.held.payload.text:
            # A held step's calls are redone, not its model output: its kept text is
            # what it streams this time, as its tokens after the restart.
            emitter.emit_delta(self.held.index, self.held.payload.text)

    def _attempted(self, state: TurnState) -> tuple[Ending, PrefixChoice]:
        """Prepare and drive the turn: how it ends, and the prefix it ran with (none
        when its preparation failed)."""
        choice = PrefixChoice()
        try:
            try:
                prepared = self.setup.prepare()
                choice = prepared.choice
                ending = TurnLoop(self.attempt, prepared, self.parts).run(state, self.held)
            finally:
                self.setup.close()
        except (Fenced, StoreError):
            # Lost the session, or the database failed: leave the turn running for the
            # next driver, which continues it from its last committed step.
            raise
        except Exception as exc:
            if not isinstance(exc, ParleyError):
                turn_id = self.attempt.turn.turn_id
                log.warning("turn %s failed in host code", turn_id, exc_info=True)
            if state.streaming is not None:
                # Its step will not commit: a resumed attempt's tokens for it must not
                # read as a continuation of what it streamed.
                state.streaming.retract("failed")
            ending = Ending(status=TurnStatus.FAILED, error=f"{type(exc).__name__}: {exc}")
        return ending, choice


def _next_claim(coordinator: Coordinator, claim_next: Callable[[], bool]) -> SeqFloor | None:
    """What the turn's final transaction claims the session's next turn with, while
    ``claim_next`` says it should."""
    return coordinator.adopt if claim_next() else None


def _step_parts(
    engine: TurnEngine, attempt: Attempt, boundary: SteerBoundary, finisher: TurnFinisher
) -> StepParts:
    claimed, store, emitter = attempt.claimed, attempt.store, attempt.emitter
    committer = StepCommitter(store, emitter)
    approvals = Approvals(
        store,
        emitter,
        committer,
        turn_id=claimed.turn.turn_id,
        timeout=engine.host.approval_timeout,
    )
    return StepParts(
        boundary=boundary,
        terms=ContractTerms(claimed, emitter, attempt.holding),
        history=TurnHistory(claimed.history, engine.store, engine.replay_cache),
        committer=committer,
        approvals=approvals,
        finisher=finisher,
        admission=engine.admission,
    )
