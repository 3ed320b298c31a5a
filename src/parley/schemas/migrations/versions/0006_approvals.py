"""Durable approvals: tool calls that wait for a person's answer, holding no worker.

``approvals`` keeps each call that asked and its one answer; ``runs.held_step`` the step
whose calls wait (its model output and how each call goes on), until the step commits
whole.  A run that waits has the status ``waiting``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)
EXPIRING = "decision IS NULL AND expires_at IS NOT NULL"


def upgrade() -> None:
    op.add_column("runs", sa.Column("held_step", Json, nullable=True))
    op.add_column(
        "runs",
        sa.Column("approval_count", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    op.create_table(
        "approvals",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("turn_id", sa.String(36), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("call_id", sa.String(200), nullable=False),
        sa.Column("tool", sa.String(200), nullable=False),
        sa.Column("arguments", Json, nullable=False),
        sa.Column("accesses", Json, nullable=False),
        sa.Column("requested_at", Timestamp, nullable=False),
        sa.Column("expires_at", Timestamp, nullable=True),
        sa.Column("decision", sa.String(20), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("decided_at", Timestamp, nullable=True),
        sa.Column("consumed_at", Timestamp, nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_approvals_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_approvals"),
        sa.UniqueConstraint(
            "run_id", "step_index", "call_id", name="uq_approvals_run_id_step_index_call_id"
        ),
    )
    op.create_index("ix_approvals_turn_id", "approvals", ["turn_id"])
    op.create_index(
        "ix_approvals_expiring",
        "approvals",
        ["expires_at"],
        postgresql_where=sa.text(EXPIRING),
        sqlite_where=sa.text(EXPIRING),
    )


def downgrade() -> None:
    op.drop_table("approvals")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("approval_count")
        batch.drop_column("held_step")
