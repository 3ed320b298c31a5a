"""The host context of a turn (docs/host.md#1-host-context): a JSON object a submission carries
for its turn (user, tenant, request metadata), stored with the run so that it crosses
the queue and reaches the hooks, the tools and the model request on any worker, and a
resume keeps it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    op.add_column("runs", sa.Column("host_context", json, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("host_context")
