"""A session's rows in every table, counted by hand, and its idle clock set back: for the
retention tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from parley.store.sql_store import SqlStore


def age(store: SqlStore, session_id: str, by: timedelta) -> None:
    """Make the session's newest activity ``by`` ago (as if it had idled since)."""
    with store.engine.begin() as db:
        db.execute(
            text("UPDATE sessions SET last_active_at = :at WHERE id = :id"),
            {"at": datetime.now(UTC) - by, "id": session_id},
        )


# Each table's rows of one session, found by the way the table names it: written out here,
# apart from the prune's own derivation, so that the two check each other.
ROWS_OF_SESSION = {
    "sessions": "SELECT count(*) FROM sessions WHERE id = :s",
    "prefixes": "SELECT count(*) FROM prefixes WHERE session_id = :s",
    "seeds": "SELECT count(*) FROM seeds WHERE session_id = :s",
    "turns": "SELECT count(*) FROM turns WHERE session_id = :s",
    "runs": "SELECT count(*) FROM runs WHERE session_id = :s",
    "webhook_outbox": "SELECT count(*) FROM webhook_outbox WHERE session_id = :s",
    "session_leases": "SELECT count(*) FROM session_leases WHERE session_id = :s",
    "steps": "SELECT count(*) FROM steps JOIN runs ON runs.id = steps.run_id "
    "WHERE runs.session_id = :s",
    "steers": "SELECT count(*) FROM steers JOIN runs ON runs.id = steers.run_id "
    "WHERE runs.session_id = :s",
    "approvals": "SELECT count(*) FROM approvals JOIN runs ON runs.id = approvals.run_id "
    "WHERE runs.session_id = :s",
    "events": "SELECT count(*) FROM events JOIN turns ON turns.id = events.turn_id "
    "WHERE turns.session_id = :s",
    "batch_lines": "SELECT count(*) FROM batch_lines WHERE session_id = :s",
    "compactions": "SELECT count(*) FROM compactions WHERE session_id = :s",
    "push_configs": "SELECT count(*) FROM push_configs JOIN turns "
    "ON turns.id = push_configs.turn_id WHERE turns.session_id = :s",
    "event_waits": "SELECT count(*) FROM event_waits JOIN runs "
    "ON runs.id = event_waits.run_id WHERE runs.session_id = :s",
    "signals": "SELECT count(*) FROM signals JOIN runs ON runs.id = signals.run_id "
    "WHERE runs.session_id = :s",
}

OF_NO_SESSION = frozenset({"files", "file_parts", "batches", "schedules", "schedule_runs"})
"""Tables whose rows belong to a tenant, not a session: a batch's pruned as it ends, a
schedule's kept until it is deleted (a slot's record names the turn it fired, which a
prune of that turn's session leaves as a record of the firing)."""


HELD_WHILE_DRIVEN = frozenset({"session_leases"})
"""Tables whose rows of a session live only while a driver holds it: an ended session
has none, unless a driver's letting go failed (then prune deletes them too)."""


def rows_of(store: SqlStore, session_id: str) -> dict[str, int]:
    with store.engine.connect() as db:
        return {
            table: int(db.execute(text(sql), {"s": session_id}).scalar_one())
            for table, sql in ROWS_OF_SESSION.items()
        }
