"""SQLAlchemy table declarations: the schema Alembic migrations build.

Conversation rows (sessions' trees, turns, steps, prefixes, events) are append-only: the
conversation operations insert them and never edit or delete them.  Execution state
(a run's status, a session's head, fence and counters) is updated in place.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# JSONB on PostgreSQL (compact, indexable); JSON text elsewhere.
Json = JSON().with_variant(JSONB(), "postgresql")
Id = String(36)
Timestamp = DateTime(timezone=True)

# A run that still needs a driver.  The sweeper asks which sessions have one every few
# seconds: a partial index on this answers from the work in flight, not the history.
# (Spelt out, not bound, so that a query with the same text can use the index.)
ACTIVE_RUN = "status IN ('queued', 'running')"
# A webhook delivery still to make (neither delivered nor given up): the deliverer's due
# rows are among these, and a session with one is not pruned.
UNSETTLED_DELIVERY = "delivered_at IS NULL AND given_up_at IS NULL"
# A batch line's run still waiting for its first driver: the batch window
# (workers/runtime/batch_window.py) kicks the oldest of these, a few at a time.
QUEUED_BATCH_RUN = "status = 'queued' AND priority = 'batch'"

sessions = Table(
    "sessions",
    metadata,
    Column("id", Id, primary_key=True),
    Column("root", Text, nullable=False),
    Column("metadata", Json, nullable=False),
    Column("head_turn_id", Id, nullable=True),
    # Fencing token: incremented by every driver that takes the session's lock and
    # checked by every step and turn commit, so a stale driver can never commit.
    Column("fence", BigInteger, nullable=False, default=0),
    # Positions handed out to submissions (a turn's ordinal) and resumes (a run's
    # queue position), under this row's lock.
    Column("turn_count", BigInteger, nullable=False, default=0),
    Column("tokens_used", BigInteger, nullable=False, default=0),
    Column("token_ceiling", BigInteger, nullable=True),
    Column("prefix_generation", Integer, nullable=False, default=0),
    Column("created_at", Timestamp, nullable=False),
    # The gateway's tenant that owns the session (None: created from Python, unowned).
    Column("tenant", String(64), nullable=True),
    # The session's own time to live past its newest activity (None: the host's, if
    # any), and the URL its turns' ends are posted to (None: the host's, if any).
    Column("retention_seconds", BigInteger, nullable=True),
    Column("webhook_url", Text, nullable=True),
    # The newest activity: its creation, then each turn's end (set by the turn's final
    # transaction, on the row it updates anyway).  Retention counts from it.  Nullable
    # only so that migration 0009 could add it to a table with rows; always written.
    Column("last_active_at", Timestamp, nullable=True),
    # What a person reads in a list of sessions (workers/store/session_titles.py): given, or
    # the first prompt's (set when the first turn is submitted); None before either.
    Column("title", Text, nullable=True),
    # A tenant's sessions, newest first (the gateway's listing).
    Index(None, "tenant", "created_at", "id"),
    # Retention: the sessions idle the longest, first.
    Index(None, "last_active_at"),
    # `parley prune --workspaces`: whether a session left uses a pruned one's root.
    Index(None, "root"),
)

prefixes = Table(
    "prefixes",
    metadata,
    Column("session_id", Id, ForeignKey("sessions.id"), primary_key=True),
    Column("generation", Integer, primary_key=True),
    Column("payload", Json, nullable=False),
    Column("created_at", Timestamp, nullable=False),
)

turns = Table(
    "turns",
    metadata,
    Column("id", Id, primary_key=True),
    Column("session_id", Id, ForeignKey("sessions.id"), nullable=False),
    # Set once, when the turn starts: a queued turn hangs under the head as it is then.
    Column("parent_id", Id, ForeignKey("turns.id"), nullable=True),
    Column("ordinal", BigInteger, nullable=False),
    Column("prompt", Text, nullable=False),
    Column("request_id", String(200), nullable=True),
    Column("created_at", Timestamp, nullable=False),
    UniqueConstraint("session_id", "ordinal"),
    UniqueConstraint("session_id", "request_id"),
)

runs = Table(
    "runs",
    metadata,
    Column("id", Id, primary_key=True),
    Column("turn_id", Id, ForeignKey("turns.id"), nullable=False, unique=True),
    Column("session_id", Id, ForeignKey("sessions.id"), nullable=False),
    Column("status", String(20), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    # Claims in a row that committed no step (a crash loop), reset by every step commit
    # and by a resume: a long turn taken over many times is not stuck while it moves.
    Column("stalled_attempts", Integer, nullable=False, default=0, server_default=text("0")),
    Column("contract", Json, nullable=True),
    # The host context the submission carried for this turn (None: none).
    Column("host_context", Json, nullable=True),
    Column("steps", Integer, nullable=False, default=0),
    Column("input_tokens", BigInteger, nullable=False, default=0),
    Column("output_tokens", BigInteger, nullable=False, default=0),
    Column("cached_tokens", BigInteger, nullable=False, default=0),
    # Steer inbox bookkeeping: steers are numbered 1..steer_count; those up to
    # steer_cursor have been delivered (or reported undelivered).  inbox_open is false
    # once the turn ended, so a late steer is refused instead of lost.
    Column("steer_count", Integer, nullable=False, default=0),
    Column("steer_cursor", Integer, nullable=False, default=0),
    Column("inbox_open", Boolean, nullable=False, default=True),
    Column("last_seq", Integer, nullable=False, default=0),
    Column("reply", Text, nullable=True),
    Column("partial", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("undelivered", Json, nullable=True),
    Column("worker", String(200), nullable=True),
    Column("queued_at", Timestamp, nullable=False),
    # Where the run stands in its session's queue (see sessions.turn_count).
    Column("queue_position", BigInteger, nullable=False),
    Column("started_at", Timestamp, nullable=True),
    Column("ended_at", Timestamp, nullable=True),
    # A step waiting for answers to its calls (see records.RunState.held_step): execution
    # state, cleared when the step commits whole.
    Column("held_step", Json, nullable=True),
    # How many of the run's calls asked for an answer: readers look at ``approvals`` only
    # when there are some.
    Column("approval_count", Integer, nullable=False, default=0, server_default=text("0")),
    # The run's lane (docs/admission.md): ``interactive`` or ``batch``.
    Column(
        "priority",
        String(12),
        nullable=False,
        default="interactive",
        server_default=text("'interactive'"),
    ),
    # A run that let its session go to wait for provider capacity: queued again, and not
    # to be claimed before this time (None: any time).
    Column("not_before", Timestamp, nullable=True),
    # The W3C trace context of the turn's trace (``traceparent``, ``tracestate``): the
    # submission's, or its first traced attempt's; every attempt's spans join it
    # (docs/operations.md#traces).  None: no attempt was traced yet.
    Column("trace_context", Json, nullable=True),
    # Since when, and for what, the run waits to be claimed: ``queue`` (submitted or
    # resumed), ``capacity`` (deferred) or ``approval`` (holding a step for answers); a
    # trace's wait span is made of them at the next claim.
    Column("waiting_since", Timestamp, nullable=True),
    Column("waiting_for", String(12), nullable=True),
    Index(None, "session_id", "status"),
    Index(
        "ix_runs_batch_queue",
        "queued_at",
        postgresql_where=text(QUEUED_BATCH_RUN),
        sqlite_where=text(QUEUED_BATCH_RUN),
    ),
    Index(
        "ix_runs_active",
        "session_id",
        postgresql_where=text(ACTIVE_RUN),
        sqlite_where=text(ACTIVE_RUN),
    ),
)

steps = Table(
    "steps",
    metadata,
    Column("run_id", Id, ForeignKey("runs.id"), primary_key=True),
    Column("step_index", Integer, primary_key=True),
    Column("payload", Json, nullable=False),
    Column("created_at", Timestamp, nullable=False),
)

steers = Table(
    "steers",
    metadata,
    Column("run_id", Id, ForeignKey("runs.id"), primary_key=True),
    Column("position", Integer, primary_key=True),
    Column("kind", String(20), nullable=False),
    Column("text", Text, nullable=False),
    Column("created_at", Timestamp, nullable=False),
)

events = Table(
    "events",
    metadata,
    Column("turn_id", Id, ForeignKey("turns.id"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("kind", String(30), nullable=False),
    Column("data", Json, nullable=False),
    Column("created_at", Timestamp, nullable=False),
)

# A tool call waiting for a person's answer (docs/approvals.md): inserted when its step is held,
# answered once (``decision`` from NULL, in one transaction), and ``consumed_at`` set, in
# a transaction of its own, just before an approved call runs: an attempt that finds it
# set does not run the call again.
approvals = Table(
    "approvals",
    metadata,
    Column("id", Id, primary_key=True),
    Column("run_id", Id, ForeignKey("runs.id"), nullable=False),
    Column("turn_id", Id, nullable=False),
    Column("step_index", Integer, nullable=False),
    # The call's place among its step's calls: the order they are listed and run in.
    Column("position", Integer, nullable=False),
    Column("call_id", String(200), nullable=False),
    Column("tool", String(200), nullable=False),
    Column("arguments", Json, nullable=False),
    Column("accesses", Json, nullable=False),
    Column("requested_at", Timestamp, nullable=False),
    Column("expires_at", Timestamp, nullable=True),
    Column("decision", String(20), nullable=True),
    Column("reason", Text, nullable=True),
    Column("decided_at", Timestamp, nullable=True),
    Column("consumed_at", Timestamp, nullable=True),
    UniqueConstraint("run_id", "step_index", "call_id"),
    Index(None, "turn_id"),
    # The sweeper's look for calls whose time is up: only the unanswered ones.
    Index(
        "ix_approvals_expiring",
        "expires_at",
        postgresql_where=text("decision IS NULL AND expires_at IS NOT NULL"),
        sqlite_where=text("decision IS NULL AND expires_at IS NOT NULL"),
    ),
)

# Which embedded process drives a session (docs/guarantees.md#3-one-driver-per-session across
# processes on one database): a row while one holds it, deleted when it lets go.  A holder renews
# every lease it has with one statement per beat, so ``expires_at`` (seconds since the epoch, by the
# holder's clock) says whether it is alive; a row past it, or whose holder's process is
# gone from this machine, may be taken over.  The fleet's sessions are held in Redis
# instead: they never have a row here.
session_leases = Table(
    "session_leases",
    metadata,
    Column("session_id", Id, ForeignKey("sessions.id"), primary_key=True),
    # ``host:pid:nonce`` of the holding process (the nonce tells a reused pid apart).
    Column("owner", String(200), nullable=False),
    Column("expires_at", Float, nullable=False),
    # The holder's beat renews its own rows.
    Index(None, "owner"),
)

# A session's imported history as it was given (``Session.seed_history``): the turns it
# became are ordinary turns; this keeps the messages and the host's raw rows beside them.
seeds = Table(
    "seeds",
    metadata,
    Column("session_id", Id, ForeignKey("sessions.id"), primary_key=True),
    Column("messages", Json, nullable=False),
    Column("raw_rows", Json, nullable=True),
    Column("created_at", Timestamp, nullable=False),
)

# The webhook outbox (docs/operations.md#webhooks): one row per turn's end that has a URL to go to,
# inserted by the transaction that commits the end, and delivered at least once from
# here by the deliverer (in `parley beat`, or a thread of the embedded client).  The row
# is a snapshot of the end (a resumed turn ends again: another row), the POST's body is
# built from it, and its id is the delivery id receivers deduplicate on.  ``attempts``,
# ``last_status``, ``last_error``, ``delivered_at`` and ``given_up_at`` are what an
# operator reads; a row is due while neither of the last two is set and
# ``next_attempt_at`` has passed (a claim moves it on by a lease).
webhook_outbox = Table(
    "webhook_outbox",
    metadata,
    Column("id", Id, primary_key=True),
    Column("session_id", Id, ForeignKey("sessions.id"), nullable=False),
    Column("turn_id", Id, ForeignKey("turns.id"), nullable=False),
    Column("run_id", Id, ForeignKey("runs.id"), nullable=False),
    Column("url", Text, nullable=False),
    Column("outcome", String(20), nullable=False),
    Column("reply", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("steps", Integer, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("ended_at", Timestamp, nullable=False),
    Column("created_at", Timestamp, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", Timestamp, nullable=False),
    Column("last_attempt_at", Timestamp, nullable=True),
    Column("last_status", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("delivered_at", Timestamp, nullable=True),
    Column("given_up_at", Timestamp, nullable=True),
    Index(None, "session_id"),
    # The deliverer's look for due rows: only the undelivered ones.
    Index(
        "ix_webhook_outbox_due",
        "next_attempt_at",
        postgresql_where=text(UNSETTLED_DELIVERY),
        sqlite_where=text(UNSETTLED_DELIVERY),
    ),
)

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
