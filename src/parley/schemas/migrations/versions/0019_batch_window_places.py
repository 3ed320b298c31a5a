"""The batch window's places and the tenants' shares (docs/batches.md, docs/admission.md).

``tenant``: the run's session's tenant ("" for none), so that the window reads each
tenant's queue by index (it shares its places among the tenants with lines queued, by
weight) and the sweeper counts each tenant's interactive runs; filled in for the runs
unfinished at this revision, "" for those that had ended.  ``placed_at``: when the
window gave a batch run its place (a batch run is claimed only once placed); the runs
in flight at this revision (running, or waiting for capacity) are placed now, so that
the window counts them.  The window's queue index becomes per tenant; two partial
indexes, on the places held and on the interactive runs in flight, keep both counts off
the backlog.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

OLD_QUEUE = "status = 'queued' AND priority = 'batch'"
UNPLACED_BATCH_RUN = "status = 'queued' AND priority = 'batch' AND placed_at IS NULL"
PLACED_BATCH_RUN = (
    "priority = 'batch' AND placed_at IS NOT NULL AND status IN ('queued', 'running')"
)
INTERACTIVE_RUN = "priority = 'interactive' AND status IN ('queued', 'running')"


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("tenant", sa.String(64), nullable=False, server_default=sa.text("''"))
        )
        batch.add_column(sa.Column("placed_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE runs SET tenant = COALESCE("
        "(SELECT sessions.tenant FROM sessions WHERE sessions.id = runs.session_id), '') "
        "WHERE status IN ('queued', 'running', 'waiting')"
    )
    op.execute(
        "UPDATE runs SET placed_at = CURRENT_TIMESTAMP WHERE priority = 'batch' "
        "AND (status = 'running' OR (status = 'queued' AND not_before IS NOT NULL))"
    )
    op.drop_index("ix_runs_batch_queue", table_name="runs")
    _indexes()


def _indexes() -> None:
    op.create_index(
        "ix_runs_batch_queue",
        "runs",
        ["tenant", "queued_at"],
        postgresql_where=sa.text(UNPLACED_BATCH_RUN),
        sqlite_where=sa.text(UNPLACED_BATCH_RUN),
    )
    op.create_index(
        "ix_runs_batch_places",
        "runs",
        ["tenant"],
        postgresql_where=sa.text(PLACED_BATCH_RUN),
        sqlite_where=sa.text(PLACED_BATCH_RUN),
    )
    op.create_index(
        "ix_runs_interactive",
        "runs",
        ["tenant", "status"],
        postgresql_where=sa.text(INTERACTIVE_RUN),
        sqlite_where=sa.text(INTERACTIVE_RUN),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_interactive", table_name="runs")
    op.drop_index("ix_runs_batch_places", table_name="runs")
    op.drop_index("ix_runs_batch_queue", table_name="runs")
    op.create_index(
        "ix_runs_batch_queue",
        "runs",
        ["queued_at"],
        postgresql_where=sa.text(OLD_QUEUE),
        sqlite_where=sa.text(OLD_QUEUE),
    )
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("placed_at")
        batch.drop_column("tenant")
