"""Replay (docs/replay.md): the session a replay session re-ran.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("replay_of", sa.String(36), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("replay_of")
