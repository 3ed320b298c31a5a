"""Statements of retention: what refers to a session (every table, reached through its
``session_id``, ``run_id`` or ``turn_id`` column), and which sessions expire, built per
dialect and per shape of cut (see :mod:`parley.store.retention`)."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Interval, Table, delete, func, literal_column, select, tuple_

from parley.schemas import tables as t
from parley.store.statements.binds import b
from parley.store.statements.outbox import UNSETTLED
from parley.store.statements.run_status import IS_UNFINISHED

s = t.sessions
PAGE = 200
"""Candidates read per query: a prune of many sessions pages through them."""


# ------------------------------------------------------------------ what refers to a session

_ids = b("session_ids", expanding=True)
_runs_of_sessions = select(t.runs.c.id).where(t.runs.c.session_id.in_(_ids))
_turns_of_sessions = select(t.turns.c.id).where(t.turns.c.session_id.in_(_ids))


def _delete_of(table: Table) -> Any:
    """The statement deleting ``table``'s rows of some sessions (``b_session_ids``)."""
    columns = table.c
    if table is s:
        return delete(s).where(s.c.id.in_(_ids))
    if "session_id" in columns:
        return delete(table).where(columns.session_id.in_(_ids))
    if "run_id" in columns:
        return delete(table).where(columns.run_id.in_(_runs_of_sessions.scalar_subquery()))
    if "turn_id" in columns:
        return delete(table).where(columns.turn_id.in_(_turns_of_sessions.scalar_subquery()))
    raise RuntimeError(
        f"table {table.name!r} has no session_id, run_id or turn_id column: "
        "pruning cannot tell which session its rows belong to "
        "(src/parley/store/statements/retention.py)"
    )


# Tenant-owned rows that belong to no session (files and batches): pruned as batches
# end (src/parley/store/batches.py), not with a session.  A batch's lines do belong to
# their sessions, and go with them.
NOT_OF_A_SESSION = (t.files, t.file_parts, t.batches)
# Children before parents (the schema's dependency order, reversed), the session last.
PRUNED_TABLES: tuple[Table, ...] = tuple(
    table for table in reversed(t.metadata.sorted_tables) if table not in NOT_OF_A_SESSION
)
PRUNE_DELETES: tuple[Any, ...] = tuple(_delete_of(table) for table in PRUNED_TABLES)

LOCK_SESSIONS_TO_PRUNE = (
    select(s.c.id, s.c.root, s.c.last_active_at, s.c.created_at)
    .where(s.c.id.in_(_ids))
    .with_for_update()
)
TURNS_OF_SESSIONS = select(t.turns.c.id, t.turns.c.session_id).where(t.turns.c.session_id.in_(_ids))
TURN_COUNT_OF_SESSION = select(func.count()).where(t.turns.c.session_id == b("session_id"))

# Whether a session (one left) has the root of one just deleted: one index lookup.
ROOT_IN_USE = select(s.c.id).where(s.c.root == b("root")).limit(1)
ANY_WITH_RETENTION = select(s.c.id).where(s.c.retention_seconds.is_not(None)).limit(1)


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


_in_flight = select(t.runs.c.id).where(t.runs.c.session_id == s.c.id, IS_UNFINISHED).exists()
_awaiting_delivery = (
    select(t.webhook_outbox.c.id)
    .where(t.webhook_outbox.c.session_id == s.c.id, *UNSETTLED)
    .exists()
)


@cache
def expired_candidates(dialect: str, shape: tuple[bool, bool], paged: bool) -> Any:
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
    """Which of some sessions (``b_session_ids``, their rows locked) are still expired and
    ended."""
    return select(s.c.id).where(
        s.c.id.in_(_ids), _expired(dialect, shape), ~_in_flight, ~_awaiting_delivery
    )


@cache
def expired_awaiting_delivery(dialect: str, shape: tuple[bool, bool]) -> Any:
    """How many expired sessions with no turn in flight wait for a webhook delivery."""
    return select(func.count()).where(_expired(dialect, shape), ~_in_flight, _awaiting_delivery)
