"""Schedules (docs/time.md#schedules): cron prompts in a time zone, and one row per slot
(its key the claim that fires it once fleet-wide).

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=True),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("cron", sa.String(200), nullable=False),
        sa.Column("timezone", sa.String(100), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("session_id", sa.String(36), nullable=True),
        sa.Column("root", sa.Text(), nullable=True),
        sa.Column("priority", sa.String(20), nullable=False),
        sa.Column("overlap", sa.String(16), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("misfire_grace_seconds", sa.Integer(), nullable=False),
        sa.Column("next_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_turn_id", sa.String(36), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_schedules"),
    )
    op.create_index("ix_schedules_next_at", "schedules", ["next_at"])
    op.create_index(
        "ix_schedules_tenant_created_at_id", "schedules", ["tenant", "created_at", "id"]
    )
    op.create_table(
        "schedule_runs",
        sa.Column("schedule_id", sa.String(36), nullable=False),
        sa.Column("slot_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("turn_id", sa.String(36), nullable=True),
        sa.Column("session_id", sa.String(36), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["schedule_id"], ["schedules.id"], name="fk_schedule_runs_schedule_id_schedules"
        ),
        sa.PrimaryKeyConstraint("schedule_id", "slot_at", name="pk_schedule_runs"),
    )


def downgrade() -> None:
    op.drop_table("schedule_runs")
    op.drop_index("ix_schedules_tenant_created_at_id", table_name="schedules")
    op.drop_index("ix_schedules_next_at", table_name="schedules")
    op.drop_table("schedules")
