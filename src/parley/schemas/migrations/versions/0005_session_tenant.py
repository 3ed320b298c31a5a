"""The tenant a session belongs to, for the HTTP gateway.

A session created through the gateway belongs to the tenant of the token that created it;
every gateway route checks it, and lists a tenant's sessions newest first (the index).
Sessions created from Python have none unless the caller names one; the gateway never
shows them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("tenant", sa.String(64), nullable=True))
    op.create_index("ix_sessions_tenant_created_at_id", "sessions", ["tenant", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_sessions_tenant_created_at_id", table_name="sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("tenant")
