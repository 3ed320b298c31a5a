"""Waiting for an event (docs/time.md#waiting-for-an-event): ``event_waits`` holds each
call that parks its turn until a named event or a time, ``signals`` each signal sent to
a turn (kept until a wait takes it), ``ix_runs_wait_due`` the runs waiting for an event
with a deadline, which the release reads by deadline as it reads delayed turns, and
``ix_runs_waiting_event`` every run waiting for an event, which the sweeper counts per
tenant for the metrics; ``runs.waiting_event`` names the event a waiting run waits for.

On PostgreSQL the indexes on ``runs`` are built concurrently, outside a transaction, as
revision 0021 built ``ix_runs_due`` (a plain build would lock ``runs`` against a live
fleet); the new tables are empty and built in the migration's transaction.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

WAIT_DUE_RUN = "status = 'waiting' AND not_before IS NOT NULL"
EVENT_RUN = "status = 'waiting' AND waiting_for = 'event'"
RUN_INDEXES = (
    ("ix_runs_wait_due", "not_before", WAIT_DUE_RUN),
    ("ix_runs_waiting_event", "tenant", EVENT_RUN),
)


def upgrade() -> None:
    op.add_column("runs", sa.Column("waiting_event", sa.String(128), nullable=True))
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    stamp = sa.DateTime(timezone=True)
    op.create_table(
        "event_waits",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("turn_id", sa.String(36), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("call_id", sa.String(200), nullable=False),
        sa.Column("event", sa.String(128), nullable=True),
        sa.Column("until", stamp, nullable=True),
        sa.Column("state", sa.String(12), nullable=False),
        sa.Column("signal_id", sa.String(36), nullable=True),
        sa.Column("created_at", stamp, nullable=False),
        sa.Column("ended_at", stamp, nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_event_waits_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_event_waits"),
        sa.UniqueConstraint(
            "run_id", "step_index", "call_id", name="uq_event_waits_run_id_step_index_call_id"
        ),
    )
    op.create_index("ix_event_waits_turn_id", "event_waits", ["turn_id"])
    where = sa.text("state = 'waiting'")
    op.create_index(
        "ix_event_waits_waiting",
        "event_waits",
        ["run_id", "event"],
        postgresql_where=where,
        sqlite_where=where,
    )
    op.create_table(
        "signals",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("turn_id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("payload", json, nullable=True),
        sa.Column("sent_at", stamp, nullable=False),
        sa.Column("wait_id", sa.String(36), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_signals_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_signals"),
    )
    kept = sa.text("wait_id IS NULL")
    op.create_index(
        "ix_signals_kept",
        "signals",
        ["run_id", "name", "sent_at"],
        postgresql_where=kept,
        sqlite_where=kept,
    )
    for name, column, where in RUN_INDEXES:
        if op.get_bind().dialect.name != "postgresql":
            op.create_index(name, "runs", [column], sqlite_where=sa.text(where))
            continue
        with op.get_context().autocommit_block():
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            op.create_index(
                name,
                "runs",
                [column],
                postgresql_where=sa.text(where),
                postgresql_concurrently=True,
            )


def downgrade() -> None:
    for name, _column, _where in RUN_INDEXES:
        if op.get_bind().dialect.name != "postgresql":
            op.drop_index(name, table_name="runs")
            continue
        with op.get_context().autocommit_block():
            op.drop_index(name, table_name="runs", postgresql_concurrently=True)
    op.drop_index("ix_signals_kept", table_name="signals")
    op.drop_table("signals")
    op.drop_index("ix_event_waits_waiting", table_name="event_waits")
    op.drop_index("ix_event_waits_turn_id", table_name="event_waits")
    op.drop_table("event_waits")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("waiting_event")
