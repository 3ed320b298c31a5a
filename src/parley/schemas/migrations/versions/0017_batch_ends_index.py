"""A partial index on the ends of batch lines' runs.

``Batch.results()`` (and ``parley batch results``) gives a batch's lines as they end: it
reads the lines that ended after the last one it read, in the order of their ends.
Without this index that read went through every line of the batch, each page again, so
following a batch of 100,000 lines slowed as it went (34,201 lines in 91 s); with it a
page reads the ends since the last one.

On PostgreSQL the index is built concurrently, outside a transaction, as 0003's is: a
plain build would lock ``runs`` against a live fleet's writes until it finished.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

NAME = "ix_runs_batch_ended"
ENDED_BATCH_RUN = "priority = 'batch' AND ended_at IS NOT NULL"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.create_index(NAME, "runs", ["ended_at"], sqlite_where=sa.text(ENDED_BATCH_RUN))
        return
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
        op.create_index(
            NAME,
            "runs",
            ["ended_at"],
            postgresql_where=sa.text(ENDED_BATCH_RUN),
            postgresql_concurrently=True,
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.drop_index(NAME, table_name="runs")
        return
    with op.get_context().autocommit_block():
        op.drop_index(NAME, table_name="runs", postgresql_concurrently=True)
