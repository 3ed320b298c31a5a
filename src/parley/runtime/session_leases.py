"""Session leases: the lock of the embedded deployment, across the processes that share
one database.

In one process the in-process coordinator keeps one driver per session.  Two processes
on one SQLite file (a gateway and a script, or a gateway restarted after a crash) each
have their own, so the session's lock must also live where both can see it: a row in
``session_leases`` naming the holding process, renewed by one statement per beat for
every session it holds.  A process that dies stops renewing: its leases are taken over
once they expire, or at once by a process on the same machine that sees the holder's
pid is gone.  Safety does not rest on the lease: the fence in the session row still
refuses any commit of a driver that lost it (docs/guarantees.md#3-one-driver-per-session); the lease
makes sure two live processes do not both try.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence

from parley.coordination import constants as c
from parley.ports.backend import SessionLock
from parley.schemas.errors import StoreError
from parley.store.leases import Lease, LeaseStore

log = logging.getLogger("parley.leases")

HOSTNAME = socket.gethostname()


class LeasedLock:
    """A session's in-process lock and its lease, held and let go together."""

    def __init__(self, lock: SessionLock, leases: ProcessLeases, session_id: str) -> None:
        self.work_mark = lock.work_mark
        self._lock = lock
        self._leases = leases
        self._session_id = session_id

    def held(self) -> bool:
        """Held as long as both are: the lease is surely still this process's."""
        return self._lock.held() and self._leases.valid()

    def release(self, *, handing_over: bool = False) -> object:
        """The lease first, while this process still holds the session: a driver of this
        process that takes it next must not find its new lease let go."""
        self._leases.release(self._session_id)
        return self._lock.release(handing_over=handing_over)


class ProcessLeases:
    """An embedded client's leases on the sessions of its database (each client its own
    holder: they share the process's in-process locks, and so never contend)."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        seconds: float = c.LEASE_SECONDS,
        beat: float = c.LEASE_RENEW_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.owner = f"{HOSTNAME}:{os.getpid()}:{secrets.token_hex(6)}"
        self._seconds = seconds
        self._beat = beat
        self._clock = clock
        self._guard = threading.Lock()
        self._held: set[str] = set()
        self._renewed = 0.0  # when (monotonic) the latest renewal that went through began
        self._beating: threading.Thread | None = None
        self._failing = False
        self._closed = threading.Event()

    def acquire(self, session_id: str) -> bool:
        """Hold the session, unless another live process does."""
        began = time.monotonic()
        now = self._clock()
        holder = self.store.take_lease(session_id, self.owner, until=now + self._seconds, now=now)
        if holder is not None:
            if not holder or not gone(holder):
                return False
            if not self.store.take_lease_of(
                session_id, holder, self.owner, until=now + self._seconds
            ):
                return False
            log.info("took over session %s from %s, a process that is gone", session_id, holder)
        with self._guard:
            if not self._held:
                self._renewed = began
            self._held.add(session_id)
            if self._beating is None:
                self._beating = threading.Thread(
                    target=self._beat_while_held, name="parley-leases", daemon=True
                )
                self._beating.start()
        return True

    def lease(self, session_id: str, lock: SessionLock) -> LeasedLock | None:
        """The session's lease, joined to its in-process ``lock``; None (and the lock
        given back) if another live process holds the session."""
        try:
            taken = self.acquire(session_id)
        except BaseException:
            lock.release()
            raise
        if not taken:
            lock.release()
            return None
        return LeasedLock(lock, self, session_id)

    def release(self, session_id: str) -> None:
        """Let go of the session (it is free for any process at once)."""
        with self._guard:
            self._held.discard(session_id)
        try:
            self.store.release_lease(session_id, self.owner)
        except StoreError as exc:
            # Not renewed from now on: it expires within LEASE_SECONDS.
            log.warning("could not let go of session %s's lease (%s)", session_id, exc)

    def valid(self) -> bool:
        """Whether this process's leases are surely still its own: renewed less than a
        lease's time ago, less a beat for the clocks of other machines."""
        return time.monotonic() < self._renewed + self._seconds - self._beat

    def unheld(self, session_ids: Sequence[str]) -> list[str]:
        """Of ``session_ids`` (none held by a driver of this process), those that no
        live holder holds: what this client should drive."""
        leases = self.store.leases_of(session_ids)
        now = self._clock()
        return [
            session_id
            for session_id in session_ids
            if (lease := leases.get(session_id)) is None
            or lease.expires_at < now
            or lease.owner == self.owner  # left by a failed release: not renewed
            or gone(lease.owner)
        ]

    def batch_lines_run_elsewhere(self) -> bool:
        """Whether another live holder drives a batch line now: it works through the
        queued lines, a window at a time, and takes the rest in turn."""
        now = self._clock()
        return any(
            lease.owner != self.owner and live(lease, now)
            for lease in self.store.lease_holders(batch_lines=True)
        )

    def close(self, timeout: float | None = None) -> None:
        """Stop renewing, and wait (up to ``timeout``) for a renewal under way to end:
        nothing of this holder uses the store once its owner closes it.  Leases still
        held then expire within a lease's time."""
        self._closed.set()
        with self._guard:
            beating = self._beating
        if beating is not None:
            beating.join(timeout)

    def _beat_while_held(self) -> None:
        while True:
            closed = self._closed.wait(self._beat)
            with self._guard:
                held = sorted(self._held)
                if closed or not held:
                    self._beating = None
                    return
            began = time.monotonic()
            try:
                self.store.renew_leases(self.owner, held, until=self._clock() + self._seconds)
            except StoreError as exc:
                if not self._failing:
                    log.warning("could not renew this process's session leases (%s)", exc)
                self._failing = True
                continue
            if self._failing:
                log.info("renewed this process's session leases again")
            self._failing = False
            with self._guard:
                self._renewed = began


def live_holders(store: LeaseStore, clock: Callable[[], float] = time.time) -> list[str]:
    """The processes that drive a session of ``store``'s database now."""
    now = clock()
    return [lease.owner for lease in store.lease_holders() if live(lease, now)]


def live(lease: Lease, now: float) -> bool:
    """Whether ``lease``'s holder holds it at ``now``: unexpired, and not known to be
    gone."""
    return lease.expires_at >= now and not gone(lease.owner)


def gone(owner: str) -> bool:
    """Whether the process an ``owner`` names is known to be dead: on this machine, and
    no process has its pid (a reused pid keeps its lease until it expires)."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != HOSTNAME or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False  # another of this process's databases' holders: it expires if idle
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False
