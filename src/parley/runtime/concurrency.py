"""How many turns one fleet process drives at once, and the connections that takes.

A turn mostly waits on its model.  On Celery's threads pool a worker process drives as
many turns at once as its concurrency, each kick on a thread of its own; on prefork (and
solo) each process that runs kicks drives one.  The connection pools of that process are
sized from this number, so that no driver waits for a connection while another only
waits on its model:

- Redis (the coordinator's two pools, and kombu's per channel on a Redis broker): a
  thread holds one connection for as long as its command or pipeline takes, so each
  pool may open one per driver, plus one for each of the coordinator's own threads (the
  delta flusher, the lock heartbeat) and a little slack.  Connections open as threads
  need them and stay open; Redis serves 10 000 clients by default.
- PostgreSQL: a driver holds a connection only for the length of a transaction (a claim,
  a step's commit, the end: a few milliseconds of each turn), and connections are
  costly (a server process each; 100 in all by default), so the pool is far smaller
  than the drivers: up to ``PARLEY_DATABASE_POOL_SIZE`` connections kept (default 10;
  no more than the drivers), as many as that setting again opened in a burst and closed
  after, and a driver that finds them all busy waits its turn.

How to choose the concurrency itself: docs/operations.md, "Concurrency".
"""

from __future__ import annotations

from dataclasses import dataclass

from parley.settings import Settings

POOLS_WITH_THREADS = ("threads", "gevent", "eventlet")
"""Celery pools that run a process's kicks side by side in that process: its concurrency
is how many it drives at once."""
COORDINATOR_THREADS = 2
"""The coordinator's own threads that talk to Redis: the delta flusher, the heartbeat."""
SLACK = 2
"""A few connections more: a hand-over's kick, a reader of the process's own."""
DATABASE_POOL_SIZE = Settings().database_pool_size
"""PostgreSQL connections a process keeps, unless ``PARLEY_DATABASE_POOL_SIZE`` says
otherwise."""


def drivers_per_process(pool: str, concurrency: int) -> int:
    """How many turns a process of a worker on Celery's ``pool`` with ``concurrency``
    drives at once: the concurrency on a pool of threads, one in each process on
    prefork (the concurrency is its number of processes) and on solo."""
    return max(1, concurrency) if pool in POOLS_WITH_THREADS else 1


@dataclass(frozen=True, kw_only=True)
class ConnectionBudget:
    """The connections one fleet process may open, for ``drivers`` turns at once."""

    drivers: int
    redis: int
    """At most this many in each Redis pool."""
    database: int
    """PostgreSQL connections kept in the pool."""
    database_overflow: int
    """PostgreSQL connections opened beyond those in a burst, and closed after."""

    @classmethod
    def for_drivers(
        cls, drivers: int, *, database_pool_size: int = DATABASE_POOL_SIZE
    ) -> ConnectionBudget:
        """The budget of a process that drives ``drivers`` turns at once."""
        return cls(
            drivers=drivers,
            redis=drivers + COORDINATOR_THREADS + SLACK,
            database=min(drivers, database_pool_size),
            database_overflow=database_pool_size,
        )
