"""A run's trace (docs/operations.md#traces).

``trace_context``: the W3C trace context (``traceparent``, ``tracestate``) of the turn's
trace, the submission's or its first traced attempt's, which every attempt on any worker
restores.  ``waiting_since`` and ``waiting_for``: when the run last began to wait to be
claimed, and for what (``queue``: submitted or resumed; ``capacity``: deferred for
provider capacity; ``approval``: holding a step for answers), of which the next claim
makes the trace's wait span.  All null for every run before this revision.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column(
                "trace_context",
                sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                nullable=True,
            )
        )
        batch.add_column(sa.Column("waiting_since", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("waiting_for", sa.String(12), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("waiting_for")
        batch.drop_column("waiting_since")
        batch.drop_column("trace_context")
