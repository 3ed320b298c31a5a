"""A partial index on the runs that still need a driver.

The sweeper asks which sessions have a queued or running run every few seconds.  With
only the (session_id, status) index that question reads every run ever stored; this
index holds only the runs in flight, so a sweep costs what is in flight, not the history.

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

ACTIVE_RUN = "status IN ('queued', 'running')"


def upgrade() -> None:
    op.create_index(
        "ix_runs_active",
        "runs",
        ["session_id"],
        postgresql_where=sa.text(ACTIVE_RUN),
        sqlite_where=sa.text(ACTIVE_RUN),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_active", table_name="runs")
