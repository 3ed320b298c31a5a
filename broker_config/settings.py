"""Fleet settings, from the environment only."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from schemas.errors import InvalidRequest
from workers.coordination import constants as c
from workers.coordination.redis_clients import cluster_seeds, is_cluster
from workers.runtime.concurrency import DATABASE_POOL_SIZE

# Redis refuses an EXPIRE far enough out; no replay needs more than a year.
MAX_REPLAY_SECONDS = 365 * 86_400
MAX_STREAM_FLUSH_SECONDS = 1.0
#: RabbitMQ's queue types a fleet's kick queues may have (``PARLEY_BROKER_QUEUE_TYPE``).
QUEUE_TYPES = ("quorum", "classic")


@dataclass(frozen=True, kw_only=True)
class FleetSettings:
    """Where the fleet's state, signals and kicks live."""

    database_url: str
    redis_url: str
    broker_url: str
    host: str | None
    queue: str = c.TURN_QUEUE
    sweep_seconds: float = c.SWEEP_SECONDS
    replay_seconds: int = c.ENDED_BUFFER_SECONDS
    stream_flush_seconds: float = c.STREAM_FLUSH_SECONDS
    task_events: bool = False
    trace_celery: bool = False
    database_pool_size: int = DATABASE_POOL_SIZE
    queue_type: str = "quorum"
    """The kick queues' type on RabbitMQ (``quorum`` or ``classic``); a Redis broker has
    no queue types and ignores it."""

    def __post_init__(self) -> None:
        _check_redis_urls(self.redis_url, self.broker_url)

    @property
    def batch_queue(self) -> str:
        """The queue of batch turns' kicks, which every worker consumes after ``queue``
        (docs/admission.md#priority)."""
        return self.queue + c.BATCH_QUEUE_SUFFIX

    def queue_of(self, priority: str) -> str:
        """The queue a kick of a turn of ``priority`` goes to."""
        return self.batch_queue if priority == "batch" else self.queue

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FleetSettings:
        """``PARLEY_DATABASE_URL``, ``PARLEY_REDIS_URL``, ``PARLEY_HOST``, and optionally
        ``PARLEY_BROKER_URL`` (default: the Redis URL), ``PARLEY_QUEUE``,
        ``PARLEY_SWEEP_SECONDS``, ``PARLEY_REPLAY_SECONDS``,
        ``PARLEY_STREAM_FLUSH_SECONDS`` (0: send each delta as it comes),
        ``PARLEY_TASK_EVENTS`` (1: Celery's task events, for Flower),
        ``PARLEY_TRACE_CELERY`` (1: Celery's spans, with tracing on),
        ``PARLEY_DATABASE_POOL_SIZE`` and ``PARLEY_BROKER_QUEUE_TYPE``."""
        env = os.environ if env is None else env
        missing = [k for k in ("PARLEY_DATABASE_URL", "PARLEY_REDIS_URL") if not env.get(k)]
        if missing:
            raise InvalidRequest(f"the fleet needs {', '.join(missing)} in the environment")
        redis_url = env["PARLEY_REDIS_URL"]
        broker_url = env.get("PARLEY_BROKER_URL") or redis_url
        sweep_seconds = _seconds(env, "PARLEY_SWEEP_SECONDS", c.SWEEP_SECONDS)
        replay_seconds = _seconds(env, "PARLEY_REPLAY_SECONDS", c.ENDED_BUFFER_SECONDS)
        if replay_seconds != int(replay_seconds) or replay_seconds > MAX_REPLAY_SECONDS:
            raise InvalidRequest(
                "PARLEY_REPLAY_SECONDS must be a whole number of seconds, at most "
                f"{MAX_REPLAY_SECONDS} (a year)"
            )
        return cls(
            database_url=env["PARLEY_DATABASE_URL"],
            redis_url=redis_url,
            broker_url=broker_url,
            host=env.get("PARLEY_HOST") or None,
            queue=env.get("PARLEY_QUEUE") or c.TURN_QUEUE,
            sweep_seconds=sweep_seconds,
            replay_seconds=int(replay_seconds),
            # (Readers see text up to this much later: at most a second.)
            stream_flush_seconds=_seconds(
                env,
                "PARLEY_STREAM_FLUSH_SECONDS",
                c.STREAM_FLUSH_SECONDS,
                zero=True,
                most=MAX_STREAM_FLUSH_SECONDS,
            ),
            task_events=read_flag(env, "PARLEY_TASK_EVENTS"),
            trace_celery=read_flag(env, "PARLEY_TRACE_CELERY"),
            database_pool_size=_count(env, "PARLEY_DATABASE_POOL_SIZE", DATABASE_POOL_SIZE),
            queue_type=read_queue_type(env),
        )


def _check_redis_urls(redis_url: str, broker_url: str) -> None:
    """A Redis Cluster may hold the fleet's coordination, never its broker: kombu's Redis
    transport moves each kick between keys of different slots."""
    if is_cluster(redis_url):
        try:
            cluster_seeds(redis_url)
        except ValueError as exc:
            raise InvalidRequest(f"PARLEY_REDIS_URL: {exc}") from None
    if is_cluster(broker_url):
        raise InvalidRequest(
            "a Redis Cluster cannot be Celery's broker (kombu's Redis transport moves each "
            "kick between keys in different slots): set PARLEY_BROKER_URL to RabbitMQ "
            "(amqp://...) or to a Redis server of its own (redis://...)"
        )


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    """``env[name]`` as a positive whole number (``default`` if unset or empty)."""
    text = env.get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidRequest(f"{name} must be a whole number, not {text!r}") from None
    if value < 1:
        raise InvalidRequest(f"{name} must be at least 1, not {text!r}")
    return value


def _seconds(
    env: Mapping[str, str],
    name: str,
    default: float,
    *,
    zero: bool = False,
    most: float = math.inf,
) -> float:
    """``env[name]`` as a positive, finite number of seconds (from 0 with ``zero``; at
    most ``most``), ``default`` if unset or empty, as for every setting."""
    text = env.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InvalidRequest(f"{name} must be a number of seconds, not {text!r}") from None
    least_ok = value >= 0 if zero else value > 0
    if not (least_ok and value <= most and value < math.inf):
        bounds = f"from 0 to {most}" if zero else "a positive number of"
        raise InvalidRequest(f"{name} must be {bounds} seconds, not {text!r}")
    return value


def read_flag(env: Mapping[str, str], name: str) -> bool:
    """``env[name]`` as 1 or 0 (0 if unset or empty)."""
    text = env.get(name) or "0"
    if text not in {"0", "1"}:
        raise InvalidRequest(f"{name} must be 1 or 0, not {text!r}")
    return text == "1"


def read_queue_type(env: Mapping[str, str]) -> str:
    """``PARLEY_BROKER_QUEUE_TYPE``: ``quorum`` (if unset or empty) or ``classic``."""
    text = env.get("PARLEY_BROKER_QUEUE_TYPE") or QUEUE_TYPES[0]
    if text not in QUEUE_TYPES:
        raise InvalidRequest(f"PARLEY_BROKER_QUEUE_TYPE must be quorum or classic, not {text!r}")
    return text
