"""A partial index on the runs that still need a driver.

The sweeper asks which sessions have a queued or running run every few seconds.  With
only the (session_id, status) index that question reads every run ever stored; this
index holds only the runs in flight, so a sweep costs what is in flight, not the history.

On PostgreSQL the index is built concurrently, outside a transaction: a plain build would
lock ``runs`` against every submission and commit of a live fleet until it finished.  A
concurrent build that failed leaves an invalid index of the same name, dropped first.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

NAME = "ix_runs_active"
ACTIVE_RUN = "status IN ('queued', 'running')"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.create_index(NAME, "runs", ["session_id"], sqlite_where=sa.text(ACTIVE_RUN))
        return
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
        op.create_index(
            NAME,
            "runs",
            ["session_id"],
            postgresql_where=sa.text(ACTIVE_RUN),
            postgresql_concurrently=True,
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.drop_index(NAME, table_name="runs")
        return
    with op.get_context().autocommit_block():
        op.drop_index(NAME, table_name="runs", postgresql_concurrently=True)
