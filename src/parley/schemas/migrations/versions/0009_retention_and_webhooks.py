"""Retention and webhooks (docs/operations.md): a session's own time to live and webhook URL, its
newest activity (what retention counts from), and the webhook outbox.

``sessions.last_active_at`` is filled in for the sessions there are: the newest end of
their turns, else their creation.  It stays nullable (a column added to a table with rows
could not be NOT NULL on SQLite without rebuilding the table, which foreign keys refuse),
but parley always writes it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)
UNSETTLED = "delivered_at IS NULL AND given_up_at IS NULL"


def upgrade() -> None:
    op.add_column("sessions", sa.Column("retention_seconds", sa.BigInteger(), nullable=True))
    op.add_column("sessions", sa.Column("webhook_url", sa.Text(), nullable=True))
    op.add_column("sessions", sa.Column("last_active_at", Timestamp, nullable=True))
    op.execute(
        "UPDATE sessions SET last_active_at = COALESCE("
        "(SELECT MAX(runs.ended_at) FROM runs WHERE runs.session_id = sessions.id), "
        "sessions.created_at)"
    )
    op.create_index("ix_sessions_last_active_at", "sessions", ["last_active_at"])
    op.create_index("ix_sessions_root", "sessions", ["root"])
    op.create_table(
        "webhook_outbox",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("turn_id", sa.String(36), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(20), nullable=False),
        sa.Column("reply", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("ended_at", Timestamp, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", Timestamp, nullable=False),
        sa.Column("last_attempt_at", Timestamp, nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", Timestamp, nullable=True),
        sa.Column("given_up_at", Timestamp, nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_webhook_outbox_session_id_sessions"
        ),
        sa.ForeignKeyConstraint(["turn_id"], ["turns.id"], name="fk_webhook_outbox_turn_id_turns"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_webhook_outbox_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_outbox"),
    )
    op.create_index("ix_webhook_outbox_session_id", "webhook_outbox", ["session_id"])
    op.create_index(
        "ix_webhook_outbox_due",
        "webhook_outbox",
        ["next_attempt_at"],
        postgresql_where=sa.text(UNSETTLED),
        sqlite_where=sa.text(UNSETTLED),
    )


def downgrade() -> None:
    op.drop_table("webhook_outbox")
    op.drop_index("ix_sessions_root", "sessions")
    op.drop_index("ix_sessions_last_active_at", "sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("last_active_at")
        batch.drop_column("webhook_url")
        batch.drop_column("retention_seconds")
