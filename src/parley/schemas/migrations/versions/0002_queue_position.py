"""Queue order from a counter taken under the session lock, not from a clock.

``runs.queue_position`` is handed out by ``sessions.turn_count`` (now: positions given
to submissions and resumes), so turns start in the order their submissions took the
session's lock, whatever the producers' clocks say.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("queue_position", sa.BigInteger(), nullable=True))
    op.execute(
        "UPDATE runs SET queue_position = (SELECT ordinal FROM turns WHERE turns.id = runs.turn_id)"
    )
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("queue_position", existing_type=sa.BigInteger(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("queue_position")
