"""A session's seeded history as it was imported (docs/host.md#3-seeded-history): the
messages and the host's lossless raw rows, kept beside the turns they became.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    op.create_table(
        "seeds",
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("messages", json, nullable=False),
        sa.Column("raw_rows", json, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_seeds_session_id_sessions"
        ),
        sa.PrimaryKeyConstraint("session_id", name="pk_seeds"),
    )


def downgrade() -> None:
    op.drop_table("seeds")
