"""Runs a session's turns in order while holding its lock (the handler of a *kick*).

A kick names a session, never a turn: whoever holds the session's lock runs a stranded
running turn first, then queued turns oldest first.  Duplicate kicks are harmless — they
find the lock taken and return — and a submission sends none while a kick is pending or
a driver holds the session (up to ``KICK_PENDING_SECONDS``).  Letting go returns the
session's work mark: changed since the lock was taken, something was submitted
meanwhile, and the driver goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from schemas.errors import Fenced
from workers.engine import TurnEngine

log = logging.getLogger("parley.driver")


class SessionDriver:
    """Drains one session's runnable turns with one engine.

    ``stopping`` says the process is shutting down: the driver then finishes the turn it
    runs, claims no other, and hands the session over with ``hand_over`` (a kick, so that
    another worker goes on with it at once) instead of draining its backlog first."""

    def __init__(
        self,
        engine: TurnEngine,
        *,
        stopping: Callable[[], bool] = lambda: False,
        hand_over: Callable[[str], None] = lambda _session_id: None,
    ) -> None:
        self.engine = engine
        self.store = engine.store
        self.coordinator = engine.coordinator
        self.stopping = stopping
        self.hand_over = hand_over

    def drive(self, session_id: str) -> int:
        """Run every runnable turn of the session; returns how many ran here.

        Per turn this costs at most two transactions besides its steps: the claim
        (taken with the fence, or by the previous turn's final transaction) and the
        final one, which a final answer with nothing pending shares with its step.
        Whether anything was submitted meanwhile is told by the work mark that letting go
        of the lock returns, not asked of the database."""
        ran = 0
        while True:
            if self.stopping():
                self.hand_over(session_id)
                return ran
            lock = self.coordinator.try_lock(session_id)
            if lock is None:
                return ran  # another driver has it; it will see our turn
            mark = lock.work_mark
            stopped = False
            try:
                fence, claim = self.store.start_drive(
                    session_id,
                    worker=self.engine.label(),
                    seq_floor=self.coordinator.adopt,
                    known=self.engine.replay_cache.knows,
                )
                while claim is not None and lock.held():
                    # A turn claimed before the stop is run: left claimed, it would cost
                    # its next driver an attempt.
                    _status, claim = self.engine.run_claimed(
                        claim, fence, holding=lock.held, claim_next=self._going_on
                    )
                    ran += 1
                stopped = self.stopping()
            except Fenced:
                # Another driver has the session now; the work-mark check below still
                # runs, in case a kick bounced off our lock meanwhile.
                log.warning("lost session %s to another driver", session_id)
            finally:
                after = lock.release()
            if stopped:
                # Turns may be left: the session goes to another worker.
                self.hand_over(session_id)
                return ran
            if after == mark:
                return ran

    def _going_on(self) -> bool:
        return not self.stopping()
