"""Session leases: which embedded process drives a session, so that processes sharing
one database never both drive it and a process that died is taken over
(docs/guarantees.md#3-one-driver-per-session, docs/guarantees.md#5-crash-resume).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_leases",
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_session_leases_session_id_sessions"
        ),
        sa.PrimaryKeyConstraint("session_id", name="pk_session_leases"),
    )
    op.create_index("ix_session_leases_owner", "session_leases", ["owner"])


def downgrade() -> None:
    op.drop_index("ix_session_leases_owner", "session_leases")
    op.drop_table("session_leases")
