"""What a client is made of, and what its sessions, turn handles and batches hold: the
store, the coordinator, a :class:`Kicker` (this process's drivers, or the fleet's queue),
the host, and whether it is closed.

They hold this :class:`Runtime`, never the client that made them (as procrastinate's job
deferrer holds the job manager, not the app): one object that knows how to get a driver
to a session (:meth:`Runtime.wake`), whether writes are still accepted, and how to
signal answers a person committed, where each of them used to reach into the client's
private parts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from parley.errors import InvalidRequest
from parley.host import Host
from parley.ports.admission import Priority
from parley.ports.backend import Coordinator
from parley.schemas.events import Event
from parley.settings import Settings
from parley.store.approvals import Answered
from parley.store.sql_store import SqlStore
from parley.telemetry import tracing

log = logging.getLogger("parley.client")


class Kicker(Protocol):
    """How a client gets a driver to a session: threads of this process (embedded), or a
    Celery task for the fleet's workers."""

    @property
    def fleet(self) -> bool:
        """Whether the fleet's workers drive (else this process does)."""
        ...

    def ready(self) -> None:
        """Raise :class:`InvalidRequest` unless turns can run (embedded: a host)."""
        ...

    def kick(self, session_id: str, priority: Priority = "interactive") -> None:
        """Get a driver to the session (its work is marked already)."""
        ...

    def kick_at(self, session_id: str, when: datetime, priority: Priority = "interactive") -> None:
        """Get a driver to the session once ``when`` comes (a delayed turn's time): a
        timer where one is cheap and exact; the sweeper's release of due runs is the
        backstop everywhere (docs/time.md#delayed-turns)."""
        ...

    def failure(self, session_id: str) -> BaseException | None:
        """Why this process's driver of the session stopped, if it stopped on an error."""
        ...

    def housekeeping_wanted(self) -> None:
        """A session here has a webhook URL or a time to live."""
        ...

    def close(self, *, wait: bool, timeout: float | None) -> None:
        """Accept no more kicks (with ``wait``, let running drivers finish)."""
        ...


class Runtime:
    """A deployment as a client's parts use it (see the module docstring)."""

    def __init__(
        self,
        store: SqlStore,
        coordinator: Coordinator,
        kicker: Kicker,
        *,
        host: Host | None,
        settings: Settings,
    ) -> None:
        self.store = store
        self.coordinator = coordinator
        self.kicker = kicker
        self.host = host
        self.settings = settings
        """What the process read from its environment as the client was made."""
        self._closed = False

    @property
    def fleet(self) -> bool:
        """Whether the fleet's workers run the turns (else this process does)."""
        return self.kicker.fleet

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def check_open(self) -> None:
        """Refuse a write once closed (a closed store would quietly reconnect)."""
        if self._closed:
            raise InvalidRequest("the client is closed")

    def ready(self) -> None:
        """Refuse a submission before any write unless this client can run turns."""
        self.check_open()
        self.kicker.ready()

    def wake(
        self,
        session_id: str,
        events: Sequence[Event] = (),
        priority: Priority = "interactive",
    ) -> None:
        """The session has work committed (``events``: published with its mark): mark
        it, then kick, unless a kick sent earlier still waits for a driver or a driver
        holds the session (either sees the work: it committed first)."""
        if self.coordinator.mark_work(session_id, list(events)):
            self.kicker.kick(session_id, priority)

    def answered(self, answered: Answered) -> None:
        """Committed answers: publish their events, and wake a turn that is runnable
        again (embedded without a host, it waits for a client that has one)."""
        self.coordinator.publish(list(answered.events))
        if not answered.runnable:
            return
        try:
            self.kicker.ready()
        except InvalidRequest:
            # The answers are committed, and the turn goes on when a client with the
            # host resumes it (or its session gets a turn).
            log.info("turn %s is runnable again; no host here to run it", answered.turn_id)
            return
        self.wake(answered.session_id)

    def close(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Stop accepting work; embedded, with ``wait``, let running turns finish first."""
        self._closed = True
        self.kicker.close(wait=wait, timeout=timeout)
        self.coordinator.close()
        self.store.close()
        # Spans still buffered (a short script's whole turn) leave before it exits.
        tracing.flush()
