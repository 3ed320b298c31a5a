"""Runs a session's turns in order while holding its lock (the handler of a *kick*).

A kick names a session, never a turn: whoever holds the session's lock runs a stranded
running turn first, then queued turns oldest first.  Duplicate kicks are harmless — they
find the lock taken and return.  Before letting go, the driver looks once more, and after
letting go it looks again, so a turn submitted at the very moment of release still runs.
"""

from __future__ import annotations

import logging

from schemas.errors import Conflict, Fenced
from workers.engine import TurnEngine

log = logging.getLogger("parley.driver")


class SessionDriver:
    """Drains one session's runnable turns with one engine."""

    def __init__(self, engine: TurnEngine) -> None:
        self.engine = engine
        self.store = engine.store
        self.coordinator = engine.coordinator

    def drive(self, session_id: str) -> int:
        """Run every runnable turn of the session; returns how many ran here."""
        ran = 0
        while True:
            lock = self.coordinator.try_lock(session_id)
            if lock is None:
                return ran  # another driver has it; it will see our turn
            try:
                fence = self.store.take_fence(session_id)
                while lock.held():
                    turn_id = self.store.next_turn(session_id)
                    if turn_id is None:
                        break
                    try:
                        self.engine.run(turn_id, fence, holding=lock.held)
                    except Conflict:
                        # The turn ended under another driver between our look and the
                        # claim; look again.
                        log.info("turn %s no longer runnable; moving on", turn_id)
                        continue
                    ran += 1
            except Fenced:
                log.warning("lost session %s to another driver", session_id)
                return ran
            finally:
                lock.release()
            if self.store.next_turn(session_id) is None:
                return ran
