"""A session's batch: ``sessions.batch_id`` names the batch whose line opened it, so the
page lists a tenant's conversations without the sessions of its batches (they are
listed under their batch), from a partial index that holds the conversations alone.

The sessions batch lines opened before this revision are given their batch from
``batch_lines``; every other session stays a conversation (null).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-08
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

CONVERSATION = "batch_id IS NULL"


def upgrade() -> None:
    op.add_column("sessions", sa.Column("batch_id", sa.String(40), nullable=True))
    op.execute(
        "UPDATE sessions SET batch_id = (SELECT batch_lines.batch_id FROM batch_lines "
        "WHERE batch_lines.session_id = sessions.id AND batch_lines.opened_session) "
        "WHERE sessions.id IN (SELECT batch_lines.session_id FROM batch_lines "
        "WHERE batch_lines.opened_session)"
    )
    op.create_index(
        "ix_sessions_conversations",
        "sessions",
        ["tenant", "created_at", "id"],
        postgresql_where=sa.text(CONVERSATION),
        sqlite_where=sa.text(CONVERSATION),
    )


def downgrade() -> None:
    op.drop_index("ix_sessions_conversations", "sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("batch_id")
