"""The embedded deployment's moving parts: the in-process coordinator a database's
clients share, and the kicker that runs a session's turns on a background thread of this
process (with leases in the database, should other processes share it)."""

from __future__ import annotations

import functools
import threading
import weakref

from sqlalchemy import Engine

from parley.host import Host, host_from_environment
from parley.housekeeping import EmbeddedHousekeeping
from parley.kickers import EmbeddedKicker
from workers.coordination.local_admission import LocalAdmission
from workers.coordination.local_coordinator import LocalCoordinator
from workers.engine.turn_engine import TurnEngine
from workers.runtime.batch_window import batch_window
from workers.runtime.session_leases import ProcessLeases
from workers.store.database import in_memory, sqlite_file
from workers.store.sql_store import SqlStore

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
    store: SqlStore, coordinator: LocalCoordinator, engine: Engine, host: Host | None
) -> EmbeddedKicker:
    """The kicker of an embedded client on ``store``: it runs turns with ``host`` (else
    the environment's, resolved at the first turn), and, given a host, picks up at once
    what an earlier process left (deliveries, housekeeping, turns killed mid-way)."""

    def runner() -> TurnEngine | None:
        # Resolved at the first turn, not here: a client that only reads must not
        # fail on a model it will never call (PARLEY_MODEL without its key, say).
        chosen = host if host is not None else host_from_environment()
        if chosen is None:
            return None
        return TurnEngine(
            store=store, coordinator=coordinator, host=chosen, admission=process_admission()
        )

    housekeeping = EmbeddedHousekeeping(store, coordinator)
    if host is not None:
        # Deliveries an earlier process left, or the host's own URL or retention:
        # started now, not at the first turn (a restarted process may run none).
        housekeeping.touch(host)

    # Other processes may share the database (a file, or a server): a session's lock
    # is a lease in it too, this client's own (workers.runtime.session_leases).
    leases = None if in_memory(engine) else ProcessLeases(store)

    window = batch_window()

    def strays() -> list[tuple[str, str]]:
        lanes = dict(store.sessions_with_work_lanes())
        # Queued batch lines are not among them (a window at a time): the oldest are.
        for session_id in store.oldest_queued_batch_sessions(window):
            lanes.setdefault(session_id, "batch")
        undriven = coordinator.unattended(list(lanes))
        if leases is not None and undriven:
            undriven = leases.unheld(undriven)
        return [(session_id, lanes[session_id]) for session_id in undriven]

    kicker = EmbeddedKicker(
        runner,
        store.expire_approvals,
        housekeeping,
        strays=strays,
        leases=leases,
        batch_window=window,
    )
    if host is not None:
        # Turns an earlier process left (killed mid-turn, say) go on from now, not
        # at this client's first turn: a restarted process may run none.  (Building
        # the engine starts its sweep for them.)
        kicker.ready()
    return kicker
