"""The floor of the fleet benchmark: a bare Celery task round trip on the same broker and
settings as parley's kicks.  The task pushes its key to a Redis list the bench waits on
(no result backend, as in parley).  kombu's own Redis channel unless
``PARLEY_BENCH_CHANNEL=parley`` (to show what parley's channel does for a bare task)."""

from __future__ import annotations

import os

import redis

from broker_config.app import create_app
from broker_config.settings import FleetSettings

settings = FleetSettings.from_env()
app = create_app(
    settings,
    name="parley-bench-noop",
    stock_kombu=os.environ.get("PARLEY_BENCH_CHANNEL") != "parley",
)
_redis: redis.Redis | None = None


@app.task(name="bench.noop", ignore_result=True)  # type: ignore[untyped-decorator]
def noop(key: str) -> None:
    """Signal that the task ran."""
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(settings.redis_url)
    _redis.rpush(key, 1)
