"""Sub-agents: a child session knows the agent call that opened it (docs/sub-agents.md).

``sessions`` gains the parent's run, held step and call id (a unique index over them: a
call opens its child once, whatever crashes and redeliveries happen), the parent's
turn, and the agent's path.  All None for the sessions that exist: no call opened them.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

UNIQUE = "ix_sessions_parent_run_id_parent_step_parent_call_id"


def upgrade() -> None:
    # Columns added in place, and a unique index rather than a constraint: SQLite adds
    # both without copying the table, which its foreign keys would refuse.
    op.add_column("sessions", sa.Column("parent_run_id", sa.String(36), nullable=True))
    op.add_column("sessions", sa.Column("parent_step", sa.Integer(), nullable=True))
    op.add_column("sessions", sa.Column("parent_call_id", sa.String(200), nullable=True))
    op.add_column("sessions", sa.Column("parent_turn_id", sa.String(36), nullable=True))
    op.add_column("sessions", sa.Column("agent", sa.Text(), nullable=True))
    op.create_index(
        UNIQUE, "sessions", ["parent_run_id", "parent_step", "parent_call_id"], unique=True
    )


def downgrade() -> None:
    op.drop_index(UNIQUE, table_name="sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("agent")
        batch.drop_column("parent_turn_id")
        batch.drop_column("parent_call_id")
        batch.drop_column("parent_step")
        batch.drop_column("parent_run_id")
