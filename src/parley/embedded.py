"""The embedded deployment's moving parts: the in-process coordinator a database's
clients share, and the kicker that runs a session's turns on a background thread of this
process (with leases in the database, should other processes share it)."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable

from sqlalchemy import Engine

from parley.coordination.local_admission import LocalAdmission
from parley.coordination.local_coordinator import LocalCoordinator
from parley.engine.call_admission import AdmissionSettings
from parley.engine.turn_engine import TurnEngine
from parley.host import Host, host_from_settings
from parley.housekeeping import EmbeddedHousekeeping
from parley.kickers import EmbeddedKicker
from parley.runtime.schedule_firing import fire_due_schedules
from parley.runtime.session_leases import ProcessLeases
from parley.settings import Settings
from parley.store.database import in_memory, sqlite_file
from parley.store.sql_store import SqlStore
from parley.webhooks import WebhookSettings

_LOCAL_COORDINATORS: weakref.WeakValueDictionary[str, LocalCoordinator] = (
    weakref.WeakValueDictionary()
)
_LOCAL_COORDINATORS_GUARD = threading.Lock()


@functools.cache
def process_admission() -> LocalAdmission:
    """This process's admission (docs/admission.md): every embedded client of the process
    shares each model's limits through it."""
    return LocalAdmission()


def local_coordinator(url: str, engine: Engine) -> LocalCoordinator:
    """The in-process coordinator of a database: one per database in a process, shared by
    every embedded client on it.  With one each, a second client's driver would see the
    first one's session lock free and take over a turn it is still running."""
    path = sqlite_file(url)
    if engine.dialect.name == "sqlite" and path is None:
        return LocalCoordinator()  # in memory: each engine is a database of its own
    key = str(path.resolve()) if path is not None else str(engine.url)
    with _LOCAL_COORDINATORS_GUARD:
        coordinator = _LOCAL_COORDINATORS.get(key)
        if coordinator is None:
            coordinator = _LOCAL_COORDINATORS[key] = LocalCoordinator()
        return coordinator


def embedded_kicker(
    store: SqlStore,
    coordinator: LocalCoordinator,
    engine: Engine,
    host: Host | None,
    settings: Settings,
) -> EmbeddedKicker:
    """The kicker of an embedded client on ``store``: it runs turns with ``host`` (else
    the one ``settings`` name, resolved at the first turn), and, given a host, picks up
    at once what an earlier process left (deliveries, housekeeping, turns killed
    mid-way)."""
    admission = AdmissionSettings.from_settings(settings)
    housekeeping = EmbeddedHousekeeping(store, coordinator, WebhookSettings.from_settings(settings))
    if host is not None:
        # Deliveries an earlier process left, or the host's own URL or retention:
        # started now, not at the first turn (a restarted process may run none).
        housekeeping.touch(host)

    # Other processes may share the database (a file, or a server): a session's lock
    # is a lease in it too, this client's own (parley.runtime.session_leases).
    leases = None if in_memory(engine) else ProcessLeases(store.leases)

    kicker = EmbeddedKicker(
        _runner(store, coordinator, host, settings, admission),
        store.expire_approvals,
        housekeeping,
        strays=_strays(store, coordinator, leases),
        leases=leases,
        batch_window=_batch_sessions(store, leases, settings.batch_window, admission),
        due=_due(store, coordinator),
    )
    if host is not None:
        # Turns an earlier process left (killed mid-turn, say) go on from now, not
        # at this client's first turn: a restarted process may run none.  (Building
        # the engine starts its sweep for them.)
        kicker.ready()
    return kicker


def _due(store: SqlStore, coordinator: LocalCoordinator) -> Callable[[], list[tuple[str, str]]]:
    """What the recovery thread calls every sweep: fire the schedules whose slot has
    come (docs/time.md#schedules), then release the delayed turns and the waits whose time
    has (docs/time.md#waiting-for-an-event); the
    sessions of both, each with its lane, for it to drive."""

    def due() -> list[tuple[str, str]]:
        fired: list[tuple[str, str]] = []
        fire_due_schedules(store, coordinator, lambda session, lane: fired.append((session, lane)))
        return [*fired, *store.release_due_runs(), *store.release_due_waits()]

    return due


def _runner(
    store: SqlStore,
    coordinator: LocalCoordinator,
    host: Host | None,
    settings: Settings,
    admission: AdmissionSettings,
) -> Callable[[], TurnEngine | None]:
    """What builds the kicker's engine: with ``host``, else the one ``settings`` name
    (None: none is named)."""

    def runner() -> TurnEngine | None:
        # Resolved at the first turn, not here: a client that only reads must not
        # fail on a model it will never call (PARLEY_MODEL without its key, say).
        chosen = host if host is not None else host_from_settings(settings)
        if chosen is None:
            return None
        return TurnEngine(
            store=store,
            coordinator=coordinator,
            host=chosen,
            admission=process_admission(),
            admission_settings=admission,
        )

    return runner


def _strays(
    store: SqlStore, coordinator: LocalCoordinator, leases: ProcessLeases | None
) -> Callable[[], list[tuple[str, str]]]:
    """The sessions with work that no driver here, nor (by lease) elsewhere, drives, each
    with its lane."""

    def strays() -> list[tuple[str, str]]:
        # (Batch runs waiting for a place in the batch window are not among them: the
        # window's thread gives the places, and drives the sessions placed.)
        lanes = dict(store.sessions_with_work_lanes())
        undriven = coordinator.unattended(list(lanes))
        if leases is not None and undriven:
            undriven = leases.unheld(undriven)
        return [(session_id, lanes[session_id]) for session_id in undriven]

    return strays


def _batch_sessions(
    store: SqlStore, leases: ProcessLeases | None, window: int, admission: AdmissionSettings
) -> Callable[[set[str]], list[str]]:
    """The kicker's turn of the batch window of ``window`` places."""

    def batch_sessions(kicked: set[str]) -> list[str]:
        """The batch window's free places given (it is the database's, shared with every
        process on it) unless another live process drives batch lines, and the sessions
        to drive: those placed now, and those kicked that hold a place (a turn back from
        waiting for capacity, a stray left mid-step)."""
        # While another live process drives batch lines, it gives the places, and takes
        # the queued lines in turn: here they would hold this process (a `parley
        # submit`, say) until they end.  What was kicked here and holds a place runs.
        elsewhere = leases is not None and leases.batch_lines_run_elsewhere()
        placed = [] if elsewhere else store.place_batch_runs(window, admission.tenant_weights)
        held = [s for s in store.placed_batch_sessions() if s in kicked] if kicked else []
        return list(dict.fromkeys(placed + held))

    return batch_sessions
