"""Whether a process's Redis answers its readers: said on one line when it stops, and on
one when it answers again, rather than on one per failed read (a reader retries every
half second, and a client waiting out an outage would flood its log).

Readers go on meanwhile: PostgreSQL holds every durable event and every turn's end, and
they read the store for what Redis cannot give them.  What they cannot do is see a turn
move that no worker can run: the fleet's workers need Redis for the session locks.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("parley.redis")


class Reachability:
    """What this process's reads of Redis found last: each failure and each answer is
    reported here, and only a change is logged."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._guard = threading.Lock()
        self._cause: str | None = None  # why the latest read failed; None: it answered
        self._since = 0.0

    def failed(self, exc: Exception) -> None:
        """A read failed with ``exc``: logged if Redis answered the one before."""
        cause = f"{type(exc).__name__}: {exc}"
        with self._guard:
            was_up, self._cause = self._cause is None, cause
            if was_up:
                self._since = time.monotonic()
        if was_up:
            log.warning(
                "Redis at %s is unreachable (%s): turns wait for the fleet, whose workers "
                "need it to run them; their events and ends are read from the database "
                "meanwhile",
                self.address,
                cause,
            )

    def answered(self) -> None:
        """A read succeeded: logged if the one before had failed."""
        if self._cause is None:  # the common case, without the lock
            return
        with self._guard:
            was_down, self._cause = self._cause is not None, None
            lasted = time.monotonic() - self._since
        if was_down:
            log.warning("Redis at %s answers again (after %.0f s)", self.address, lasted)

    def outage(self) -> str | None:
        """Why Redis is unreachable, for an error to name (None while it answers)."""
        cause = self._cause
        if cause is None:
            return None
        return f"Redis at {self.address} is unreachable ({cause})"
