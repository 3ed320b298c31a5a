"""What the fleet's Celery tasks do, without Celery: drive a session, sweep for strays.

Tasks carry ids, never objects.  Each worker process builds its own runtime (engine,
store, coordinator) on first use, which is after Celery's prefork, so no database or
Redis connection is ever shared across a fork.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from workers.coordination import constants as c
from workers.coordination.redis_admission import RedisAdmission
from workers.coordination.redis_coordinator import RedisCoordinator
from workers.engine.turn_engine import TurnEngine
from workers.ports.host import HostPort
from workers.runtime.batch_window import batch_window, fill_batch_window
from workers.runtime.concurrency import ConnectionBudget
from workers.runtime.session_drainer import SessionDrainer
from workers.store.sql_store import SqlStore
from workers.telemetry import metrics
from workers.telemetry.log_context import log_context

log = logging.getLogger("parley.tasks")


@dataclass(kw_only=True)
class FleetRuntime:
    """One worker process's engine, store and coordinator."""

    store: SqlStore
    coordinator: RedisCoordinator
    engine: TurnEngine | None
    pid: int

    @classmethod
    def build(
        cls,
        *,
        database_url: str,
        redis_url: str,
        host: HostPort | None,
        replay_seconds: int = c.ENDED_BUFFER_SECONDS,
        flush_seconds: float = c.STREAM_FLUSH_SECONDS,
        budget: ConnectionBudget | None = None,
        role: str = "parley-worker",
    ) -> FleetRuntime:
        """Connect to PostgreSQL and Redis (call after the fork), with pools of the
        ``budget``'s sizes (by default, those of a process driving one turn at once);
        ``role`` names the process to PostgreSQL (``application_name``, with its pid)."""
        budget = budget or ConnectionBudget.for_drivers(1)
        store = SqlStore.from_url(
            database_url,
            pool_size=budget.database,
            max_overflow=budget.database_overflow,
            role=role,
        )
        coordinator = RedisCoordinator(
            redis_url,
            replay_seconds=replay_seconds,
            max_connections=budget.redis,
            flush_seconds=flush_seconds,
        )
        engine = None
        if host is not None:
            # The fleet's admission shares the coordinator's Redis connections.
            admission = RedisAdmission(coordinator.redis)
            engine = TurnEngine(
                store=store, coordinator=coordinator, host=host, admission=admission
            )
        return cls(store=store, coordinator=coordinator, engine=engine, pid=os.getpid())

    def close(self) -> None:
        """Release connections."""
        self.coordinator.close()
        self.store.close()


def drive_session(
    runtime: FleetRuntime,
    session_id: str,
    *,
    stopping: Callable[[], bool] = lambda: False,
    hand_over: Callable[[str], None] = lambda _session_id: None,
    defer: Callable[[str, float, str], None] | None = None,
) -> int:
    """Handle a kick: run the session's runnable turns if nobody else is.  Returns how
    many turns ran here; a duplicate kick returns 0 at once.  Once ``stopping``, or past
    ``DRIVE_SLICE_SECONDS``, the driver finishes its turn and passes the session to
    ``hand_over``.  ``defer`` kicks a session later (a turn waiting for capacity)."""
    if runtime.engine is None:
        raise RuntimeError("this worker has no host (set PARLEY_HOST)")
    coordinator, store = runtime.coordinator, runtime.store
    driver = SessionDrainer(
        runtime.engine,
        stopping=stopping,
        slice_seconds=c.DRIVE_SLICE_SECONDS,
        hand_over=hand_over,
        defer=defer,
    )
    # This driver's own costs: on a threads pool the process's counters hold every
    # driver's.  (The driver's transactions all run on this thread.)
    before = store.thread_transactions
    with log_context(session_id=session_id):
        with coordinator.tally() as redis_cost:
            ran = driver.drive(session_id)
            coordinator.flush(redis_cost.turns)  # (other drivers' go with the flusher)
        transactions = store.thread_transactions - before
        if ran or transactions:
            # Also a duplicate kick that took the lock and found nothing: what it cost in
            # the database is part of the fleet's bill.  One that bounced off the lock
            # is not.
            log.info(
                "drove session %s: turns=%d transactions=%d round_trips=%d events=%d coalesced=%d",
                session_id,
                ran,
                transactions,
                redis_cost.round_trips,
                redis_cost.events,
                redis_cost.coalesced,
            )
    return ran


def sweep(runtime: FleetRuntime, kick: Callable[[str, str], None]) -> list[str]:
    """Deny the waiting calls whose time is up, then re-kick every session that has a
    queued or running turn, no live lock and no kick sent moments ago, on the queue of
    its most urgent lane: lost kicks, dead workers and an emptied Redis are all
    recovered here; and top the batch window up (queued batch lines are started a
    window at a time).  (A turn waiting for provider capacity is left alone until its
    capacity is due.)  Also counts the turns waiting for capacity, for the metrics."""
    # Calls whose answer did not come in time are denied first: a turn whose last call
    # that makes runnable is among the sessions with work below.
    for answered in runtime.store.expire_approvals():
        runtime.coordinator.publish(list(answered.events))
    kicked = []
    lanes = dict(runtime.store.sessions_with_work_lanes())
    for session_id in runtime.coordinator.unattended(list(lanes)):
        if runtime.coordinator.claim_kick(session_id):
            kick(session_id, lanes[session_id])
            kicked.append(session_id)
    # Batch lines still queued are started a window at a time, not kicked each.
    kicked_batch = fill_batch_window(
        runtime.store,
        runtime.coordinator,
        lambda session_id: kick(session_id, "batch"),
        window=batch_window(),
    )
    try:
        metrics.turns_waiting_capacity(runtime.store.waiting_for_capacity())
    except Exception:  # a count for the metrics must never cost the sweep its kicks
        log.warning("could not count the turns waiting for capacity", exc_info=True)
    if kicked:
        log.info("sweeper kicked %d session(s)", len(kicked))
        metrics.sweeper_kicked(len(kicked))
    if kicked_batch:
        log.info("sweeper started %d batch line(s) into the batch window", kicked_batch)
    return kicked
