"""The background work beside the turns: delivering webhooks from the outbox and pruning
sessions whose time to live has run out.  ``parley beat`` runs it on a fleet, next to the
sweeper; the embedded client runs it on a thread once it runs turns.

Neither can hold up a turn: a turn's end only inserts its outbox row, and the deliverer
posts it later, from here.  Expiry removes rows only, never a workspace (that takes
``parley prune --workspaces``).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from parley.ports.backend import Coordinator
from parley.ports.host import HostPort
from parley.retention import prune
from parley.store.sql_store import SqlStore
from parley.webhooks import WebhookDeliverer, WebhookSettings

log = logging.getLogger("parley.housekeeping")

EXPIRY_SECONDS = 60.0
"""How often sessions past their time to live are looked for."""


class Housekeeper:
    """A thread that delivers due webhooks every ``settings.poll`` seconds (at once after a
    full pass, and when :meth:`wake` is called) and prunes expired sessions every
    ``expiry_seconds``: those past their own TTL, or ``default_retention`` (the host's)
    for those without one."""

    def __init__(
        self,
        store: SqlStore,
        coordinator: Coordinator,
        *,
        settings: WebhookSettings,
        default_retention: timedelta | None,
        expiry_seconds: float = EXPIRY_SECONDS,
    ) -> None:
        self.store = store
        self.coordinator = coordinator
        self.settings = settings
        self.default_retention = default_retention
        self.expiry_seconds = expiry_seconds
        self.deliverer = WebhookDeliverer(store.outbox, settings)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="parley-housekeeping", daemon=True)

    def start(self) -> Housekeeper:
        """Start the thread; returns self."""
        self._thread.start()
        return self

    def wake(self) -> None:
        """Look for due deliveries now (a turn just ended here)."""
        self._wake.set()

    def stop(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Stop; with ``wait``, once what is under way is done (a post takes at most
        its timeout)."""
        self._stop.set()
        self._wake.set()
        if wait and self._thread.is_alive():
            self._thread.join(timeout)

    def expire(self) -> int:
        """Prune the sessions whose time to live has run out; returns how many."""
        report = prune(
            self.store,
            self.coordinator,
            older_than=None,
            default_retention=self.default_retention,
        )
        if report.pruned:
            log.info("expired %d session(s) past their retention", len(report.pruned))
        return len(report.pruned)

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self.deliverer.close()

    def _loop(self) -> None:
        next_expiry = time.monotonic()
        while not self._stop.is_set():
            full = False
            try:
                full = self.deliverer.deliver_due() >= self.settings.concurrency
            except Exception as exc:  # the database out of reach: the next pass retries
                log.warning("webhook pass failed (%s: %s); retrying", type(exc).__name__, exc)
            if time.monotonic() >= next_expiry:
                next_expiry = time.monotonic() + self.expiry_seconds
                try:
                    self.expire()
                except Exception as exc:
                    log.warning("expiry failed (%s: %s); retrying", type(exc).__name__, exc)
            if full:
                continue
            self._wake.wait(self.settings.poll)
            self._wake.clear()


class EmbeddedHousekeeping:
    """The embedded client's :class:`Housekeeper`, started the first time it has work: a
    host with a webhook URL or a retention, a session opened here with either, or (seen
    after a drive, or at the engine's start) deliveries waiting in the outbox or sessions
    with a time to live.  An embedded client that uses neither runs no thread for them."""

    def __init__(
        self, store: SqlStore, coordinator: Coordinator, webhooks: WebhookSettings
    ) -> None:
        self.store = store
        self.coordinator = coordinator
        self.webhooks = webhooks
        self._guard = threading.Lock()
        self._running: Housekeeper | None = None
        self._wanted = False
        self._looked_for_ttls = False
        self._closed = False

    def want(self) -> None:
        """A session with a webhook URL or a retention was opened here."""
        self._wanted = True

    def touch(self, host: HostPort) -> None:
        """The engine started, or a drive ended: wake the housekeeper, or start it if
        there is work for it now."""
        with self._guard:
            if self._closed:
                return
            if self._running is not None:
                self._running.wake()
                return
            if not (host.webhook_url or host.retention or self._wanted or self._work_waits()):
                return
            self._running = Housekeeper(
                self.store,
                self.coordinator,
                settings=self.webhooks,
                default_retention=host.retention,
            ).start()

    def _work_waits(self) -> bool:
        if not self._looked_for_ttls:
            self._looked_for_ttls = True
            if self.store.sessions_with_retention():
                return True
        return self.store.has_unsettled_deliveries()

    def stop(self, *, wait: bool, timeout: float | None = None) -> None:
        """Stop the housekeeper, if it runs (for good); with ``wait``, within
        ``timeout`` seconds."""
        with self._guard:
            self._closed = True
            running, self._running = self._running, None
        if running is not None:
            running.stop(wait=wait, timeout=timeout)
