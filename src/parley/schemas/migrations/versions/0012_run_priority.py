"""A run's lane and its time to come back (fleet-wide admission, docs/admission.md).

``priority``: ``interactive`` (every run before this revision) or ``batch``: kicks of
interactive runs go to their own queue, and their model calls take capacity first.
``not_before``: a run that let its session go to wait for provider capacity is queued
again with the time its capacity is due; until then it holds its session's line and the
sweeper leaves it alone.  Null for every other run.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column(
                "priority", sa.String(12), nullable=False, server_default=sa.text("'interactive'")
            )
        )
        batch.add_column(sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("not_before")
        batch.drop_column("priority")
