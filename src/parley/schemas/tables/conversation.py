"""A session's conversation and its execution state: sessions, their prefixes, turns, runs,
steps, steers, events, and the history a session was seeded with.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)

from parley.schemas.tables.metadata import Id, Json, Timestamp, metadata
from parley.schemas.tables.predicates import (
    ACTIVE_RUN,
    AGENT_WAIT_RUN,
    CAPACITY_RUN,
    CONVERSATION,
    DUE_RUN,
    ENDED_BATCH_RUN,
    EVENT_RUN,
    INTERACTIVE_RUN,
    PLACED_BATCH_RUN,
    UNPLACED_BATCH_RUN,
    WAIT_DUE_RUN,
)

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
    # What a person reads in a list of sessions (src/parley/store/session_titles.py): given, or
    # the first prompt's (set when the first turn is submitted); None before either.
    Column("title", Text, nullable=True),
    # The batch whose line opened the session (None: a conversation, or a session a
    # batch line only continued).
    Column("batch_id", String(40), nullable=True),
    # A child session (docs/sub-agents.md): the agent call that opened it, as the
    # parent's run, held step and call id (unique: a call opens its child once, whatever
    # crashes and redeliveries happen), the parent's turn, and the agent's path among the
    # host's agents (``writer/critic``).  All None for a session nobody's call opened.
    Column("parent_run_id", Id, nullable=True),
    Column("parent_step", Integer, nullable=True),
    Column("parent_call_id", String(200), nullable=True),
    Column("parent_turn_id", Id, nullable=True),
    Column("agent", Text, nullable=True),
    # The session a replay re-ran (docs/replay.md); None: not a replay.
    Column("replay_of", Id, nullable=True),
    # Whether a compaction (docs/compaction.md) or an A2A push configuration
    # (docs/protocols.md) was ever stored for the session: a claim or a turn's end skips
    # reading what the session never had (migration 0030 says why this is safe).
    Column("compacted", Boolean, nullable=False, default=False, server_default=false()),
    Column("pushes", Boolean, nullable=False, default=False, server_default=false()),
    # Unique: a call opens one child.  An index, not a constraint, so that SQLite adds it
    # without copying the table (which its foreign keys would refuse).
    Index(None, "parent_run_id", "parent_step", "parent_call_id", unique=True),
    # A tenant's sessions, newest first (the gateway's listing).
    Index(None, "tenant", "created_at", "id"),
    # A tenant's conversations, newest first (the listing without batch sessions).
    Index(
        "ix_sessions_conversations",
        "tenant",
        "created_at",
        "id",
        postgresql_where=text(CONVERSATION),
        sqlite_where=text(CONVERSATION),
    ),
    # Retention: the sessions idle the longest, first, in a prune's order (sessions
    # made or cancelled together share a time: ordered by it alone, each page of a
    # prune sorted them all).
    Index(None, "last_active_at", "id"),
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
    # Deleting a turn (a prune) checks that no turn hangs under it: without an index,
    # a read of every turn for every turn deleted.
    Index(None, "parent_id"),
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
    # A queued run not to be claimed before this time (None: any time): a delayed turn's
    # (docs/time.md#delayed-turns), or one that let its session go to wait for provider
    # capacity.  Cleared when the time comes (the sweeper's release) or at the claim.
    # On a run waiting for an event, the deadline of its soonest wait
    # (docs/time.md#waiting-for-an-event): its timeout is released the same way.
    Column("not_before", Timestamp, nullable=True),
    # The W3C trace context of the turn's trace (``traceparent``, ``tracestate``): the
    # submission's, or its first traced attempt's; every attempt's spans join it
    # (docs/operations.md#traces).  None: no attempt was traced yet.
    Column("trace_context", Json, nullable=True),
    # Since when, and for what, the run waits to be claimed: ``queue`` (submitted or
    # resumed), ``capacity`` (deferred), ``time`` (a delayed turn) or ``approval``
    # (holding a step for answers); a trace's wait span is made of them at the next claim.
    Column("waiting_since", Timestamp, nullable=True),
    Column("waiting_for", String(12), nullable=True),
    # While the run waits for an event: its name (the first its held step's calls wait
    # for; None for a timer), for the turn's record and the page.
    Column("waiting_event", String(128), nullable=True),
    # The session's tenant ("" for none), on the run so that the batch window and the
    # tenants' shares read each tenant's runs by index.  A session's tenant never
    # changes.  "" for runs that had ended before revision 0015.
    Column("tenant", String(64), nullable=False, default="", server_default=text("''")),
    # When the batch window gave this batch run its place (None: it has none; a batch
    # run is claimed only once placed).
    Column("placed_at", Timestamp, nullable=True),
    Index(None, "session_id", "status"),
    Index(
        "ix_runs_batch_queue",
        "tenant",
        "queued_at",
        postgresql_where=text(UNPLACED_BATCH_RUN),
        sqlite_where=text(UNPLACED_BATCH_RUN),
    ),
    Index(
        "ix_runs_batch_places",
        "tenant",
        postgresql_where=text(PLACED_BATCH_RUN),
        sqlite_where=text(PLACED_BATCH_RUN),
    ),
    Index(
        "ix_runs_interactive",
        "tenant",
        "status",
        postgresql_where=text(INTERACTIVE_RUN),
        sqlite_where=text(INTERACTIVE_RUN),
    ),
    Index(
        "ix_runs_active",
        "session_id",
        postgresql_where=text(ACTIVE_RUN),
        sqlite_where=text(ACTIVE_RUN),
    ),
    Index(
        "ix_runs_due",
        "not_before",
        postgresql_where=text(DUE_RUN),
        sqlite_where=text(DUE_RUN),
    ),
    Index(
        "ix_runs_wait_due",
        "not_before",
        postgresql_where=text(WAIT_DUE_RUN),
        sqlite_where=text(WAIT_DUE_RUN),
    ),
    Index(
        "ix_runs_waiting_event",
        "tenant",
        postgresql_where=text(EVENT_RUN),
        sqlite_where=text(EVENT_RUN),
    ),
    Index(
        "ix_runs_capacity",
        "tenant",
        "priority",
        postgresql_where=text(CAPACITY_RUN),
        sqlite_where=text(CAPACITY_RUN),
    ),
    Index(
        "ix_runs_agents",
        "session_id",
        postgresql_where=text(AGENT_WAIT_RUN),
        sqlite_where=text(AGENT_WAIT_RUN),
    ),
    Index(
        "ix_runs_batch_ended",
        "ended_at",
        postgresql_where=text(ENDED_BATCH_RUN),
        sqlite_where=text(ENDED_BATCH_RUN),
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
