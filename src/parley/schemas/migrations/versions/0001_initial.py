"""Initial schema: sessions, prefixes, turns, runs, steps, steers, events.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")
Ts = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("root", sa.Text(), nullable=False),
        sa.Column("metadata", Json, nullable=False),
        sa.Column("head_turn_id", sa.String(36), nullable=True),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("turn_count", sa.BigInteger(), nullable=False),
        sa.Column("tokens_used", sa.BigInteger(), nullable=False),
        sa.Column("token_ceiling", sa.BigInteger(), nullable=True),
        sa.Column("prefix_generation", sa.Integer(), nullable=False),
        sa.Column("created_at", Ts, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sessions"),
    )
    op.create_table(
        "prefixes",
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("payload", Json, nullable=False),
        sa.Column("created_at", Ts, nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_prefixes_session_id_sessions"
        ),
        sa.PrimaryKeyConstraint("session_id", "generation", name="pk_prefixes"),
    )
    op.create_table(
        "turns",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("parent_id", sa.String(36), nullable=True),
        sa.Column("ordinal", sa.BigInteger(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("request_id", sa.String(200), nullable=True),
        sa.Column("created_at", Ts, nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_turns_session_id_sessions"
        ),
        sa.ForeignKeyConstraint(["parent_id"], ["turns.id"], name="fk_turns_parent_id_turns"),
        sa.PrimaryKeyConstraint("id", name="pk_turns"),
        sa.UniqueConstraint("session_id", "ordinal", name="uq_turns_session_id_ordinal"),
        sa.UniqueConstraint("session_id", "request_id", name="uq_turns_session_id_request_id"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("turn_id", sa.String(36), nullable=False),
        sa.Column("session_id", sa.String(36), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("contract", Json, nullable=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("steer_count", sa.Integer(), nullable=False),
        sa.Column("steer_cursor", sa.Integer(), nullable=False),
        sa.Column("inbox_open", sa.Boolean(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("reply", sa.Text(), nullable=True),
        sa.Column("partial", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("undelivered", Json, nullable=True),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("queued_at", Ts, nullable=False),
        sa.Column("started_at", Ts, nullable=True),
        sa.Column("ended_at", Ts, nullable=True),
        sa.ForeignKeyConstraint(["turn_id"], ["turns.id"], name="fk_runs_turn_id_turns"),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_runs_session_id_sessions"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.UniqueConstraint("turn_id", name="uq_runs_turn_id"),
    )
    op.create_index("ix_runs_session_id_status", "runs", ["session_id", "status"])
    op.create_table(
        "steps",
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("payload", Json, nullable=False),
        sa.Column("created_at", Ts, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_steps_run_id_runs"),
        sa.PrimaryKeyConstraint("run_id", "step_index", name="pk_steps"),
    )
    op.create_table(
        "steers",
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created_at", Ts, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_steers_run_id_runs"),
        sa.PrimaryKeyConstraint("run_id", "position", name="pk_steers"),
    )
    op.create_table(
        "events",
        sa.Column("turn_id", sa.String(36), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(30), nullable=False),
        sa.Column("data", Json, nullable=False),
        sa.Column("created_at", Ts, nullable=False),
        sa.ForeignKeyConstraint(["turn_id"], ["turns.id"], name="fk_events_turn_id_turns"),
        sa.PrimaryKeyConstraint("turn_id", "seq", name="pk_events"),
    )


def downgrade() -> None:
    for table in ("events", "steers", "steps"):
        op.drop_table(table)
    op.drop_index("ix_runs_session_id_status", table_name="runs")
    for table in ("runs", "turns", "prefixes", "sessions"):
        op.drop_table(table)
