"""Files a tenant deletes (docs/security.md#5-storage).

``files.deleted_at``: when the tenant deleted the file while a batch still names it (its
bytes go at once, its row stays for the batch); null for every file before this
revision.  An index on ``batches.input_file_id``, which a delete and ``parley prune``
read to learn whether a batch was made from an upload.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_batches_input_file_id", "batches", ["input_file_id"])


def downgrade() -> None:
    op.drop_index("ix_batches_input_file_id", table_name="batches")
    with op.batch_alter_table("files") as batch:
        batch.drop_column("deleted_at")
