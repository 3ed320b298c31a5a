"""The fleet's settings: its part of the process's :class:`~parley.settings.Settings`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from parley.coordination import constants as c
from parley.coordination.redis_clients import cluster_seeds, is_cluster
from parley.runtime.concurrency import DATABASE_POOL_SIZE
from parley.schemas.errors import InvalidRequest
from parley.settings import Settings


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
    def from_settings(cls, settings: Settings) -> FleetSettings:
        """The fleet's part of ``settings``: ``PARLEY_DATABASE_URL`` and
        ``PARLEY_REDIS_URL`` are needed; the rest have their defaults
        (docs/reference.md#configuration)."""
        missing = [
            name
            for name, value in (
                ("PARLEY_DATABASE_URL", settings.database_url),
                ("PARLEY_REDIS_URL", settings.redis_url),
            )
            if not value
        ]
        if missing or settings.database_url is None or settings.redis_url is None:
            raise InvalidRequest(f"the fleet needs {', '.join(missing)} in the environment")
        return cls(
            database_url=settings.database_url,
            redis_url=settings.redis_url,
            broker_url=settings.broker_url or settings.redis_url,
            host=settings.host,
            queue=settings.queue,
            sweep_seconds=settings.sweep_seconds,
            replay_seconds=settings.replay_seconds,
            stream_flush_seconds=settings.stream_flush_seconds,
            task_events=settings.task_events,
            trace_celery=settings.trace_celery,
            database_pool_size=settings.database_pool_size,
            queue_type=settings.broker_queue_type,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> FleetSettings:
        """The fleet's settings ``env`` names (:meth:`from_settings`)."""
        return cls.from_settings(Settings.from_environment(env))


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
