"""Retention (SPEC §8): the store's side of pruning ended sessions.

An **ended session** is one none of whose turns is in flight (``queued``, ``running`` or
``waiting``: :data:`workers.store.statements.UNFINISHED`) and none of whose webhook deliveries
is still to make.  Its **newest activity** is ``sessions.last_active_at``: the newest end
of its turns, else its creation (a submission is activity too, but it puts a turn in
flight, whose end then counts).  An ended session **expires** when its newest activity is
older than

* the cut a prune is given (``parley prune --older-than DAYS``), or
* its own time to live (``open_session(retention=...)``), or, when it has none, the host's
  (``Host(retention=...)``), where the caller knows the host.

A TTL is a longest life: a session goes at whichever comes first.

Each session is deleted in a transaction of its own, which first locks its row and then
looks again: a submission holds the same row while it inserts its turn, so it either
committed first (the look sees its turn in flight, and the session is kept whole) or
waits and then finds no session (:class:`SessionNotFound`).  Every row that refers to the
session goes with it: each table is reached through its ``session_id``, ``run_id`` or
``turn_id`` column (:data:`PRUNED_TABLES`, derived from the schema, so a table added later
is covered or fails loudly at import).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import Interval, Table, delete, func, literal_column, select, tuple_

from schemas import tables as t
from schemas.operations import PrunedSession
from workers.store import statements as q
from workers.store.connection import Transactions
from workers.store.outbox import UNSETTLED
from workers.store.rows import aware
from workers.store.statements import b

s = t.sessions
PAGE = 200
"""Candidates read per query: a prune of many sessions pages through them."""


def _now() -> datetime:
    return datetime.now(UTC)


# ------------------------------------------------------------------ what refers to a session

_runs_of_session = select(t.runs.c.id).where(t.runs.c.session_id == b("session_id"))
_turns_of_session = select(t.turns.c.id).where(t.turns.c.session_id == b("session_id"))


def _delete_of(table: Table) -> Any:
    """The statement deleting ``table``'s rows of one session (``b_session_id``)."""
    columns = table.c
    if table is s:
        return delete(s).where(s.c.id == b("session_id"))
    if "session_id" in columns:
        return delete(table).where(columns.session_id == b("session_id"))
    if "run_id" in columns:
        return delete(table).where(columns.run_id.in_(_runs_of_session.scalar_subquery()))
    if "turn_id" in columns:
        return delete(table).where(columns.turn_id.in_(_turns_of_session.scalar_subquery()))
    raise RuntimeError(
        f"table {table.name!r} has no session_id, run_id or turn_id column: "
        "pruning cannot tell which session its rows belong to (workers/store/retention.py)"
    )


# Children before parents (the schema's dependency order, reversed), the session last.
PRUNED_TABLES: tuple[Table, ...] = tuple(reversed(t.metadata.sorted_tables))
DELETES: tuple[Any, ...] = tuple(_delete_of(table) for table in PRUNED_TABLES)

LOCK_SESSION = (
    select(s.c.id, s.c.root, s.c.last_active_at, s.c.created_at)
    .where(s.c.id == b("session_id"))
    .with_for_update()
)
TURN_IDS = select(t.turns.c.id).where(t.turns.c.session_id == b("session_id"))
TURN_COUNT = select(func.count()).where(t.turns.c.session_id == b("session_id"))
ROOT_IN_USE = select(s.c.id).where(s.c.root == b("root")).limit(1)
ANY_WITH_RETENTION = select(s.c.id).where(s.c.retention_seconds.is_not(None)).limit(1)


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
        now = now or _now()
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


def _own_ttl_passed(dialect: str) -> Any:
    """A session's own TTL has run out (it has one, and its idle time exceeds it)."""
    if dialect == "postgresql":
        ttl = literal_column("make_interval(secs => sessions.retention_seconds)", Interval)
        passed = s.c.last_active_at + ttl < b("now", type_=t.Timestamp)
    else:
        # SQLite keeps timestamps as text; julianday() reads it (to the millisecond).
        idle = func.julianday(b("now", type_=t.Timestamp)) - func.julianday(s.c.last_active_at)
        passed = idle * 86_400 > s.c.retention_seconds
    return s.c.retention_seconds.is_not(None) & passed


def _expired(dialect: str, shape: tuple[bool, bool]) -> Any:
    older, default = shape
    condition = _own_ttl_passed(dialect)
    if older:
        condition = condition | (s.c.last_active_at < b("older", type_=t.Timestamp))
    if default:
        condition = condition | (
            s.c.retention_seconds.is_(None) & (s.c.last_active_at < b("default", type_=t.Timestamp))
        )
    return condition


_in_flight = select(t.runs.c.id).where(t.runs.c.session_id == s.c.id, q.IS_UNFINISHED).exists()
_awaiting_delivery = (
    select(t.webhook_outbox.c.id)
    .where(t.webhook_outbox.c.session_id == s.c.id, *UNSETTLED)
    .exists()
)


@cache
def candidates(dialect: str, shape: tuple[bool, bool], paged: bool) -> Any:
    """Expired ended sessions (id, root, newest activity), longest idle first, a page at a
    time (after ``b_after_at``, ``b_after_id`` when ``paged``)."""
    statement = (
        select(s.c.id, s.c.root, s.c.last_active_at)
        .where(_expired(dialect, shape), ~_in_flight, ~_awaiting_delivery)
        .order_by(s.c.last_active_at, s.c.id)
        .limit(PAGE)
    )
    if paged:
        statement = statement.where(
            tuple_(s.c.last_active_at, s.c.id)
            > tuple_(b("after_at", type_=t.Timestamp), b("after_id", type_=t.Id))
        )
    return statement


@cache
def still_expired(dialect: str, shape: tuple[bool, bool]) -> Any:
    """Whether one session (``b_session_id``, its row locked) is still expired and ended."""
    return select(s.c.id).where(
        s.c.id == b("session_id"), _expired(dialect, shape), ~_in_flight, ~_awaiting_delivery
    )


@cache
def awaiting_deliveries(dialect: str, shape: tuple[bool, bool]) -> Any:
    """How many expired sessions with no turn in flight wait for a webhook delivery."""
    return select(func.count()).where(_expired(dialect, shape), ~_in_flight, _awaiting_delivery)


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
        statement = candidates(dialect, cut.shape, after is not None)
        rows = self._reading(lambda db: db.execute(statement, binds).all())
        return [
            Candidate(session_id=r.id, root=r.root, last_active_at=aware(r.last_active_at))
            for r in rows
        ]

    def awaiting_deliveries(self, cut: Cut) -> int:
        """Expired sessions with no turn in flight kept for an undelivered webhook."""
        statement = awaiting_deliveries(self.engine.dialect.name, cut.shape)
        return int(self._reading(lambda db: db.execute(statement, cut.binds()).scalar_one()))

    def sessions_with_retention(self) -> bool:
        """Whether any session has a time to live of its own."""
        found = self._reading(lambda db: db.execute(ANY_WITH_RETENTION).one_or_none())
        return found is not None

    def turn_count(self, session_id: str) -> int:
        """How many turns a session has."""
        return int(
            self._reading(
                lambda db: db.execute(TURN_COUNT, {"b_session_id": session_id}).scalar_one()
            )
        )

    def prune_session(self, session_id: str, cut: Cut) -> Deleted | None:
        """Delete the session and every row that refers to it, in one transaction, if it
        is (still) expired and ended once its row is locked; None if it is not (a turn
        was submitted, or it is gone already)."""
        with self._tx() as db:
            locked = db.execute(LOCK_SESSION, {"b_session_id": session_id}).one_or_none()
            if locked is None:
                return None
            # A statement of its own, after the lock: on PostgreSQL it reads what a
            # submission that held the row committed (a fresh snapshot, READ COMMITTED).
            binds = {**cut.binds(), "b_session_id": session_id}
            check = still_expired(self.engine.dialect.name, cut.shape)
            if db.execute(check, binds).one_or_none() is None:
                db.rollback()
                return None
            turn_ids = tuple(db.execute(TURN_IDS, {"b_session_id": session_id}).scalars())
            for statement in DELETES:
                db.execute(statement, {"b_session_id": session_id})
            in_use = db.execute(ROOT_IN_USE, {"b_root": locked.root}).one_or_none() is not None
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
