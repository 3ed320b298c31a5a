"""Count the attempts at a run that committed no step, apart from all its claims.

A run gives up after ``MAX_ATTEMPTS`` claims in a row without progress (a crash loop).
Counting every claim instead failed a long, healthy turn that was merely taken over ten
times (Redis emptied every few seconds).  ``runs.stalled_attempts`` is raised by each
claim and reset by each committed step and by a resume; existing runs start at 0.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A constant default: PostgreSQL adds the column without rewriting the table.
    op.add_column(
        "runs",
        sa.Column("stalled_attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("stalled_attempts")
