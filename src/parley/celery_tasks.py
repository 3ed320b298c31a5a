"""The fleet's Celery app and tasks: ``celery -A parley.celery_tasks worker`` (or
``parley worker``).

Configuration comes from the environment (:class:`parley.fleet.settings.FleetSettings`).
The tasks are thin: they name a session, and the engine does the rest.  Each worker
process builds its runtime after the fork (``worker_process_init`` on prefork; on the
threads pool, and every pool that runs kicks in the worker's own process, once the pool
is sized and before the first kick is taken), never before, and once, however many kicks
ask at once.
"""

from __future__ import annotations

import logging
import mmap
import os
import sys
import threading
from typing import Any

from celery.signals import (
    celeryd_after_setup,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
    worker_shutting_down,
)

from parley import metrics_export
from parley.coordination import constants as c
from parley.engine.call_admission import AdmissionSettings
from parley.fleet.app import (
    BROKER_ERRORS,
    REDIS_BROKER_CONNECTIONS,
    QueueTypeMismatch,
    create_app,
    declare_kick_queues,
    is_redis,
    kick_queue,
    send_kick,
)
from parley.fleet.settings import FleetSettings
from parley.fleet.tracing import apart_from_the_current_trace, instrument_celery
from parley.host import host_from_settings
from parley.housekeeping import Housekeeper
from parley.runtime.batch_window import fill_batch_window
from parley.runtime.concurrency import ConnectionBudget, drivers_per_process
from parley.runtime.fleet import FleetRuntime, drive_session, release_due, sweep
from parley.runtime.per_process import PerProcess
from parley.runtime.schedule_firing import fire_due_schedules
from parley.schemas.errors import StoreError
from parley.settings import Settings
from parley.store.database import unmigrated
from parley.store.ids import validate_ids
from parley.telemetry import tracing
from parley.webhooks import WebhookSettings

log = logging.getLogger("parley.worker")

# Read once, as the worker (or the sweeper) starts: a malformed variable (a
# PARLEY_MODEL_LIMITS, say) stops it at once on one line naming it, not at a turn's first
# model call.
process_settings = Settings.from_environment()
settings = FleetSettings.from_settings(process_settings)
admission_settings = AdmissionSettings.from_settings(process_settings)
tracing.configure(process_settings)
metrics_bind = metrics_export.MetricsBind.from_settings(process_settings)
app = create_app(settings)
# What one process drives at once, and the connections it takes: one turn until the
# worker has told its pool and concurrency (the sweeper, a producer: one thread).
_budget = ConnectionBudget.for_drivers(1, database_pool_size=settings.database_pool_size)
# What this process is to PostgreSQL (its connections' application_name, with its pid):
# a worker's unless it is the sweeper's.
_role = "parley-worker"


def _build_runtime() -> FleetRuntime:
    host = host_from_settings(process_settings)
    built = FleetRuntime.build(
        database_url=settings.database_url,
        redis_url=settings.redis_url,
        host=host,
        replay_seconds=settings.replay_seconds,
        flush_seconds=settings.stream_flush_seconds,
        budget=_budget,
        role=_role,
        settings=process_settings,
    )
    log.info("process %d built its runtime (host %s)", os.getpid(), settings.host or "default")
    return built


# One per process, whatever the pool: on the threads pool the first kicks of a burst
# all ask for it at once (src/parley/runtime/per_process.py).
_runtime = PerProcess(_build_runtime)


def runtime() -> FleetRuntime:
    """This process's runtime, built on first use in each process."""
    return _runtime.get()


@celeryd_after_setup.connect  # type: ignore[untyped-decorator]
def _size_pools(instance: Any, conf: Any, **_kwargs: Any) -> None:
    # Sent in the worker's main process once its pool and concurrency are settled, before
    # it connects to the broker and before prefork's children are forked: each process
    # sizes its pools for the turns it drives at once (parley.runtime.concurrency).
    global _budget
    pool = _pool_name(instance.pool_cls)
    _budget = ConnectionBudget.for_drivers(
        drivers_per_process(pool, int(instance.concurrency)),
        database_pool_size=settings.database_pool_size,
    )
    if is_redis(settings.broker_url):
        # A Redis broker: on the threads pool each kick acknowledges its message from its
        # own thread, over the consumer's channel, whose pool raises past its size
        # (kombu's default is 10).
        conf.broker_transport_options = {
            **conf.broker_transport_options,
            "max_connections": max(_budget.redis, REDIS_BROKER_CONNECTIONS),
        }
    log.info(
        "%s pool, concurrency %s: %d turn(s) at once per process; up to %d Redis "
        "connections per pool, %d+%d PostgreSQL",
        pool,
        instance.concurrency,
        _budget.drivers,
        _budget.redis,
        _budget.database,
        _budget.database_overflow,
    )
    if pool not in FORKING_POOLS:
        _build_before_the_first_kick()


FORKING_POOLS = ("prefork", "processes")
"""Celery's pools whose kicks run in processes forked from the worker's (each builds its
runtime after the fork); every other pool runs them in the worker's own process."""


def _build_before_the_first_kick() -> None:
    """Build this process's runtime now, and connect it, before the consumer takes
    kicks: the host's imports (a provider's client library) and the database engine's
    first connection take a second or more, which the first kicks of a backlog would
    otherwise wait for, every slot of the process at once (issue 42: the fleet's first
    call came 2.5 s after a backlog's submission)."""
    try:
        runtime().warm_up()
    except Exception:
        # The first kick tries again, and fails the way a kick does.
        log.exception("could not build this process's runtime; the first kick will try again")


def _pool_name(pool_cls: Any) -> str:
    """Celery's name for a pool class (``threads``, ``prefork``, …)."""
    from celery.concurrency import ALIASES

    if isinstance(pool_cls, str):
        return pool_cls
    path = f"{pool_cls.__module__}:{pool_cls.__qualname__}"
    return next((alias for alias, target in ALIASES.items() if target == path), path)


SWITCH_INTERVAL_SECONDS = 0.0005

# One byte shared by a worker's main process and the pool processes it forks (an
# anonymous shared mapping made before the fork): set when the worker shuts down warm,
# so that its drivers finish the turn they run and hand their sessions over, rather than
# drain the sessions' backlogs (which could hold a deploy for as long as those turns
# take).  Not a signal: billiard claims SIGUSR1 for soft time limits and resets others
# after Celery's per-process hook has run.  Pool processes must be forked for this (the
# default on Linux); spawned ones each get a byte of their own, and drain as before.
_stopping = mmap.mmap(-1, 1)
_made_in = os.getpid()


def stopping() -> bool:
    """Whether this worker is shutting down."""
    return _stopping[0] == 1


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _build_after_fork(**_kwargs: Any) -> None:
    # A worker process is I/O-bound with three threads (engine, delta flusher, lock
    # heartbeat): with Python's default 5 ms switch interval a thread whose socket read
    # finished can wait milliseconds for the GIL, which every transaction then pays.
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    if _made_in == os.getpid():
        log.warning(
            "this pool process was not forked from the worker: a warm shutdown cannot "
            "reach its drivers, which will drain their sessions before the worker stops"
        )
    metrics_export.forget_server()
    runtime()


@worker_init.connect  # type: ignore[untyped-decorator]
def _serve_metrics(**_kwargs: Any) -> None:
    # In the main process, before the pool forks: its processes count in the directory
    # this sets up, and this process serves their sum.
    if metrics_bind is not None:
        metrics_export.serve_worker(metrics_bind)
    instrument_celery(settings)


@worker_process_shutdown.connect  # type: ignore[untyped-decorator]
def _pool_process_exits(**_kwargs: Any) -> None:
    metrics_export.process_exited()
    tracing.shutdown()  # a pool process's buffered spans leave with it


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _stop_serving_metrics(**_kwargs: Any) -> None:
    metrics_export.stop_worker()
    tracing.shutdown()  # the threads pool's spans (its drivers ran in this process)


@worker_shutting_down.connect  # type: ignore[untyped-decorator]
def _stop_driving(**_kwargs: Any) -> None:
    # Sent in the main process on a warm shutdown (SIGTERM, a first SIGINT): its pool
    # processes see the byte at their next look, and with the solo and threads pools so
    # does it.  (On a cold one the tasks are cancelled first.)
    _stopping[0] = 1


def hand_over(session_id: str) -> None:
    """Pass a session on to another worker: a kick, always.  The kick being handled may
    still hold the session's kick-pending flag, which would stop a submission's kick;
    a duplicate kick is harmless.  The sweeper covers one that cannot be sent."""
    try:
        runtime().coordinator.mark_work(session_id)  # (the work mark and the flag)
        with apart_from_the_current_trace():
            send_kick(app, settings, session_id)
    except Exception:
        log.warning("could not hand session %s over; the sweeper will", session_id)


def kick_later(session_id: str, seconds: float, priority: str) -> None:
    """Kick a session in ``seconds`` (a turn waiting for provider capacity,
    docs/admission.md), on its lane's queue.  The sweeper covers one that cannot be sent,
    once the turn's capacity is due."""
    try:
        with apart_from_the_current_trace():
            send_kick(app, settings, session_id, priority=priority, countdown=seconds)
    except Exception:
        log.warning("could not schedule session %s's kick; the sweeper will", session_id)


def kick_now(session_id: str, priority: str) -> None:
    """Kick another session on its lane's queue: the child turns a held step opened, or
    the parent its last child's end queued again (docs/sub-agents.md).  The sweeper
    covers one that cannot be sent: their runs are queued in the database."""
    with apart_from_the_current_trace():
        send_kick(app, settings, session_id, priority=priority)


@app.task(name=c.DRIVE_TASK, ignore_result=True, bind=True)  # type: ignore[untyped-decorator]
def drive(task: Any, session_id: str) -> int:
    """Handle a kick for ``session_id``; a batch kick that ran a turn tops the batch
    window up again, into the place it left (src/parley/runtime/batch_window.py)."""
    validate_ids(session_id)
    fleet = runtime()
    ran = drive_session(
        fleet,
        session_id,
        stopping=stopping,
        hand_over=hand_over,
        defer=kick_later,
        kick=kick_now,
    )
    delivery = task.request.delivery_info or {}
    if ran and kick_queue(delivery.get("routing_key") or "") == settings.batch_queue:
        try:
            fill_batch_window(
                fleet.store,
                fleet.coordinator,
                _kick_batch,
                window=fleet.batch_window,
                weights=fleet.admission.tenant_weights,
            )
        except Exception:
            log.warning("could not kick the next batch line; the sweeper will", exc_info=True)
    return ran


def _kick_batch(session_id: str) -> None:
    send_kick(app, settings, session_id, priority="batch")


@app.task(name=c.SWEEP_TASK, ignore_result=True)  # type: ignore[untyped-decorator]
def sweeper() -> int:
    """One sweep, as a task (``parley beat`` runs the same sweep in a loop)."""
    return len(sweep_once())


def sweep_once() -> list[str]:
    """Re-kick the sessions that have work and no live driver."""
    return sweep(
        runtime(),
        lambda session_id, priority: send_kick(app, settings, session_id, priority=priority),
    )


#: What the sweeper meets while the broker, Redis or the database is down.
OUTAGES: tuple[type[Exception], ...] = (*BROKER_ERRORS, StoreError)


def run_sweeper(stop: threading.Event | None = None) -> None:
    """The ``beat`` process: sweep every ``PARLEY_SWEEP_SECONDS`` until stopped.

    It sweeps in its own process rather than as a scheduled task, so recovery never
    waits for a worker slot that long-running drivers occupy."""
    global _role
    _role = "parley-beat"
    stop = stop or threading.Event()
    if metrics_bind is not None:
        metrics_export.serve_process(metrics_bind)
    log.info("sweeping every %.1fs", settings.sweep_seconds)
    _connect_producer()
    housekeeper: Housekeeper | None = None
    timer: threading.Thread | None = None
    migrated = False
    try:
        while not stop.is_set():
            # Looked at until the database first answers: no sweep of an unmigrated one
            # can work, so beat stops on one line naming `parley migrate` (an outage,
            # by contrast, is waited out).
            missing: StoreError | None = None
            try:
                missing = None if migrated else unmigrated(runtime().store.engine)
                if missing is None:
                    migrated = True
                    sweep_once()
                    housekeeper = housekeeper or start_housekeeper()
                    timer = timer or _start_timer(stop)
            except OUTAGES as exc:  # (every sweep until it ends: one line each)
                log.warning("sweep failed (%s: %s); retrying", type(exc).__name__, exc)
            except Exception:
                log.warning("sweep failed; retrying", exc_info=True)
            if missing is not None:
                raise missing
            stop.wait(settings.sweep_seconds)
    finally:
        stop.set()  # (the timer's loop too)
        if timer is not None:
            timer.join()
        if housekeeper is not None:
            housekeeper.stop()


def _start_timer(stop: threading.Event) -> threading.Thread:
    """Beat's timer: a thread that releases the delayed turns whose time has come, and
    fires the schedules whose slot has, every ``TIMER_SECONDS`` (the sweep does too,
    less often), so that they start on time, however long they waited
    (docs/time.md#delayed-turns, docs/time.md#schedules)."""
    period = min(c.TIMER_SECONDS, settings.sweep_seconds)

    def run() -> None:
        failing = False
        while not stop.wait(period):
            try:
                release_due(runtime(), _kick)
                fire_due_schedules(runtime().store, runtime().coordinator, _kick)
            except Exception as exc:  # (an outage: the sweep says so on its own line)
                if not failing:
                    log.warning("could not release the turns whose time has come (%s)", exc)
                failing = True
            else:
                failing = False

    thread = threading.Thread(target=run, name="parley-timer", daemon=True)
    thread.start()
    return thread


def _kick(session_id: str, priority: str) -> None:
    send_kick(app, settings, session_id, priority=priority)


def _connect_producer() -> None:
    """Connect the kicks' producer now, not at the first lost kick: it costs some 30 ms
    of imports and setup, and an unreachable broker shows in the log at once, as does a
    kick queue of another type on RabbitMQ (:class:`QueueTypeMismatch`, which stops
    beat: no kick it sent would reach a worker)."""
    try:
        with app.producer_or_acquire() as producer:
            producer.connection.ensure_connection(max_retries=0)
        declare_kick_queues(app, settings)
    except QueueTypeMismatch:
        raise
    except BROKER_ERRORS as exc:
        log.warning(
            "the broker is not reachable yet (%s: %s); sweeping anyway", type(exc).__name__, exc
        )
    except Exception:
        log.warning("the broker is not reachable yet; sweeping anyway", exc_info=True)


def start_housekeeper() -> Housekeeper:
    """The fleet's webhook deliverer and session expiry, on a thread of the sweeper's
    process (docs/operations.md)."""
    fleet = runtime()
    host = fleet.engine.host if fleet.engine is not None else None
    return Housekeeper(
        fleet.store,
        fleet.coordinator,
        settings=WebhookSettings.from_settings(process_settings),
        default_retention=host.retention if host is not None else None,
    ).start()
