"""Counts of sub-agents (docs/sub-agents.md#9-counts): a partial index of the runs that
wait for agents (a parent whose step waits for its child turns, a child waiting for a
place among its step's), which the sweeper counts for the metrics every sweep, so the
count costs what waits for agents, not the history.

On PostgreSQL the index is built concurrently, outside a transaction, as revision 0021
built its own (a plain build would lock ``runs`` against a live fleet).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

AGENT_WAIT_RUN = "status = 'waiting' AND waiting_for = 'agents'"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.create_index(
            "ix_runs_agents", "runs", ["session_id"], sqlite_where=sa.text(AGENT_WAIT_RUN)
        )
        return
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS ix_runs_agents")
        op.create_index(
            "ix_runs_agents",
            "runs",
            ["session_id"],
            postgresql_where=sa.text(AGENT_WAIT_RUN),
            postgresql_concurrently=True,
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.drop_index("ix_runs_agents", table_name="runs")
        return
    with op.get_context().autocommit_block():
        op.drop_index("ix_runs_agents", table_name="runs", postgresql_concurrently=True)
