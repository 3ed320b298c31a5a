"""Retention (docs/operations.md#retention): the store's side of pruning ended sessions.

An **ended session** is one none of whose turns is in flight (``queued``, ``running`` or
``waiting``: :data:`parley.store.statements.run_status.UNFINISHED`) and none of whose
webhook deliveries is still to make.  Its **newest activity** is
``sessions.last_active_at``: the newest end of its turns, else its creation (a submission
is activity too, but it puts a turn in flight, whose end then counts).  An ended session
**expires** when its newest activity is older than

* the cut a prune is given (``parley prune --older-than DAYS``), or
* its own time to live (``open_session(retention=...)``), or, when it has none, the host's
  (``Host(retention=...)``), where the caller knows the host.

A TTL is a longest life: a session goes at whichever comes first.

Each session is deleted in a transaction that first locks its row and then looks again:
a submission holds the same row while it inserts its turn, so it either committed first
(the look sees its turn in flight, and the session is kept whole) or waits and then
finds no session (:class:`SessionNotFound`).  On PostgreSQL that transaction is the
session's own (a fleet runs while it prunes: each transaction holds one session's rows).
On SQLite it deletes a chunk of :data:`SQLITE_PRUNE_CHUNK` sessions: SQLite has one
writer at a time, and every transaction holds the whole database's write lock from its
start, so a chunk holds nothing one session's transaction did not, for a few
milliseconds more, while each session in it is still looked at again under that lock,
and deleted whole or kept whole (a transaction per session took a prune of 100,000
sessions minutes, where a chunk each takes seconds).  Every row that refers to the
session goes with it: each table is reached through its ``session_id``, ``run_id`` or
``turn_id`` column (:data:`parley.store.statements.retention.PRUNED_TABLES`, derived
from the schema, so a table added later is covered or fails loudly at import).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from parley.schemas.operations import PrunedSession
from parley.store import statements as q
from parley.store.clock import utc_now
from parley.store.connection import Transactions
from parley.store.rows import aware

SQLITE_PRUNE_CHUNK = 200
"""Sessions a prune deletes per transaction on SQLite (see the module docstring)."""

# ------------------------------------------------------------------ which sessions expire


@dataclass(frozen=True)
class Cut:
    """What makes a session expire, as binds: the operator's cut (sessions idle since
    before ``older``), and the host's TTL as a cut for sessions without their own
    (``default``).  Sessions' own TTLs always count."""

    older: datetime | None
    default: datetime | None
    now: datetime

    @classmethod
    def of(
        cls,
        older_than: timedelta | None,
        default_retention: timedelta | None,
        now: datetime | None = None,
    ) -> Cut:
        now = now or utc_now()
        return cls(
            older=None if older_than is None else now - older_than,
            default=None if default_retention is None else now - default_retention,
            now=now,
        )

    def binds(self) -> dict[str, Any]:
        values: dict[str, Any] = {"b_now": self.now}
        if self.older is not None:
            values["b_older"] = self.older
        if self.default is not None:
            values["b_default"] = self.default
        return values

    @property
    def shape(self) -> tuple[bool, bool]:
        return self.older is not None, self.default is not None


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """An expired ended session as a page of candidates lists it."""

    session_id: str
    root: str
    last_active_at: datetime


@dataclass(frozen=True, kw_only=True)
class Deleted:
    """What deleting a session removed, and what its caller cleans up after the commit."""

    session: PrunedSession
    turn_ids: tuple[str, ...]
    root_in_use: bool | None
    """Another session (one left) has the same root: its workspace must stay (None: not
    looked up, no workspace is to be removed)."""


class RetentionStore:
    """Pruning (see the module docstring)."""

    def __init__(self, db: Transactions) -> None:
        self._db = db

    def expired_sessions(self, cut: Cut, after: Candidate | None = None) -> list[Candidate]:
        """A page of expired ended sessions, longest idle first (after ``after``)."""
        dialect = self._db.engine.dialect.name
        binds = cut.binds()
        if after is not None:
            binds.update(b_after_at=after.last_active_at, b_after_id=after.session_id)
        statement = q.expired_candidates(dialect, cut.shape, after is not None)
        rows = self._db.reading(lambda db: db.execute(statement, binds).all())
        return [
            Candidate(session_id=r.id, root=r.root, last_active_at=aware(r.last_active_at))
            for r in rows
        ]

    def awaiting_deliveries(self, cut: Cut) -> int:
        """Expired sessions with no turn in flight kept for an undelivered webhook."""
        statement = q.expired_awaiting_delivery(self._db.engine.dialect.name, cut.shape)
        return int(self._db.reading(lambda db: db.execute(statement, cut.binds()).scalar_one()))

    def sessions_with_retention(self) -> bool:
        """Whether any session has a time to live of its own."""
        found = self._db.reading(lambda db: db.execute(q.ANY_WITH_RETENTION).one_or_none())
        return found is not None

    def turn_count(self, session_id: str) -> int:
        """How many turns a session has."""
        return int(
            self._db.reading(
                lambda db: db.execute(
                    q.TURN_COUNT_OF_SESSION, {"b_session_id": session_id}
                ).scalar_one()
            )
        )

    @property
    def sessions_per_prune(self) -> int:
        """Sessions a prune deletes per transaction: one on PostgreSQL, a chunk on SQLite
        (see the module docstring)."""
        return 1 if self._db.engine.dialect.name == "postgresql" else SQLITE_PRUNE_CHUNK

    def prune_sessions(
        self, session_ids: Sequence[str], cut: Cut, *, roots: bool = False
    ) -> list[Deleted]:
        """Delete those of the sessions that are (still) expired and ended once their
        rows are locked, each with every row that refers to it, in one transaction; the
        others (a turn was submitted, or they are gone already) are left whole.  With
        ``roots``, also look up whether a session left has each one's root (for removing
        its workspace)."""
        with self._db.tx() as db:
            ids = {"b_session_ids": list(session_ids)}
            locked = db.execute(q.LOCK_SESSIONS_TO_PRUNE, ids).all()
            # A statement of its own, after the lock: on PostgreSQL it reads what a
            # submission that held a row committed (a fresh snapshot, READ COMMITTED).
            check = q.still_expired(self._db.engine.dialect.name, cut.shape)
            expired = set(db.execute(check, {**cut.binds(), **ids}).scalars()) if locked else set()
            doomed = [row for row in locked if row.id in expired]
            if not doomed:
                db.rollback()
                return []
            ids = {"b_session_ids": [row.id for row in doomed]}
            turns: dict[str, list[str]] = {row.id: [] for row in doomed}
            for turn in db.execute(q.TURNS_OF_SESSIONS, ids):
                turns[turn.session_id].append(turn.id)
            for statement in q.PRUNE_DELETES:
                db.execute(statement, ids)
            in_use = None
            if roots:
                in_use = {
                    root
                    for root in {row.root for row in doomed}
                    if db.execute(q.ROOT_IN_USE, {"b_root": root}).one_or_none() is not None
                }
        return [
            Deleted(
                session=PrunedSession(
                    session_id=row.id,
                    root=row.root,
                    turns=len(turns[row.id]),
                    last_active_at=aware(row.last_active_at or row.created_at),
                ),
                turn_ids=tuple(turns[row.id]),
                root_in_use=None if in_use is None else row.root in in_use,
            )
            for row in doomed
        ]
