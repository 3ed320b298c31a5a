"""Files and batches (docs/batches.md): OpenAI's Files and Batch APIs over turns.

``files`` (an upload's bytes in ``file_parts``; a batch's output and error files are
queries over its lines), ``batches``, and ``batch_lines`` (each line's turn, or why it
was refused); and the partial index the batch window reads the oldest queued batch runs
from.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)
QUEUED_BATCH_RUN = "status = 'queued' AND priority = 'batch'"


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=True),
        sa.Column("purpose", sa.String(40), nullable=False),
        sa.Column("filename", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("batch_id", sa.String(40), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_files"),
    )
    op.create_index("ix_files_tenant_created_at_id", "files", ["tenant", "created_at", "id"])
    op.create_index("ix_files_batch_id", "files", ["batch_id"])
    op.create_table(
        "file_parts",
        sa.Column("file_id", sa.String(40), nullable=False),
        sa.Column("part", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["file_id"], ["files.id"], name="fk_file_parts_file_id_files"),
        sa.PrimaryKeyConstraint("file_id", "part", name="pk_file_parts"),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=True),
        sa.Column("input_file_id", sa.String(40), nullable=True),
        sa.Column("output_file_id", sa.String(40), nullable=False),
        sa.Column("error_file_id", sa.String(40), nullable=False),
        sa.Column("endpoint", sa.String(100), nullable=False),
        sa.Column("completion_window", sa.String(20), nullable=False),
        sa.Column("metadata", Json, nullable=True),
        sa.Column("request_id", sa.String(200), nullable=True),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("errors", Json, nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("cancelling_at", Timestamp, nullable=True),
        sa.Column("ended_at", Timestamp, nullable=True),
        sa.ForeignKeyConstraint(
            ["input_file_id"], ["files.id"], name="fk_batches_input_file_id_files"
        ),
        sa.ForeignKeyConstraint(
            ["output_file_id"], ["files.id"], name="fk_batches_output_file_id_files"
        ),
        sa.ForeignKeyConstraint(
            ["error_file_id"], ["files.id"], name="fk_batches_error_file_id_files"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_batches"),
        sa.UniqueConstraint("tenant", "request_id", name="uq_batches_tenant_request_id"),
    )
    op.create_index("ix_batches_tenant_created_at_id", "batches", ["tenant", "created_at", "id"])
    op.create_index("ix_batches_ended_at", "batches", ["ended_at"])
    op.create_table(
        "batch_lines",
        sa.Column("batch_id", sa.String(40), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.String(200), nullable=True),
        sa.Column("turn_id", sa.String(36), nullable=True),
        sa.Column("session_id", sa.String(36), nullable=True),
        sa.Column("opened_session", sa.Boolean(), nullable=False),
        sa.Column("error", Json, nullable=True),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.id"], name="fk_batch_lines_batch_id_batches"
        ),
        sa.PrimaryKeyConstraint("batch_id", "line", name="pk_batch_lines"),
    )
    op.create_index("ix_batch_lines_session_id", "batch_lines", ["session_id"])
    op.create_index(
        "ix_runs_batch_queue",
        "runs",
        ["queued_at"],
        postgresql_where=sa.text(QUEUED_BATCH_RUN),
        sqlite_where=sa.text(QUEUED_BATCH_RUN),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_batch_queue", table_name="runs")
    op.drop_table("batch_lines")
    op.drop_table("batches")
    op.drop_table("file_parts")
    op.drop_table("files")
