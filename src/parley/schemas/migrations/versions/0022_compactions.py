"""Compactions (docs/compaction.md): what the model sees instead of the older turns of a
session's path, one row each, beside the append-only tree.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    op.create_table(
        "compactions",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("through_turn_id", sa.String(36), nullable=False),
        sa.Column("made_by_turn_id", sa.String(36), nullable=True),
        sa.Column("strategy", sa.String(20), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("messages", json, nullable=False),
        sa.Column("tokens_before", sa.Integer(), nullable=False),
        sa.Column("tokens_after", sa.Integer(), nullable=False),
        sa.Column("usage", json, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("dropped_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_compactions_session_id_sessions"
        ),
        sa.ForeignKeyConstraint(
            ["through_turn_id"], ["turns.id"], name="fk_compactions_through_turn_id_turns"
        ),
        sa.ForeignKeyConstraint(
            ["made_by_turn_id"], ["turns.id"], name="fk_compactions_made_by_turn_id_turns"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_compactions"),
    )
    op.create_index(
        "ix_compactions_session_id_created_at", "compactions", ["session_id", "created_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_compactions_session_id_created_at", table_name="compactions")
    op.drop_table("compactions")
