"""The store: parley's durable state, one transaction per method, on SQLite (embedded)
and PostgreSQL (fleet); the SQL itself lives, named, in :mod:`workers.store.statements`.

:class:`SqlStore` is the client-facing side (sessions, seeded histories, submissions,
steers, turn reads) on top of the driver's protocol (:mod:`workers.store.turn_runs`),
each in a module of its own, and the transaction plumbing
(:mod:`workers.store.connection`).  Concurrency rules:

* A session row is the lock for submissions and the fence for commits: every step and
  turn commit updates it ``WHERE fence = :fence``, so a driver whose token is stale
  changes nothing (:class:`Fenced`).
* A run row is the lock for its steer inbox: ``say`` and the inbox close both update it
  first, so a steer is either seen by the close (one more step) or refused (``TurnEnded``).
* Step inserts are ``ON CONFLICT DO NOTHING`` and guarded by ``runs.steps = :index``, so a
  commit retried after a cold shutdown can never write a step twice.
"""

from __future__ import annotations

from schemas.errors import StoreError
from workers.ports.backend import Store
from workers.store import statements as q
from workers.store.batches import BatchStore
from workers.store.database import (
    DEFAULT_ROLE,
    MAX_OVERFLOW,
    POOL_SIZE,
    create_database_engine,
)
from workers.store.leases import LeaseStore
from workers.store.outbox import OutboxStore
from workers.store.retention import RetentionStore
from workers.store.seeding import SeedStore
from workers.store.sessions import SessionStore
from workers.store.status import StatusStore
from workers.store.submissions import SubmissionStore
from workers.store.turn_reads import TurnReads
from workers.store.turn_runs import TurnRunStore


class SqlStore(
    SessionStore,
    SeedStore,
    BatchStore,
    SubmissionStore,
    TurnReads,
    TurnRunStore,
    LeaseStore,
    RetentionStore,
    OutboxStore,
    StatusStore,
    Store,
):
    """parley's durable state on SQLite or PostgreSQL (see the module docstring): the
    store port the engine talks to, and what clients read and write."""

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        pool_size: int = POOL_SIZE,
        max_overflow: int = MAX_OVERFLOW,
        role: str = DEFAULT_ROLE,
    ) -> SqlStore:
        """A store on a new engine for ``url`` (the options: those of
        :func:`~workers.store.database.create_database_engine`)."""
        return cls(
            create_database_engine(url, pool_size=pool_size, max_overflow=max_overflow, role=role)
        )

    def ping(self) -> bool:
        """Whether the database answers now (readiness checks)."""
        try:
            self._reading(lambda db: db.execute(q.PING).scalar_one())
        except StoreError:
            return False
        return True

    def table_counts(self) -> dict[str, int]:
        """Row counts per table (for benchmarks and storage checks)."""
        with self._tx() as db:
            return {name: int(db.execute(count).scalar_one()) for name, count in q.ROW_COUNTS}
