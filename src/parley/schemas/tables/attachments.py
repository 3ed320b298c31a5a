"""Rows hung on a session's turns and runs, each with a life of its own: approvals waiting
for a person, calls waiting for an event and the signals sent to them, the embedded
drivers' leases, the webhook outbox, A2A push configurations
and compactions.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from parley.schemas.tables.metadata import Id, Json, Timestamp, metadata
from parley.schemas.tables.predicates import UNSETTLED_DELIVERY

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

# A tool call that parks its turn until an event or a time (docs/time.md#waiting-for-an-event):
# inserted when its step is held, and ended once, from ``waiting``, in one transaction:
# ``signalled`` (``signal_id`` names the signal whose payload is its result),
# ``timed_out`` (``until`` passed first) or ``cancelled`` (an interrupt).
event_waits = Table(
    "event_waits",
    metadata,
    Column("id", Id, primary_key=True),
    Column("run_id", Id, ForeignKey("runs.id"), nullable=False),
    Column("turn_id", Id, nullable=False),
    Column("step_index", Integer, nullable=False),
    # The call's place among its step's calls: a signal wakes the first that waits.
    Column("position", Integer, nullable=False),
    Column("call_id", String(200), nullable=False),
    Column("event", String(128), nullable=True),
    Column("until", Timestamp, nullable=True),
    Column("state", String(12), nullable=False),
    Column("signal_id", Id, nullable=True),
    Column("created_at", Timestamp, nullable=False),
    Column("ended_at", Timestamp, nullable=True),
    UniqueConstraint("run_id", "step_index", "call_id"),
    Index(None, "turn_id"),
    # A signal looks for the run's first wait for its name among those still waiting.
    Index(
        "ix_event_waits_waiting",
        "run_id",
        "event",
        postgresql_where=text("state = 'waiting'"),
        sqlite_where=text("state = 'waiting'"),
    ),
)

# A signal sent to a turn (docs/time.md#waiting-for-an-event): kept from the moment it is
# accepted, and delivered once, to the first wait for its name (``wait_id`` set from
# NULL in the transaction that ends the wait); one that finds no wait is kept until one
# of the turn's calls waits for it.
signals = Table(
    "signals",
    metadata,
    Column("id", Id, primary_key=True),
    Column("run_id", Id, ForeignKey("runs.id"), nullable=False),
    Column("turn_id", Id, nullable=False),
    Column("name", String(128), nullable=False),
    Column("payload", Json, nullable=True),
    Column("sent_at", Timestamp, nullable=False),
    Column("wait_id", Id, nullable=True),
    # A new wait looks for the oldest kept signal of its name.
    Index(
        "ix_signals_kept",
        "run_id",
        "name",
        "sent_at",
        postgresql_where=text("wait_id IS NULL"),
        sqlite_where=text("wait_id IS NULL"),
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
    # An A2A push notification's (docs/protocols.md#5-a2a): ``a2a`` and the token its
    # receiver named; None for the session's (or host's) own webhook.
    Column("kind", String(16), nullable=True),
    Column("token", Text, nullable=True),
    Index(None, "session_id"),
    # Deleting a turn or a run (a prune) checks that no delivery refers to it.
    Index(None, "turn_id"),
    Index(None, "run_id"),
    # The deliverer's look for due rows: only the undelivered ones.
    Index(
        "ix_webhook_outbox_due",
        "next_attempt_at",
        postgresql_where=text(UNSETTLED_DELIVERY),
        sqlite_where=text(UNSETTLED_DELIVERY),
    ),
)


# What the model sees instead of the older turns of a path (docs/compaction.md): inserted
# whole in one transaction, never edited but for ``dropped_at`` (removed: it applies to
# nothing from then on).  The turns and steps it covers are untouched.
compactions = Table(
    "compactions",
    metadata,
    Column("id", Id, primary_key=True),
    Column("session_id", Id, ForeignKey("sessions.id"), nullable=False),
    # The newest turn it covers: it applies to the turns hung under it.
    Column("through_turn_id", Id, ForeignKey("turns.id"), nullable=False),
    # The turn that made it before its first model call (None: made on request).
    Column("made_by_turn_id", Id, ForeignKey("turns.id"), nullable=True),
    Column("strategy", String(20), nullable=False),
    Column("text", Text, nullable=False),
    Column("messages", Json, nullable=False),
    Column("tokens_before", Integer, nullable=False),
    Column("tokens_after", Integer, nullable=False),
    # What making it cost (a summary's model call), charged to the turn that made it.
    Column("usage", Json, nullable=True),
    Column("created_at", Timestamp, nullable=False),
    Column("dropped_at", Timestamp, nullable=True),
    # A native one's provider and its item, opaque (docs/compaction.md#native): the
    # provider is a column of its own, since a history's read asks it at every turn.
    Column("native_provider", String(40), nullable=True),
    Column("native_item", Json, nullable=True),
    # A session's list reads them by session, and a prune deletes them so.
    Index(None, "session_id", "created_at"),
    # A claim's walk up the path stops at the turn a live one covers through.
    Index(None, "through_turn_id"),
)


# A2A push notification configurations (docs/protocols.md#5-a2a): where a turn's end is
# also posted, through the webhook outbox, in A2A's form; read by the end's transaction.
push_configs = Table(
    "push_configs",
    metadata,
    Column("id", Id, primary_key=True),
    Column("turn_id", Id, ForeignKey("turns.id"), nullable=False),
    Column("url", Text, nullable=False),
    Column("token", Text, nullable=True),
    Column("created_at", Timestamp, nullable=False),
    # The end's transaction reads a turn's; a prune deletes them by turn.
    Index(None, "turn_id"),
)
