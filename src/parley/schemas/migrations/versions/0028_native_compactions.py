"""Native compactions (docs/compaction.md#native): a provider's own compaction item,
kept opaque, and the provider that made it.

A compaction of strategy ``native`` stands in for the turns it covers only in requests
to the provider that made it: a history's read asks for ``native_provider`` at every
turn it walks, so the provider is a column of its own beside the item.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    with op.batch_alter_table("compactions") as batch:
        batch.add_column(sa.Column("native_provider", sa.String(40), nullable=True))
        batch.add_column(sa.Column("native_item", json, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("compactions") as batch:
        batch.drop_column("native_item")
        batch.drop_column("native_provider")
