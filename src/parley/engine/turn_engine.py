"""The turn engine: runs (or continues) one claimed turn under a fencing token.

Each step: take the steers pending at the boundary (an interrupt ends the turn), call the
model while publishing every delta, run the tool calls through policy and approver, then
commit the whole step in one transaction.  When the model stops, the inbox is closed in
the same transaction as the last step, or one more step runs for the steer that slipped in;
with nothing pending, that transaction also commits the turn's end (a contract's check runs
before it, on the final answer).
A step with a call that must wait for a person's answer is held instead of committed
(``parley.engine.turn_approvals``, ``parley.engine.held_step``): the turn waits,
holding no driver, and the driver that claims it once the answers are in runs the step's
calls and commits it before anything else.

An attempt's parts, each a module of its own: its fenced identity and writes
(:mod:`~parley.engine.fenced_run`), its setup (:mod:`~parley.engine.turn_setup`), its
drives (:mod:`~parley.engine.turn_loop`), the phases of a step
(:mod:`~parley.engine.turn_step`), the boundary (:mod:`~parley.engine.steer_boundary`),
the commit (:mod:`~parley.engine.step_committer`), the contract
(:mod:`~parley.engine.contract_terms`) and the end (:mod:`~parley.engine.turn_finish`).
The engine talks only to the ports in :mod:`parley.ports.host` (the host) and
:mod:`parley.ports.backend` (the store and the coordinator).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
from collections.abc import Callable

from parley.engine.attempt import Attempt, options_of, tool_context_of
from parley.engine.call_admission import AdmissionSettings, CallAdmission
from parley.engine.contract_terms import ContractTerms
from parley.engine.emitter import Emitter
from parley.engine.fenced_run import FencedRun, FencedStore
from parley.engine.held_step import HeldStep
from parley.engine.replay_cache import ReplayCache
from parley.engine.steer_boundary import SteerBoundary
from parley.engine.step_committer import StepCommitter
from parley.engine.turn_agents import AgentCalls
from parley.engine.turn_approvals import Approvals
from parley.engine.turn_compaction import compact_first
from parley.engine.turn_finish import TurnFinisher
from parley.engine.turn_history import TurnHistory, usable_history
from parley.engine.turn_loop import TurnLoop
from parley.engine.turn_setup import PrefixChoice, TurnSetup
from parley.engine.turn_state import Deferred, Ending, TurnState
from parley.engine.turn_step import StepParts
from parley.engine.turn_waits import EventWaits
from parley.ports.admission import Admission
from parley.ports.backend import (
    Claim,
    ClaimedTurn,
    Coordinator,
    FinishReceipt,
    SeqFloor,
    Spawned,
    Store,
)
from parley.ports.host import HostPort, agent_path, native_provider_of
from parley.schemas.errors import Fenced, InvalidRequest, ParleyError, StoreError
from parley.schemas.events import StepRestarted
from parley.schemas.records import REPLAY_TURN_KEY, SteerKind, TurnStatus

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
        (default: admission's defaults, for tests; a process passes what its settings say)."""
        self.store = store
        self.coordinator = coordinator
        self.host = host
        self.label = label
        self.replay_cache = ReplayCache()
        self.admission = CallAdmission(
            admission,
            admission_settings or AdmissionSettings(),
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
    ) -> tuple[TurnStatus, FinishReceipt | Deferred | Spawned | None]:
        """Run a claimed turn to its end; returns its outcome and what its final
        transaction committed (``waiting`` and None: a step waits for answers, and the
        turn holds no driver until they are in; ``waiting`` and :class:`Spawned`: a
        step waits for its agent calls' child turns, whose sessions want a kick;
        ``queued`` and a :class:`Deferred`: it waits for provider capacity, and its
        session wants a kick when that is due).
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
        host, self.unknown_agent = _host_of(engine, claimed)
        self.attempt = Attempt(
            claimed=claimed,
            host=host,
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
        self.engine = engine
        self.parts = _step_parts(engine, self.attempt, boundary, self.finisher)
        held = claimed.run.held_step
        # A step that waited for answers, to run and commit before anything else.
        self.held: HeldStep | None = HeldStep.from_json(held) if held else None

    def run(self) -> tuple[TurnStatus, FinishReceipt | Deferred | Spawned | None]:
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
        if self.unknown_agent is not None:
            # A child turn of an agent this host no longer declares: nothing to run it with.
            ending = Ending(status=TurnStatus.FAILED, error=self.unknown_agent)
            return self.finisher.finish(state, ending, PrefixChoice())
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
                parts = self.parts
                if self.held is None:
                    reads = (self.engine.store, self.engine.replay_cache)
                    parts = compact_first(
                        self.attempt, parts, state, prepared.request_prefix, reads
                    )
                ending = TurnLoop(self.attempt, prepared, parts).run(state, self.held)
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


def _host_of(engine: TurnEngine, claimed: ClaimedTurn) -> tuple[HostPort, str | None]:
    """The host a turn runs with: a replay's (docs/replay.md), a child session's agent's
    (docs/sub-agents.md), else the engine's own; and why there is none, for an agent the
    host does not declare."""
    host = engine.host
    if claimed.session.replay_of is not None:
        return _replay_host(engine, claimed), None
    path = agent_path(claimed.session.agent)
    if not path:
        return host, None
    try:
        return host.for_agent(path), None
    except InvalidRequest as exc:
        return host, str(exc)


def _replay_host(engine: TurnEngine, claimed: ClaimedTurn) -> HostPort:
    """The host of a replay session's turn: the engine's host asked for it (a host
    without ``for_replay``, a driver's own, runs the turn as it is)."""
    for_replay = getattr(engine.host, "for_replay", None)
    if for_replay is None:
        return engine.host
    store, turn_id = engine.store, claimed.turn.turn_id
    original = str(claimed.session.replay_of)
    turns = store.history(original)
    recorded = [s for t in turns for s in store.steps_of(t.turn_id)]
    # The turn whose steers are placed is one of the original's: a host context is the
    # caller's (an HTTP turn's ``context``), and may name any turn, another tenant's too.
    of_turn = claimed.run.host_context.get(REPLAY_TURN_KEY)
    ours = isinstance(of_turn, str) and any(t.turn_id == of_turn for t in turns)
    turn_steps = store.steps_of(str(of_turn)) if ours else []

    def steer(text: str) -> None:
        engine.coordinator.push_steer(turn_id, store.add_steer(turn_id, SteerKind.SAY, text))

    chosen: HostPort = for_replay(claimed.session, recorded, turn_steps, steer)
    return chosen


def _next_claim(coordinator: Coordinator, claim_next: Callable[[], bool]) -> SeqFloor | None:
    """What the turn's final transaction claims the session's next turn with, while
    ``claim_next`` says it should."""
    return coordinator.adopt if claim_next() else None


def _step_parts(
    engine: TurnEngine, attempt: Attempt, boundary: SteerBoundary, finisher: TurnFinisher
) -> StepParts:
    claimed, store, emitter = attempt.claimed, attempt.store, attempt.emitter
    committer = StepCommitter(store, emitter)
    # A native compaction of another provider than the model's is read past.
    path, compaction = usable_history(claimed, engine.store, native_provider_of(attempt.host.model))
    approvals = Approvals(
        store,
        emitter,
        committer,
        turn_id=claimed.turn.turn_id,
        timeout=engine.host.approval_timeout,
    )
    return StepParts(
        agents=AgentCalls(attempt),
        waits=EventWaits(store, emitter, committer, turn_id=claimed.turn.turn_id),
        boundary=boundary,
        terms=ContractTerms(claimed, emitter, attempt.holding),
        history=TurnHistory(path, engine.store, engine.replay_cache, compaction),
        committer=committer,
        approvals=approvals,
        finisher=finisher,
        admission=engine.admission,
    )
