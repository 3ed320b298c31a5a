"""Runs a session's turns in order while holding its lock (the handler of a *kick*).

A kick names a session, never a turn: whoever holds the session's lock runs a stranded
running turn first, then queued turns oldest first.  Duplicate kicks are harmless — they
find the lock taken and return — and a submission sends none while a kick is pending or
a driver holds the session (up to ``KICK_PENDING_SECONDS``).  Letting go returns the
session's work mark: changed since the lock was taken, something was submitted
meanwhile, and the driver goes on.

The drainer is the one holder of a session's lock (its log lines still say "driver", the
name operators' log filters know).  The host's driver (``Host(driver=...)``,
:mod:`parley.ports.driver`) is something else: it runs inside the engine, one turn's
steps at a time, under that lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from parley.engine.turn_engine import TurnEngine
from parley.engine.turn_state import Deferred
from parley.ports.backend import Claim, ClaimedTurn, FinishReceipt, SessionLock, Spawned
from parley.runtime.session_leases import ProcessLeases
from parley.schemas.errors import Fenced
from parley.schemas.records import TurnStatus
from parley.telemetry import metrics, turn_spans
from parley.telemetry.log_context import log_context

log = logging.getLogger("parley.driver")


class SessionDrainer:
    """Drains one session's runnable turns with one engine.

    ``stopping`` says the process is shutting down, and ``slice_seconds`` (None: no limit)
    is how long one drive may keep a worker slot while other sessions' kicks may wait.
    Past either, the driver finishes the turn it runs, claims no other, and, if the
    session has turns left, hands it over with ``hand_over`` (a kick, so that another
    worker, or this one after the kicks queued before it, goes on with it).  With
    ``leases`` (embedded, on a database other processes may share) a session's lock is
    also its lease there.  ``defer`` kicks a session again after some seconds, on the
    queue of a lane: a turn that let go to wait for provider capacity is kicked by it
    when its capacity is due (without it, the sweeper finds the turn then).
    ``held_back`` names the tenants whose fresh interactive turns a drive does not start
    now (src/parley/runtime/interactive_share.py; none by default).  ``kick`` kicks
    another session on the queue of a lane: the child turns a held step opened, and the
    parent a child's end queued again (docs/sub-agents.md); without it, the sweeper
    finds them."""

    def __init__(
        self,
        engine: TurnEngine,
        *,
        stopping: Callable[[], bool] = lambda: False,
        slice_seconds: float | None = None,
        hand_over: Callable[[str], None] = lambda _session_id: None,
        leases: ProcessLeases | None = None,
        defer: Callable[[str, float, str], None] | None = None,
        held_back: Callable[[], frozenset[str]] = frozenset,
        kick: Callable[[str, str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.leases = leases
        self.store = engine.store
        self.coordinator = engine.coordinator
        self.stopping = stopping
        self.slice_seconds = slice_seconds
        self.hand_over = hand_over
        self.defer = defer
        self.held_back = held_back
        self.kick = kick
        self.woken: list[str] = []
        """The sessions a child turn's end gave work during this drainer's drives (its
        parent, or a sibling that took its place): kicked, and the fleet's task drives
        them next itself rather than leave them behind every kick queued before theirs."""

    def drive(self, session_id: str) -> int:
        """Run every runnable turn of the session (at least one, unless stopping, and
        within the slice); returns how many ran here.

        Per turn this costs at most two transactions besides its steps: the claim
        (taken with the fence, or by the previous turn's final transaction) and the
        final one, which a final answer with nothing pending shares with its step.
        Whether anything was submitted meanwhile is told by the work mark that letting go
        of the lock returns, not asked of the database."""
        ran = 0
        ends = None if self.slice_seconds is None else time.monotonic() + self.slice_seconds

        def going_on() -> bool:
            return not self.stopping() and (ends is None or time.monotonic() < ends)

        while True:
            if self.stopping():
                self.hand_over(session_id)
                return ran
            lock = self.coordinator.try_lock(session_id)
            if lock is not None and self.leases is not None:
                lock = self.leases.lease(session_id, lock)
            if lock is None:
                return ran  # another driver has it; it will see our turn
            mark = lock.work_mark
            drained = _Drained()
            try:
                self._drain(session_id, lock, going_on, drained)
                drained.handing_over = not going_on()
            except Fenced:
                # Another driver has the session now; the work-mark check below still
                # runs, in case a kick bounced off our lock meanwhile.
                with _about(drained.running):
                    log.warning("lost session %s to another driver", session_id)
            finally:
                # Later turns are known before letting go: the kick that hands them over
                # is as good as pending already.
                after = lock.release(handing_over=drained.handing_over and drained.later_turns)
            ran += drained.ran
            self._kick_deferred(session_id, drained)
            if drained.handing_over:
                # Turns counted after the last one that ran, or submitted while we held
                # the lock (their kick was left to us): the session goes on after a
                # kick.  With neither, a kick would only cost a worker a lock and a
                # start transaction that finds nothing.
                if drained.later_turns or after != mark:
                    self.hand_over(session_id)
                return ran
            if after == mark:
                return ran

    def _kick_deferred(self, session_id: str, drained: _Drained) -> None:
        """A turn let go to wait for capacity: its session's kick when that is due (sent
        once the lock is let go, so that it finds the session free)."""
        if drained.deferred is not None and self.defer is not None:
            self.defer(session_id, drained.deferred.seconds, drained.deferred.priority)

    def _drain(
        self, session_id: str, lock: SessionLock, going_on: Callable[[], bool], drained: _Drained
    ) -> None:
        """Run the session's runnable turns while the lock is held and ``going_on``."""
        fence, claim = self.store.start_drive(
            session_id,
            worker=self.engine.run_label(),
            seq_floor=self.coordinator.adopt,
            known=self.engine.replay_cache.knows,
            held_back=self.held_back(),
        )
        while claim is not None and lock.held():
            drained.running = claim[0]
            receipt = self._run(claim, fence, lock, going_on)
            drained.running = None
            self._kick_others(receipt)
            if receipt is None or isinstance(receipt, (Deferred, Spawned)):
                # The turn waits for answers, its child turns, or provider capacity,
                # and holds its session's line: nothing after it is runnable until they
                # are in or ended (their kick drives it) or its capacity is due (the
                # deferred kick).
                claim, drained.later_turns = None, False
                if isinstance(receipt, Deferred):
                    drained.deferred = receipt
            else:
                claim, drained.later_turns = receipt.next_claim, receipt.later_turns
            drained.ran += 1

    def _kick_others(self, receipt: FinishReceipt | Deferred | Spawned | None) -> None:
        """The sessions a committed turn's transaction gave work (its children, or its
        parent), kicked now that it is durable.  A kick that cannot be sent is the
        sweeper's: their runs are queued in the database."""
        if isinstance(receipt, Spawned):
            self.coordinator.publish(list(receipt.events))
            kicks = list(receipt.kicks)
        elif isinstance(receipt, FinishReceipt):
            if receipt.parent_events:
                self.coordinator.publish(list(receipt.parent_events))
            kicks = list(receipt.kicks)
            self.woken += [k.session_id for k in kicks]
        else:
            return
        if self.kick is None:
            return
        for kick in kicks:
            try:
                self.kick(kick.session_id, kick.priority)
            except Exception:
                log.warning("could not kick session %s; the sweeper will", kick.session_id)

    def _run(
        self, claim: Claim, fence: int, lock: SessionLock, going_on: Callable[[], bool]
    ) -> FinishReceipt | Deferred | Spawned | None:
        running = claim[0]
        # A turn claimed before the stop or the slice's end is run: left claimed, it
        # would cost its next driver an attempt.
        with (
            _about(running),
            turn_spans.attempt(running, self.store) as span,
            metrics.Driving(running),
        ):
            log.info("running turn %s (attempt %d)", running.turn.turn_id, running.run.attempts + 1)
            status, receipt = self.engine.run_claimed(
                claim, fence, holding=lock.held, claim_next=going_on
            )
            turn_spans.ended(span, status)
            log.info("turn %s %s", running.turn.turn_id, _ended(status))
        return receipt


@dataclass
class _Drained:
    """What one hold of a session's lock did: how many turns ran, the one running (for
    the log line of a lost lock), whether later turns are known, and whether the drive
    hands the session over (stopping, or its slice spent)."""

    ran: int = 0
    running: ClaimedTurn | None = None
    later_turns: bool = False
    handing_over: bool = False
    deferred: Deferred | None = None


def _about(claimed: ClaimedTurn | None) -> AbstractContextManager[None]:
    """The log context of a claimed turn (its session's, when none is running)."""
    if claimed is None:
        return log_context()
    return log_context(
        session_id=claimed.session.session_id,
        turn_id=claimed.turn.turn_id,
        run_id=claimed.run.run_id,
    )


def _ended(status: TurnStatus) -> str:
    if status is TurnStatus.WAITING:
        return "waits for answers, child turns or an event (it holds no worker meanwhile)"
    if status is TurnStatus.QUEUED:
        return "waits for provider capacity (it holds no worker meanwhile)"
    return f"ended: {status.value}"
