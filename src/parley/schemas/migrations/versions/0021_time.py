"""Delayed turns (docs/time.md#delayed-turns): the sweeper reads the queued runs whose
time has come from a partial index that holds only the runs waiting for a time
(``ix_runs_due``, on ``not_before``), the runs it kicks from one that no longer holds
them (``ix_runs_active`` leaves out a run with a time still set), and counts the turns
waiting for provider capacity from one of their own (``ix_runs_capacity``), so a sweep
costs what is due and in flight, not what waits for later.

On PostgreSQL the indexes are built concurrently, outside a transaction, as revision
0003 built the first (a plain build would lock ``runs`` against a live fleet).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

OLD_ACTIVE_RUN = "status IN ('queued', 'running')"
ACTIVE_RUN = "status IN ('queued', 'running') AND not_before IS NULL"
DUE_RUN = "status = 'queued' AND not_before IS NOT NULL"
CAPACITY_RUN = "status = 'queued' AND not_before IS NOT NULL AND waiting_for = 'capacity'"


def _build(name: str, column: str | list[str], where: str) -> None:
    columns = [column] if isinstance(column, str) else column
    if op.get_bind().dialect.name != "postgresql":
        op.create_index(name, "runs", columns, sqlite_where=sa.text(where))
        return
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        op.create_index(
            name,
            "runs",
            columns,
            postgresql_where=sa.text(where),
            postgresql_concurrently=True,
        )


def _drop(name: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.drop_index(name, table_name="runs")
        return
    with op.get_context().autocommit_block():
        op.drop_index(name, table_name="runs", postgresql_concurrently=True)


def _replace_active(where: str) -> None:
    """``ix_runs_active`` rebuilt on ``where``.  On PostgreSQL the new one is built under
    another name first, so the sweeper's look is never left without one, then takes
    the old one's name (SQLite, which cannot rename an index, rebuilds it in the
    migration's transaction)."""
    if op.get_bind().dialect.name != "postgresql":
        _drop("ix_runs_active")
        _build("ix_runs_active", "session_id", where)
        return
    _build("ix_runs_active_next", "session_id", where)
    _drop("ix_runs_active")
    op.execute("ALTER INDEX ix_runs_active_next RENAME TO ix_runs_active")


def upgrade() -> None:
    _build("ix_runs_due", "not_before", DUE_RUN)
    _build("ix_runs_capacity", ["tenant", "priority"], CAPACITY_RUN)
    _replace_active(ACTIVE_RUN)


def downgrade() -> None:
    _replace_active(OLD_ACTIVE_RUN)
    _drop("ix_runs_capacity")
    _drop("ix_runs_due")
