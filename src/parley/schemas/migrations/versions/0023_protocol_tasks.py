"""A2A push notifications (docs/protocols.md#5-a2a): a turn's push configurations, and
the outbox's kind and token of a delivery made for one.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "push_configs",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("turn_id", sa.String(36), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("token", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["turn_id"], ["turns.id"], name="fk_push_configs_turn_id_turns"),
        sa.PrimaryKeyConstraint("id", name="pk_push_configs"),
    )
    op.create_index("ix_push_configs_turn_id", "push_configs", ["turn_id"])
    op.add_column("webhook_outbox", sa.Column("kind", sa.String(16), nullable=True))
    op.add_column("webhook_outbox", sa.Column("token", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("webhook_outbox") as batch:
        batch.drop_column("token")
        batch.drop_column("kind")
    op.drop_index("ix_push_configs_turn_id", table_name="push_configs")
    op.drop_table("push_configs")
