"""An index on the turn a compaction covers through.

A claim reads the history path only back to the compaction that applies
(docs/compaction.md#which-one-applies): its recursive walk up from the head asks, at each
turn, whether a live compaction covers through it, and stops there.  Without this index
each of those questions read the compactions table.

On PostgreSQL the index is built concurrently, outside a transaction, as 0017's is: a
plain build would lock ``compactions`` against a live fleet's writes until it finished.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

NAME = "ix_compactions_through_turn_id"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.create_index(NAME, "compactions", ["through_turn_id"])
        return
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
        op.create_index(NAME, "compactions", ["through_turn_id"], postgresql_concurrently=True)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.drop_index(NAME, table_name="compactions")
        return
    with op.get_context().autocommit_block():
        op.drop_index(NAME, table_name="compactions", postgresql_concurrently=True)
