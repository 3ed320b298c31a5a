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

from parley.coordination import constants as c
from parley.coordination.redis_admission import RedisAdmission
from parley.coordination.redis_coordinator import RedisCoordinator
from parley.engine.call_admission import AdmissionSettings
from parley.engine.turn_engine import TurnEngine
from parley.ports.host import HostPort
from parley.runtime.batch_window import fill_batch_window
from parley.runtime.concurrency import ConnectionBudget
from parley.runtime.interactive_share import InteractiveShares
from parley.runtime.schedule_firing import count_schedules, fire_due_schedules
from parley.runtime.session_drainer import SessionDrainer
from parley.settings import Settings
from parley.store.sql_store import SqlStore
from parley.telemetry import metrics
from parley.telemetry.log_context import log_context

log = logging.getLogger("parley.tasks")


@dataclass(kw_only=True)
class FleetRuntime:
    """One worker process's engine, store and coordinator."""

    store: SqlStore
    coordinator: RedisCoordinator
    engine: TurnEngine | None
    pid: int
    shares: InteractiveShares
    """Who is held back from starting interactive turns (the tenants' share of the
    workers), as this process last read it."""
    admission: AdmissionSettings
    """The process's admission settings: the batch window's weights are its tenants'."""
    batch_window: int
    """``PARLEY_BATCH_WINDOW``: the batch window's places."""

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
        settings: Settings | None = None,
    ) -> FleetRuntime:
        """Connect to PostgreSQL and Redis (call after the fork), with pools of the
        ``budget``'s sizes (by default, those of a process driving one turn at once);
        ``role`` names the process to PostgreSQL (``application_name``, with its pid);
        ``settings``: the process's (default: every default, as for a test)."""
        settings = settings or Settings()
        admission_settings = AdmissionSettings.from_settings(settings)
        budget = budget or ConnectionBudget.for_drivers(1)
        store = SqlStore.from_url(
            database_url,
            pool_size=budget.database,
            max_overflow=budget.database_overflow,
            role=role,
            pooler=settings.database_pooler,
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
                store=store,
                coordinator=coordinator,
                host=host,
                admission=admission,
                admission_settings=admission_settings,
            )
        return cls(
            store=store,
            coordinator=coordinator,
            engine=engine,
            pid=os.getpid(),
            shares=InteractiveShares(store, weights=lambda: admission_settings.tenant_weights),
            admission=admission_settings,
            batch_window=settings.batch_window,
        )

    def warm_up(self) -> None:
        """Connect to PostgreSQL and Redis, and compile a claim's statements, before any
        kick: every driver's first claim would otherwise wait for them at once (the
        engine's first connection, a hundred compiles of one statement).  Nothing is
        kept beyond what the pools and the statement cache keep anyway."""
        self.store.warm_claims()
        self.coordinator.redis.ping()

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
    kick: Callable[[str, str], None] | None = None,
) -> int:
    """Handle a kick: run the session's runnable turns if nobody else is.  Returns how
    many turns ran here; a duplicate kick returns 0 at once.  Once ``stopping``, or past
    ``DRIVE_SLICE_SECONDS``, the driver finishes its turn and passes the session to
    ``hand_over``.  ``defer`` kicks a session later (a turn waiting for capacity);
    ``kick`` kicks another session now (child turns opened, a parent woken)."""
    if runtime.engine is None:
        raise RuntimeError("this worker has no host (set PARLEY_HOST)")
    coordinator, store = runtime.coordinator, runtime.store
    driver = SessionDrainer(
        runtime.engine,
        stopping=stopping,
        slice_seconds=c.DRIVE_SLICE_SECONDS,
        hand_over=hand_over,
        defer=defer,
        held_back=runtime.shares.held_back,
        kick=kick,
    )
    # This driver's own costs: on a threads pool the process's counters hold every
    # driver's.  (The driver's transactions all run on this thread.)
    before = store.thread_transactions
    with log_context(session_id=session_id):
        with coordinator.tally() as redis_cost:
            ran = driver.drive(session_id)
            # A parent its last child's end woke goes on in this slot, now, rather than
            # behind every kick queued before its own (its kick was sent too: whichever
            # comes second finds the session's lock taken, or nothing to run).
            while driver.woken and not stopping():
                ran += driver.drive(driver.woken.pop(0))
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


def release_due(runtime: FleetRuntime, kick: Callable[[str, str], None]) -> list[str]:
    """Release the queued runs whose time has come (a delayed turn's, or the capacity a
    deferred one waited for: docs/time.md#delayed-turns), read by their due time alone,
    and kick their sessions; returns those kicked.  A driver holding a session sees its
    moved work mark instead of a kick."""
    kicked = []
    # Runs waiting for a time, then the waits for an event whose deadline came (each
    # read by its time from an index of its own: docs/time.md#waiting-for-an-event).
    for release in (runtime.store.release_due_runs, runtime.store.release_due_waits):
        while True:
            released = release(RELEASE_BATCH)
            for session_id, lane in dict(released).items():
                if runtime.coordinator.mark_work(session_id):
                    kick(session_id, lane)
                    kicked.append(session_id)
            if len(released) < RELEASE_BATCH:
                break
    return kicked


RELEASE_BATCH = 1000
"""Due runs released per transaction: a burst due at one instant goes in several."""


def sweep(runtime: FleetRuntime, kick: Callable[[str, str], None]) -> list[str]:
    """Deny the waiting calls whose time is up, then re-kick every session that has a
    queued or running turn, no live lock and no kick sent moments ago, on the queue of
    its most urgent lane: lost kicks, dead workers and an emptied Redis are all
    recovered here (a placed batch run among them); fire the schedules whose slot has
    come (docs/time.md#schedules); and top the batch window up (batch
    runs start a window at a time, each once it holds a place).  (A delayed turn, or one
    waiting for provider capacity, is left alone until its time: then it is released
    and its session kicked, docs/time.md#delayed-turns.)  Also counts the turns
    waiting for capacity and the sub-agents at work, for the metrics."""
    # Calls whose answer did not come in time are denied first: a turn whose last call
    # that makes runnable is among the sessions with work below.
    for answered in runtime.store.expire_approvals():
        runtime.coordinator.publish(list(answered.events))
    # Turns whose time has come are released first (beat's timer does it more often):
    # the sessions with work below then include theirs.
    kicked = release_due(runtime, kick)
    # Schedules' slots that have come fire (beat's timer does it more often), each
    # once however many beats sweep (docs/time.md#schedules).
    for firing in fire_due_schedules(runtime.store, runtime.coordinator, kick):
        kicked.append(firing.session_id)
    lanes = dict(runtime.store.sessions_with_work_lanes())
    for session_id in runtime.coordinator.unattended(list(lanes)):
        if runtime.coordinator.claim_kick(session_id):
            kick(session_id, lanes[session_id])
            kicked.append(session_id)
    # Batch runs waiting for a place get the places free, not a kick each.
    kicked_batch = fill_batch_window(
        runtime.store,
        runtime.coordinator,
        lambda session_id: kick(session_id, "batch"),
        window=runtime.batch_window,
        weights=runtime.admission.tenant_weights,
    )
    try:
        metrics.turns_waiting_capacity(runtime.store.waiting_for_capacity())
        agents = runtime.store.agent_work()
        metrics.agents_at_work(agents.running, agents.waiting, agents.parents_waiting)
        waiting = runtime.store.waiting_for_events()
        metrics.turns_waiting_event({tenant: count for tenant, (count, _) in waiting.items()})
        count_schedules(runtime.store)
    except Exception:  # a count for the metrics must never cost the sweep its kicks
        log.warning("could not count the turns waiting (capacity, agents, events)", exc_info=True)
    if kicked:
        log.info("sweeper kicked %d session(s)", len(kicked))
        metrics.sweeper_kicked(len(kicked))
    if kicked_batch:
        log.info("sweeper started %d batch line(s) into the batch window", kicked_batch)
    return kicked
