"""Retention (docs/operations.md#retention): the store's side of pruning ended sessions.

An **ended session** is one none of whose turns is in flight (``queued``, ``running`` or
``waiting``: :data:`workers.store.statements.run_status.UNFINISHED`) and none of whose
webhook deliveries is still to make.  Its **newest activity** is
``sessions.last_active_at``: the newest end of its turns, else its creation (a submission
is activity too, but it puts a turn in flight, whose end then counts).  An ended session
**expires** when its newest activity is older than

* the cut a prune is given (``parley prune --older-than DAYS``), or
* its own time to live (``open_session(retention=...)``), or, when it has none, the host's
  (``Host(retention=...)``), where the caller knows the host.

A TTL is a longest life: a session goes at whichever comes first.

Each session is deleted in a transaction of its own, which first locks its row and then
looks again: a submission holds the same row while it inserts its turn, so it either
committed first (the look sees its turn in flight, and the session is kept whole) or
waits and then finds no session (:class:`SessionNotFound`).  Every row that refers to the
session goes with it: each table is reached through its ``session_id``, ``run_id`` or
``turn_id`` column (:data:`workers.store.statements.retention.PRUNED_TABLES`, derived
from the schema, so a table added later is covered or fails loudly at import).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from schemas.operations import PrunedSession
from workers.store import statements as q
from workers.store.clock import utc_now
from workers.store.connection import Transactions
from workers.store.rows import aware

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
    root_in_use: bool
    """Another session (one left) has the same root: its workspace must stay."""


class RetentionStore(Transactions):
    """Pruning (see the module docstring)."""

    def expired_sessions(self, cut: Cut, after: Candidate | None = None) -> list[Candidate]:
        """A page of expired ended sessions, longest idle first (after ``after``)."""
        dialect = self.engine.dialect.name
        binds = cut.binds()
        if after is not None:
            binds.update(b_after_at=after.last_active_at, b_after_id=after.session_id)
        statement = q.expired_candidates(dialect, cut.shape, after is not None)
        rows = self._reading(lambda db: db.execute(statement, binds).all())
        return [
            Candidate(session_id=r.id, root=r.root, last_active_at=aware(r.last_active_at))
            for r in rows
        ]

    def awaiting_deliveries(self, cut: Cut) -> int:
        """Expired sessions with no turn in flight kept for an undelivered webhook."""
        statement = q.expired_awaiting_delivery(self.engine.dialect.name, cut.shape)
        return int(self._reading(lambda db: db.execute(statement, cut.binds()).scalar_one()))

    def sessions_with_retention(self) -> bool:
        """Whether any session has a time to live of its own."""
        found = self._reading(lambda db: db.execute(q.ANY_WITH_RETENTION).one_or_none())
        return found is not None

    def turn_count(self, session_id: str) -> int:
        """How many turns a session has."""
        return int(
            self._reading(
                lambda db: db.execute(
                    q.TURN_COUNT_OF_SESSION, {"b_session_id": session_id}
                ).scalar_one()
            )
        )

    def prune_session(self, session_id: str, cut: Cut) -> Deleted | None:
        """Delete the session and every row that refers to it, in one transaction, if it
        is (still) expired and ended once its row is locked; None if it is not (a turn
        was submitted, or it is gone already)."""
        with self._tx() as db:
            locked = db.execute(q.LOCK_SESSION_TO_PRUNE, {"b_session_id": session_id}).one_or_none()
            if locked is None:
                return None
            # A statement of its own, after the lock: on PostgreSQL it reads what a
            # submission that held the row committed (a fresh snapshot, READ COMMITTED).
            binds = {**cut.binds(), "b_session_id": session_id}
            check = q.still_expired(self.engine.dialect.name, cut.shape)
            if db.execute(check, binds).one_or_none() is None:
                db.rollback()
                return None
            turn_ids = tuple(
                db.execute(q.TURN_IDS_OF_SESSION, {"b_session_id": session_id}).scalars()
            )
            for statement in q.PRUNE_DELETES:
                db.execute(statement, {"b_session_id": session_id})
            in_use = db.execute(q.ROOT_IN_USE, {"b_root": locked.root}).one_or_none() is not None
        return Deleted(
            session=PrunedSession(
                session_id=session_id,
                root=locked.root,
                turns=len(turn_ids),
                last_active_at=aware(locked.last_active_at or locked.created_at),
            ),
            turn_ids=turn_ids,
            root_in_use=in_use,
        )
