"""Files and batches (docs/batches.md): uploads and their bytes, batches and their lines."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from parley.schemas.tables.metadata import Id, Json, Timestamp, metadata

# Files (docs/batches.md), as OpenAI's Files API has them: an upload keeps its bytes in
# ``file_parts``; a batch's output and error files have no bytes of their own: each is a
# query over the batch's ended lines, streamed out when read (``batch_id`` and ``kind``
# say which), so it is readable while the batch runs and never built in memory.
files = Table(
    "files",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("tenant", String(64), nullable=True),
    Column("purpose", String(40), nullable=False),
    Column("filename", Text, nullable=False),
    # ``upload``, ``batch_output`` or ``batch_error``.
    Column("kind", String(20), nullable=False),
    # An upload's size; a batch's file's once its batch has ended and it was counted
    # (None until then).
    Column("bytes", BigInteger, nullable=True),
    Column("batch_id", String(40), nullable=True),
    Column("created_at", Timestamp, nullable=False),
    # When its tenant deleted it (``DELETE /v1/files/{id}``), if a batch names it still:
    # the row stays for the batch, without the bytes (a file no batch names goes whole).
    Column("deleted_at", Timestamp, nullable=True),
    Index(None, "tenant", "created_at", "id"),
    Index(None, "batch_id"),
)

# An upload's bytes, in parts of at most a MiB, read back one by one on download.
file_parts = Table(
    "file_parts",
    metadata,
    Column("file_id", String(40), ForeignKey("files.id"), primary_key=True),
    Column("part", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

# A batch: many turns submitted as one (docs/batches.md).  Its counts are not kept
# here: they are read from its lines' runs, so no turn's end contends for this row.
# ``status`` is ``in_progress`` or ``cancelling`` while lines are unfinished, then
# ``completed``, ``cancelled`` or ``failed`` (no line could be accepted), written once
# by the first reader that finds every line ended.
batches = Table(
    "batches",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("tenant", String(64), nullable=True),
    Column("input_file_id", String(40), ForeignKey("files.id"), nullable=True),
    Column("output_file_id", String(40), ForeignKey("files.id"), nullable=False),
    Column("error_file_id", String(40), ForeignKey("files.id"), nullable=False),
    Column("endpoint", String(100), nullable=False),
    Column("completion_window", String(20), nullable=False),
    Column("metadata", Json, nullable=True),
    # The Python client's idempotency key (None: none given).
    Column("request_id", String(200), nullable=True),
    Column("status", String(20), nullable=False),
    Column("total", Integer, nullable=False),
    # Why a batch failed as a whole (OpenAI's ``errors.data``), else None.
    Column("errors", Json, nullable=True),
    Column("created_at", Timestamp, nullable=False),
    Column("cancelling_at", Timestamp, nullable=True),
    Column("ended_at", Timestamp, nullable=True),
    UniqueConstraint("tenant", "request_id"),
    Index(None, "tenant", "created_at", "id"),
    Index(None, "ended_at"),
    # Whether a batch was made from an upload (deleting it, pruning the unused ones).
    Index(None, "input_file_id"),
)

# A batch's lines: each the turn it became, or why it was refused.
batch_lines = Table(
    "batch_lines",
    metadata,
    Column("batch_id", String(40), ForeignKey("batches.id"), primary_key=True),
    # The line's number in the input file, from 1.
    Column("line", Integer, primary_key=True),
    Column("custom_id", String(200), nullable=True),
    # The line's turn and its session.  No foreign keys: a batch is accepted with COPY,
    # where each key is checked row by row (a third of the time of 100,000 lines); the
    # rows are written with their turns, and go with their sessions (prune).
    Column("turn_id", Id, nullable=True),
    Column("session_id", Id, nullable=True),
    # Whether the line opened its session (its only turn): a cancel may end it unrun.
    Column("opened_session", Boolean, nullable=False),
    # A refused line's error: ``code``, ``message``, ``param``.
    Column("error", Json, nullable=True),
    # Pruning a session deletes its lines.
    Index(None, "session_id"),
)
