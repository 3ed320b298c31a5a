"""Every Redis key shape, queue name, task name and timing of the fleet, in one place.

Every key carries a hash tag (the part in braces, which alone decides a key's slot on a
Redis Cluster): a session's keys its session id, a turn's keys its turn id, a model's
admission keys the model.  So each script and each command that touches several keys
touches one slot, and sessions and turns spread over a cluster's nodes.

Redis holds only signals and caches that can be rebuilt: locks (rebuilt by whoever takes
them next), replay buffers (PostgreSQL holds every durable event), interrupt flags (the
interrupt itself is stored in PostgreSQL), kick throttles and admission's buckets (rebuilt
full: :mod:`parley.coordination.admission_math` states what that costs).
"""

from __future__ import annotations

import hashlib

from parley.settings import Settings

# What a variable can change starts from the settings' default (parley/settings.py).
_DEFAULTS = Settings()

TURN_QUEUE = _DEFAULTS.queue
BATCH_QUEUE_SUFFIX = ".batch"
"""The batch lane's queue is the turn queue's name with this after it: every worker
consumes the interactive queue first, then it (docs/admission.md#priority)."""
DRIVE_TASK = "parley.drive_session"
SWEEP_TASK = "parley.sweep"

LOCK_TTL_MS = 3_000
"""A dead worker's session is free again after this long (then the sweeper re-kicks it):
a crash is resumed within this, less a beat, plus a sweep (docs/how-a-turn-runs.md)."""
HEARTBEAT_SECONDS = 0.75
"""How often a driver extends its lock: four beats fit in one TTL (one pipeline per
process per beat, whatever the number of locks it holds)."""
SWEEP_SECONDS = _DEFAULTS.sweep_seconds
"""How often the sweeper looks for sessions with work and no live lock (and each embedded
process, for sessions with work and no live lease)."""
TIMER_SECONDS = 0.25
"""How often ``parley beat`` releases the delayed turns whose time has come (between
sweeps): a look at the runs that are due, by index, costs next to nothing while none is
(docs/time.md#delayed-turns)."""
LEASE_SECONDS = 6.0
"""An embedded process's session leases (in the database) last this long unless it
renews them, every LEASE_RENEW_SECONDS: a process that died on another machine is taken
over after this; one that died on this machine, at once.  (Longer than a fleet lock: a
renewal is a database write.)"""
LEASE_RENEW_SECONDS = 1.5
KICK_THROTTLE_SECONDS = 5
"""The sweeper kicks one session at most once per this long, so a backlog larger than the
fleet does not flood the queue with kicks."""
STREAM_FLUSH_SECONDS = _DEFAULTS.stream_flush_seconds
"""How often at most a process's delta flusher sends, unless the fleet's
``PARLEY_STREAM_FLUSH_SECONDS`` says otherwise: a turn's deltas within it travel as one
event (a step's first delta, and every event but tokens, go at once).  Readers see text at
most this much later; Redis and the worker do one append per turn per interval."""
ENDED_BUFFER_SECONDS = _DEFAULTS.replay_seconds
"""How long a finished turn's replay buffer (tokens included) is kept, unless the fleet's
``PARLEY_REPLAY_SECONDS`` says otherwise.  Each costs Redis some 5 KB plus its events."""
ENDS_STREAM_SECONDS = 60
"""How long a finished turn's ends stream is kept.  Only a waiter that asked the store
before the end and blocks on the stream after it reads it then; any later waiter finds
the end in the store.  (A stream costs Redis some 5 KB, however short.)"""
IDLE_BUFFER_SECONDS = 86_400
"""How long a turn's replay buffer lives past its driver's latest event while the turn
has not ended (past its first event if no driver published yet): a running turn silent
that long keeps its committed events in the store, not its earlier tokens.  Bounds what
turns that never end (and announcements of submissions that rolled back) leave in
Redis."""
TAKEOVER_SEQ_GAP = 1 << 20
"""How far above its last commit a turn cut off mid-run (its driver died or lost the
session) numbers the events of its next attempt.  The attempt cut off may have published
past that commit (a step's deltas, each its own event at worst, and its tool events),
and readers may hold those seqs; the replay buffer that would tell how far can have lost
them (a flush, a failover that dropped its tail), so no seq a reader saw is ever reused.
Readers step over the gap once the claim has committed.  A 32-bit seq holds some 2000
such takeovers of one run; the engine gives a turn up after MAX_ATTEMPTS."""
WORK_MARK_SECONDS = 3_600
"""How long a session's work mark (a random value each submission replaces) lives."""
VISIBILITY_TIMEOUT_SECONDS = 3_600
"""Redis broker redelivery of unacknowledged kicks.  Long on purpose: a redelivered kick
is harmless, but crash recovery never waits for it (lock TTL + sweeper do that)."""


def lock_key(session_id: str) -> str:
    """The session lock: value = the holder's token, with a TTL."""
    return f"parley:lock:{hash_tag(session_id)}"


def kicked_key(session_id: str) -> str:
    """Set while a sweeper kick for the session is recent."""
    return f"parley:kicked:{hash_tag(session_id)}"


KICK_PENDING_SECONDS = 10
"""How long a sent kick suppresses further kicks for its session unless a driver lets go
of the session sooner; past that (a lost kick, or a drive longer than this), submissions
kick again (a duplicate bounces off a held lock), and the sweeper recovers a lost one
anyway."""


BROKER_SOCKET_SECONDS = 5.0
"""How long a command to a Redis broker may take, connecting included.  A submission
sends its kick while it holds its session's row: a half-open connection must not hold it
for long (kombu sets no timeout of its own)."""

KICK_GRACE_SECONDS = 2
"""How long the sweeper trusts a kick sent by a submission to reach a driver before it
kicks the session itself (a kick queued behind a backlog is late, not lost)."""

DRIVE_SLICE_SECONDS = 30.0
"""How long a fleet driver keeps one session before it hands it over (after the turn it
runs) with a kick, which queues behind the kicks of other sessions: a session that never
stops receiving turns cannot hold a worker slot while others wait."""


def kick_pending_key(session_id: str) -> str:
    """Set by the submission that kicks; deleted when a driver lets go of the session
    (whichever driver: deleting it early only costs a duplicate kick).  Submissions made
    meanwhile need no kick of their own: the kick's driver claims after they committed,
    and a driver holding the lock sees the work mark they bumped when it lets go."""
    return f"parley:kick:{hash_tag(session_id)}"


def work_key(session_id: str) -> str:
    """The session's work mark, replaced by every submission."""
    return f"parley:work:{hash_tag(session_id)}"


def events_key(turn_id: str) -> str:
    """The turn's replay buffer: a stream whose entry ids are ``<seq>-0``."""
    return f"parley:events:{hash_tag(turn_id)}"


def seq_of_entry(entry_id: bytes) -> int:
    """The seq of an entry of a turn's replay buffer or ends stream (ids ``<seq>-0``)."""
    return int(entry_id.split(b"-")[0])


def ends_key(turn_id: str) -> str:
    """The turn's ends: a stream with one entry (id ``<seq>-0``) per ``end`` published, so
    a waiter blocks on one small key instead of reading every token."""
    return f"parley:ends:{hash_tag(turn_id)}"


def hash_tag(identifier: str) -> str:
    """``{identifier}``: the hash tag of a session's or a turn's keys.  An id with a
    brace in it (a session id its caller chose) is tagged by its SHA-1 instead: its
    first closing brace would end the tag early, and its keys part ways."""
    if "{" in identifier or "}" in identifier:
        identifier = "sha1-" + hashlib.sha1(identifier.encode()).hexdigest()
    return "{" + identifier + "}"


def tagged_id(name: str) -> str:
    """The id a key or channel carries as its hash tag (what its braces hold)."""
    return name[name.index("{") + 1 : name.rindex("}")]


def doorbell_key(name: str) -> str:
    """A watcher's doorbell: a stream a watcher blocked on many turns' ends streams also
    reads, so that a waiter for a turn it does not watch yet can wake it."""
    return f"parley:doorbell:{hash_tag(name)}"


DOORBELL_SECONDS = 3_600
"""How long a doorbell outlives its last ring (its watcher may have gone)."""


def deltas_channel(turn_id: str) -> str:
    """The turn's pub/sub channel: each message is a JSON list of events (sharded
    pub/sub, ``SSUBSCRIBE``, on a cluster)."""
    return f"parley:deltas:{hash_tag(turn_id)}"


def ended_channel(turn_id: str) -> str:
    """On a cluster, the turn's sharded channel of its ends: each message is the seq of
    an ``end`` published (what an ends watcher subscribes to, on the node that holds the
    turn, where one server's watcher reads many turns' ends streams at once)."""
    return f"parley:ended:{hash_tag(turn_id)}"


def owner_key(turn_id: str) -> str:
    """The fence of the driver allowed to publish the turn's events."""
    return f"parley:owner:{hash_tag(turn_id)}"


def steers_key(turn_id: str) -> str:
    """The turn's steer list: every ``say`` and ``interrupt`` the store accepted, as JSON
    ``{"p": position, "k": kind, "t": text}``, appended after its commit.  The path a step
    boundary reads (and a streaming driver watches for an interrupt); the store stays the
    record, read when the list is missing or behind."""
    return f"parley:steers:{hash_tag(turn_id)}"


STEER_TAIL = 64
"""How many of a steer list's newest entries a boundary reads: more steers than that
pending at one boundary (a flood) are read from the store instead."""

SEEDED = "seeded"
"""The ``worker`` of a run ``Session.seed_history`` stored (no driver ran it)."""


ADMISSION_STATE_SECONDS = 3_600
"""How long a model's admission keys live past their latest change: a model no call used
for that long leaves nothing in Redis (its next call finds full buckets, as after a
flush)."""


def admission_key(model: str) -> str:
    """A model's admission state (a hash: bucket levels, limits in force and learned, its
    429 penalty).  Every admission key of one model carries the model as its hash tag, so
    one script's keys stay in one slot of a Redis Cluster."""
    return f"parley:adm:{{{model}}}"


def admission_tickets_key(model: str) -> str:
    """The ticket clock of each tenant with calls of the model waiting (a zset: tenant ->
    absolute time): its batch waiters' line, and how long it counts as waiting."""
    return f"{admission_key(model)}:tickets"


def admission_interactive_key(model: str) -> str:
    """The interactive ticket clock of each tenant with interactive calls of the model
    waiting (a hash: tenant -> absolute time): their line, ahead of its batch waiters."""
    return f"{admission_key(model)}:interactive"


def admission_weights_key(model: str) -> str:
    """The weight of each tenant in the tickets zset (a hash: tenant -> weight)."""
    return f"{admission_key(model)}:weights"


def admission_served_key(model: str) -> str:
    """The virtual service of each tenant in the tickets zset (a hash: tenant -> the
    capacity its calls were granted while it waited, over its weight)."""
    return f"{admission_key(model)}:served"
