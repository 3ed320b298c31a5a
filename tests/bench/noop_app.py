"""The floors of the fleet benchmark: a bare Celery task round trip on the same broker and
settings as parley's kicks, and a bare task that waits as long as a slow model's turn.
Each task pushes its key to a Redis list the bench waits on (no result backend, as in
parley).  kombu's own Redis channel unless
``PARLEY_BENCH_CHANNEL=parley`` (to show what parley's channel does for a bare task)."""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery.signals import celeryd_after_setup

from parley.fleet.app import create_app
from parley.fleet.settings import FleetSettings
from parley.settings import Settings

settings = FleetSettings.from_settings(Settings.from_environment())
app = create_app(
    settings,
    name="parley-bench-noop",
    stock_kombu=os.environ.get("PARLEY_BENCH_CHANNEL") != "parley",
)
_redis: redis.Redis | None = None
_connections = 10  # per Redis pool: kombu's default, until the worker says otherwise


@celeryd_after_setup.connect  # type: ignore[untyped-decorator]
def _size_pools(instance: Any, conf: Any, **_kwargs: Any) -> None:
    # As parley's workers do: on the threads pool each task acknowledges its message,
    # and signals, from its own thread, and Redis pools raise past their size.
    global _connections
    _connections = int(instance.concurrency) + 4
    conf.broker_transport_options = {
        **conf.broker_transport_options,
        "max_connections": _connections,
    }


@app.task(name="bench.noop", ignore_result=True)  # type: ignore[untyped-decorator]
def noop(key: str) -> None:
    """Signal that the task ran."""
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_pool(
            redis.BlockingConnectionPool.from_url(
                settings.redis_url, max_connections=_connections, timeout=None
            )
        )
    _redis.rpush(key, 1)


@app.task(name="bench.wait", ignore_result=True)  # type: ignore[untyped-decorator]
def wait(key: str, waits: int, wait_ms: float) -> None:
    """Wait as a slow model streams (``waits`` pauses of ``wait_ms``), then signal: the
    floor of the slow-model load, a task that holds its slot for as long as a turn does
    and does nothing else."""
    for _ in range(waits):
        time.sleep(wait_ms / 1000)
    noop(key)
