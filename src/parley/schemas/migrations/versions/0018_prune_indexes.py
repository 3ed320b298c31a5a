"""Indexes for pruning many sessions (pruning 100,000 took some 17 minutes on SQLite).

Deleting a row that others refer to makes the database check that none still does: for
a turn, that no turn hangs under it (``turns.parent_id``) and no webhook delivery names
it (``webhook_outbox.turn_id``); for a run, that no delivery names it
(``webhook_outbox.run_id``).  Without an index each check read the whole table: every
turn, for every turn deleted.  And a prune reads its candidates in the order of
``(last_active_at, id)``: sessions made or cancelled together share a time, and with an
index of the time alone each page sorted every one of them; the index of both replaces
it.

On PostgreSQL the indexes are built concurrently, outside a transaction, as 0003's is.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_turns_parent_id", "turns", ["parent_id"]),
    ("ix_webhook_outbox_turn_id", "webhook_outbox", ["turn_id"]),
    ("ix_webhook_outbox_run_id", "webhook_outbox", ["run_id"]),
    ("ix_sessions_last_active_at_id", "sessions", ["last_active_at", "id"]),
)
REPLACED = ("ix_sessions_last_active_at", "sessions", ["last_active_at"])


def upgrade() -> None:
    _create(INDEXES)
    _drop([REPLACED])


def downgrade() -> None:
    _create([REPLACED])
    _drop(INDEXES)


def _create(indexes: Sequence[tuple[str, str, list[str]]]) -> None:
    if op.get_bind().dialect.name != "postgresql":
        for name, table, columns in indexes:
            op.create_index(name, table, columns)
        return
    with op.get_context().autocommit_block():
        for name, table, columns in indexes:
            # (A concurrent build that failed leaves an invalid index of the same name.)
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            op.create_index(name, table, columns, postgresql_concurrently=True)


def _drop(indexes: Sequence[tuple[str, str, list[str]]]) -> None:
    if op.get_bind().dialect.name != "postgresql":
        for name, table, _columns in indexes:
            op.drop_index(name, table_name=table)
        return
    with op.get_context().autocommit_block():
        for name, table, _columns in indexes:
            op.drop_index(name, table_name=table, postgresql_concurrently=True)
