"""A session's title (shown in the web page's list and header): given when the session
is opened or set later, else the first prompt's when the first turn is submitted.

Nullable: a session made before this revision, or without a turn yet, has none.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("title", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("sessions", "title")
