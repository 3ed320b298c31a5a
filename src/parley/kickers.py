"""How a client gets a session's turns driven: a thread in this process (embedded) or a
Celery kick to the fleet."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from parley.coordination.constants import SWEEP_SECONDS
from parley.engine.turn_engine import TurnEngine
from parley.errors import InvalidRequest
from parley.fleet.app import BROKER_ERRORS, QueueTypeMismatch, create_app, send_kick
from parley.fleet.settings import FleetSettings
from parley.fleet.tracing import instrument_celery
from parley.runtime.session_drainer import SessionDrainer
from parley.runtime.session_leases import ProcessLeases
from parley.runtime.wake_timer import WakeTimer
from parley.store.approvals import Answered
from parley.telemetry.log_context import log_context

if TYPE_CHECKING:
    from parley.housekeeping import EmbeddedHousekeeping

log = logging.getLogger("parley.client")

_TIMER_MARGIN = 0.05
"""Seconds a timed kick comes after its time: clocks of the timer and of the claim
differ by a little, and a kick that came early would find nothing due."""

TIMED_KICK_SECONDS = 60.0
"""The longest delay the fleet counts down in a kick; beat's sweep starts the others."""


class EmbeddedKicker:
    """Drives sessions on background threads of this process, one thread per session."""

    def __init__(
        self,
        engine: Callable[[], TurnEngine | None],
        expire: Callable[[], list[Answered]] = list,
        housekeeping: EmbeddedHousekeeping | None = None,
        *,
        strays: Callable[[], list[tuple[str, str]]] = list,
        leases: ProcessLeases | None = None,
        batch_window: Callable[[set[str]], list[str]] | None = None,
        due: Callable[[], list[tuple[str, str]]] = list,
    ) -> None:
        """``engine`` builds the engine (None: no host) when the first turn needs it;
        ``expire`` denies the waiting calls whose time is up (the store's);
        ``housekeeping`` delivers webhooks and expires sessions once there is work for
        it (told when the engine is built and after every drive); ``strays`` lists the
        sessions with work that no live process drives (a process that died left them,
        or its kick never came), which this one drives from the engine's start on;
        ``leases`` make each session's lock a lease in the database too, for the other
        processes that share it; ``batch_window`` gives the batch window's free places
        (the store's: src/parley/runtime/batch_window.py) and returns the sessions to drive,
        those it placed and those of the kicked sessions it is given that hold a place
        (None: batch kicks start drivers at once, as interactive ones do); ``due``
        releases the queued runs whose time has come and lists their sessions (the
        store's: the recovery thread kicks them, the backstop of :meth:`kick_at`'s
        timers, which die with the process)."""
        self._build_engine = engine
        self._expire_due = expire
        self._housekeeping = housekeeping
        self._strays = strays
        self._due = due
        self._leases = leases
        self._recovery: threading.Thread | None = None
        self._engine: TurnEngine | None = None
        self._built = False
        self._drivers: dict[str, threading.Thread] = {}
        self._errors: dict[str, BaseException] = {}
        self._kicked: set[str] = set()
        self._guard = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self._deferred: dict[str, threading.Timer] = {}
        self._wake_timer = WakeTimer(self._timed_kick)
        self._batch_window = batch_window
        self._batch_kicks: set[str] = set()
        self._window_wanted = threading.Event()
        self._window: threading.Thread | None = None

    @property
    def fleet(self) -> bool:
        """This process drives its sessions."""
        return False

    def ready(self) -> None:
        """Raise unless this client can run turns."""
        with self._guard:
            building = not self._built
            if building:
                self._engine = self._build_engine()
                self._built = True
        if building:
            self._keep_house()  # work left from an earlier process, or the host's
            self._start_recovery()
            self._start_window()
        if self._engine is None:
            raise InvalidRequest(
                "this client has no host, so it cannot run turns: pass host=... to connect() "
                "or set PARLEY_HOST"
            )
        if self._closed:
            raise InvalidRequest("the client is closed")

    def kick(self, session_id: str, priority: str = "interactive") -> None:
        """Make sure a driver thread is draining the session.  Every session has a
        thread of its own here, but a batch kick: its session is driven once its run
        holds a place in the batch window, which the window's thread gives, by tenant
        and weight (src/parley/runtime/batch_window.py, as on the fleet)."""
        self.ready()
        with self._guard:
            if self._closed:
                # Checked under the guard that close() takes: no driver starts after it
                # (a submission racing it rolls back with this error).
                raise InvalidRequest("the client is closed")
            if session_id in self._drivers:
                # The flag and the thread's decision to exit are both taken under the
                # guard, so a kick that arrives while a driver winds down is never dropped.
                self._kicked.add(session_id)
                return
            if priority == "batch" and self._batch_window is not None:
                self._batch_kicks.add(session_id)
                self._window_wanted.set()
                return
            self._start_driver(session_id)

    def _start_driver(self, session_id: str) -> None:
        """Under the guard: a driver thread for the session."""
        self._kicked.add(session_id)
        thread = threading.Thread(
            target=self._drive, args=(session_id,), name=f"parley-{session_id[:8]}", daemon=True
        )
        self._drivers[session_id] = thread
        self._errors.pop(session_id, None)
        thread.start()
        self._start_timer()

    def _driver_gone(self, session_id: str) -> None:
        """Under the guard: the session's driver stopped (a place in the batch window
        may be free: the window's thread looks)."""
        self._drivers.pop(session_id, None)
        self._window_wanted.set()

    def _start_window(self) -> None:
        """With an engine and a batch window: the thread that gives the window's places
        and drives the sessions placed, when told to (a batch kick, a driver gone) and
        every ``SWEEP_SECONDS`` (runs an earlier process left, lines of another process
        on the same database)."""
        if self._engine is None or self._batch_window is None:
            return
        self._window = threading.Thread(target=self._fill_window, name="parley-window", daemon=True)
        self._window.start()

    def _fill_window(self) -> None:
        assert self._batch_window is not None
        failing = False
        while not self._stop.is_set():
            self._window_wanted.wait(SWEEP_SECONDS)
            self._window_wanted.clear()
            if self._stop.is_set():
                return  # (closing: the store is about to close)
            with self._guard:
                kicked, self._batch_kicks = self._batch_kicks, set()
            try:
                sessions = self._batch_window(kicked)
            except Exception as exc:
                if not failing:
                    log.warning("could not fill the batch window (%s); trying again", exc)
                failing = True
                continue
            failing = False
            with self._guard:
                for session_id in sessions:
                    if self._closed:
                        return
                    if session_id in self._drivers:
                        self._kicked.add(session_id)
                    else:
                        self._start_driver(session_id)

    def kick_later(self, session_id: str, seconds: float, priority: str) -> None:
        """Kick the session in ``seconds`` (a turn that waits for provider capacity,
        docs/admission.md); the recovery thread is the backstop, as the fleet's sweeper."""
        timer = threading.Timer(seconds, self._deferred_kick, args=(session_id, priority))
        timer.daemon = True
        with self._guard:
            if self._closed:
                return
            earlier = self._deferred.pop(session_id, None)
            self._deferred[session_id] = timer
        if earlier is not None:
            earlier.cancel()
        timer.start()

    def kick_at(self, session_id: str, when: datetime, priority: str = "interactive") -> None:
        """Kick the session once ``when`` comes (a delayed turn, docs/time.md), on this
        process's wake timer (one thread for every time); the recovery thread releases
        and kicks what the timer missed (a restart, another process's submission)."""
        # A hair late rather than early: the timer counts on the monotonic clock and the
        # claim compares the wall clock's, and an early kick would find nothing due.
        seconds = max(0.0, (when - datetime.now(UTC)).total_seconds()) + _TIMER_MARGIN
        self._wake_timer.at(seconds, session_id, priority)

    def _timed_kick(self, session_id: str, priority: str) -> None:
        with contextlib.suppress(InvalidRequest):  # closed meanwhile
            self.kick(session_id, priority)

    def _deferred_kick(self, session_id: str, priority: str) -> None:
        with self._guard:
            self._deferred.pop(session_id, None)
        # A turn waiting for an event whose deadline this is must be released first (its
        # waits timed out, its run queued again: docs/time.md#waiting-for-an-event); a
        # release costs what is due.
        self._kick_due()
        with contextlib.suppress(InvalidRequest):  # closed meanwhile
            self.kick(session_id, priority)

    def _start_recovery(self) -> None:
        """With an engine: a thread that drives the sessions nothing drives, at once and
        every ``SWEEP_SECONDS``, as the fleet's sweeper does."""
        if self._engine is None:
            return
        self._recovery = threading.Thread(target=self._recover, name="parley-recovery", daemon=True)
        self._recovery.start()

    def _recover(self) -> None:
        failing = False
        # A session is driven here once it was seen undriven twice, a sweep apart: a
        # turn another process just submitted has no lease until its own kick, moments
        # later, takes one (the fleet's sweeper trusts a kick for KICK_GRACE_SECONDS).
        seen: set[str] = set()
        while not self._stop.is_set():
            self._kick_due()
            try:
                strays = self._strays()
            except Exception as exc:
                if not failing:
                    log.warning("could not look for turns left undriven (%s)", exc)
                failing = True
            else:
                failing = False
                twice = [(session, lane) for session, lane in strays if session in seen]
                seen = {session for session, _lane in strays}
                for session_id, lane in twice:
                    with self._guard:
                        # A driver of this process that failed left its turn to its
                        # caller (the error is theirs to see, then to resume).
                        failed = session_id in self._errors
                    if not failed:
                        log.info("driving session %s, which no live process drives", session_id)
                        with contextlib.suppress(InvalidRequest):  # closed meanwhile
                            self.kick(session_id, lane)
            if self._stop.wait(SWEEP_SECONDS):
                return

    def _kick_due(self) -> None:
        """Release the runs whose time has come and drive their sessions (a turn
        delayed by another process, or before this one started)."""
        try:
            due = self._due()
        except Exception as exc:
            log.warning("could not release the turns whose time has come (%s)", exc)
            return
        for session_id, lane in dict(due).items():
            with contextlib.suppress(InvalidRequest):  # closed meanwhile
                self.kick(session_id, lane)

    def _start_timer(self) -> None:
        """Under the guard: with a host that gives answers a time limit, a thread that
        denies the calls whose time is up (the fleet's sweeper does it there)."""
        engine = self._engine
        if self._timer is not None or engine is None or not engine.host.approval_timeout:
            return
        period = min(1.0, engine.host.approval_timeout / 4)
        self._timer = threading.Thread(
            target=self._expire, args=(engine, period), name="parley-approvals", daemon=True
        )
        self._timer.start()

    def _expire(self, engine: TurnEngine, period: float) -> None:
        while not self._stop.wait(period):
            try:
                for answered in self._expire_due():
                    engine.coordinator.publish(list(answered.events))
                    if answered.runnable and engine.coordinator.mark_work(answered.session_id):
                        with contextlib.suppress(InvalidRequest):  # closed meanwhile
                            self.kick(answered.session_id)
            except Exception:
                log.warning("could not deny the calls whose time is up", exc_info=True)

    def _drive(self, session_id: str) -> None:
        with log_context(session_id=session_id):
            self._drive_session(session_id)

    def _drive_session(self, session_id: str) -> None:
        assert self._engine is not None
        driver = SessionDrainer(
            self._engine, leases=self._leases, defer=self.kick_later, kick=self._kick_other
        )
        try:
            while True:
                with self._guard:
                    if session_id not in self._kicked:
                        self._driver_gone(session_id)
                        return
                    self._kicked.discard(session_id)
                driver.drive(session_id)
                self._keep_house()  # its turns' ends may have webhooks to deliver
        except BaseException as exc:
            log.exception("driver of session %s stopped", session_id)
            with self._guard:
                self._errors[session_id] = exc
                self._driver_gone(session_id)
                # A kick that came while this driver was failing found it still listed
                # and left the work to it: that work needs a driver of its own.
                kicked_meanwhile = session_id in self._kicked
                self._kicked.discard(session_id)
            # Waiters see the error through failure() at their next poll.
            if kicked_meanwhile:
                with contextlib.suppress(InvalidRequest):  # closed meanwhile
                    self.kick(session_id)

    def _kick_other(self, session_id: str, priority: str) -> None:
        """A driver's kick of another session (child turns, or a woken parent)."""
        with contextlib.suppress(InvalidRequest):  # closed meanwhile
            self.kick(session_id, priority)

    def housekeeping_wanted(self) -> None:
        """A session opened here has a webhook URL or a time to live: the housekeeper
        starts with the engine (or at the next drive)."""
        if self._housekeeping is not None:
            self._housekeeping.want()
            self._keep_house()

    def _keep_house(self) -> None:
        engine = self._engine
        if engine is not None and self._housekeeping is not None and not self._closed:
            self._housekeeping.touch(engine.host)

    def failure(self, session_id: str) -> BaseException | None:
        """Why the session's driver stopped, if it stopped on an error."""
        with self._guard:
            if session_id in self._drivers:
                return None
            return self._errors.get(session_id)

    def close(self, *, wait: bool, timeout: float | None) -> None:
        """Accept no more kicks; with ``wait``, let running drivers finish (within
        ``timeout`` seconds in all)."""
        with self._guard:
            self._closed = True
            drivers = list(self._drivers.values())
            deferred = list(self._deferred.values())
            self._deferred.clear()
        self._wake_timer.close()
        for timer in deferred:
            timer.cancel()
        self._stop.set()
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if wait:
            for thread in drivers:
                thread.join(left())
        recovery = self._recovery
        if recovery is not None:
            # Its look at the store is short, and must not outlive the store's close.
            recovery.join(left())
        window = self._window
        if window is not None:
            self._window_wanted.set()  # (it sees the stop now, not a sweep later)
            window.join(left())
        if self._housekeeping is not None:
            # After the drivers: their last turns' deliveries have their outbox rows.
            self._housekeeping.stop(wait=wait, timeout=left())
        if self._leases is not None:
            # Its renewals must not outlive the store's close either.
            self._leases.close(left())


class FleetKicker:
    """Sends a Celery kick per submission; the fleet's workers do the driving."""

    def __init__(
        self,
        settings: FleetSettings,
        batch_window: Callable[[Callable[[str], None]], int] | None = None,
    ) -> None:
        """``batch_window`` fills the fleet's batch window, kicking the sessions it
        places (src/parley/runtime/batch_window.py): what a batch kick does here (None: a
        batch kick is sent as it is)."""
        self._settings = settings
        self._app: Any = create_app(settings, name="parley-producer")
        self._batch_window = batch_window
        instrument_celery(settings)

    @property
    def fleet(self) -> bool:
        """The fleet's workers drive its sessions."""
        return True

    def ready(self) -> None:
        """A fleet client can always submit: the workers hold the host."""

    def housekeeping_wanted(self) -> None:
        """Nothing to start: the fleet's ``parley beat`` delivers and expires."""

    def kick(self, session_id: str, priority: str = "interactive") -> None:
        """Send a kick to the queue of ``priority``'s lane; a lost one is recovered by the
        sweeper, so failure only logs (on one line naming the error, if the broker is out
        of reach).  A batch kick fills the batch window instead: the new batch run is
        claimed only once placed, and the window kicks the sessions it places (this one,
        if its tenant's turn has come)."""
        if priority == "batch" and self._batch_window is not None:
            try:
                self._batch_window(lambda placed: self._send(placed, "batch"))
            except Exception as exc:  # (the sweeper fills it every sweep)
                log.warning("could not fill the batch window (%s); the sweeper will", exc)
            return
        self._send(session_id, priority)

    def _send(self, session_id: str, priority: str) -> None:
        try:
            send_kick(self._app, self._settings, session_id, priority=priority)
        except BROKER_ERRORS as exc:
            log.warning(
                "could not kick session %s (%s: %s); the sweeper will",
                session_id,
                type(exc).__name__,
                exc,
            )
        except QueueTypeMismatch as exc:  # (no sweeper can send it either, until mended)
            log.error("could not kick session %s: %s", session_id, exc)
        except Exception:
            log.warning("could not kick session %s; the sweeper will", session_id, exc_info=True)

    def kick_at(self, session_id: str, when: datetime, priority: str = "interactive") -> None:
        """A turn delayed a little (up to ``TIMED_KICK_SECONDS``) gets a kick counted
        down by the broker, to start on time; a later one is released by ``parley
        beat``'s sweep when its time comes (a kick held by a worker for hours would be
        delivered again at each visibility timeout), which is every turn's backstop."""
        seconds = (when - datetime.now(UTC)).total_seconds()
        if seconds > TIMED_KICK_SECONDS:
            return
        try:
            send_kick(
                self._app,
                self._settings,
                session_id,
                priority=priority,
                countdown=max(0.0, seconds) + _TIMER_MARGIN,
            )
        except Exception as exc:  # (beat's sweep releases it anyway)
            log.warning("could not send session %s's timed kick (%s)", session_id, exc)

    def failure(self, session_id: str) -> BaseException | None:
        """Worker failures are not visible to a producer (the turn stays resumable)."""
        return None

    def close(self, *, wait: bool, timeout: float | None) -> None:
        """Release the broker connections."""
        self._app.close()
