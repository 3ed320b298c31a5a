"""SQLAlchemy table declarations: the schema Alembic migrations build.

Conversation rows (sessions' trees, turns, steps, prefixes, events) are append-only: the
conversation operations insert them and never edit or delete them.  Execution state
(a run's status, a session's head, fence and counters) is updated in place.

Declared by aggregate in the modules of this package, all on one MetaData; callers read
them from here (``from parley.schemas import tables as t``; ``t.runs``), and Alembic
compares the migrations with ``metadata``, which holds every table once this is imported.
"""

from __future__ import annotations

from parley.schemas.tables.attachments import (
    approvals,
    compactions,
    event_waits,
    push_configs,
    session_leases,
    signals,
    webhook_outbox,
)
from parley.schemas.tables.batches import batch_lines, batches, file_parts, files
from parley.schemas.tables.conversation import (
    events,
    prefixes,
    runs,
    seeds,
    sessions,
    steers,
    steps,
    turns,
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
    UNSETTLED_DELIVERY,
    WAIT_DUE_RUN,
)
from parley.schemas.tables.schedules import schedule_runs, schedules

__all__ = [
    "ACTIVE_RUN",
    "AGENT_WAIT_RUN",
    "CAPACITY_RUN",
    "CONVERSATION",
    "DUE_RUN",
    "ENDED_BATCH_RUN",
    "EVENT_RUN",
    "INTERACTIVE_RUN",
    "PLACED_BATCH_RUN",
    "UNPLACED_BATCH_RUN",
    "UNSETTLED_DELIVERY",
    "WAIT_DUE_RUN",
    "Id",
    "Json",
    "Timestamp",
    "approvals",
    "batch_lines",
    "batches",
    "compactions",
    "event_waits",
    "events",
    "file_parts",
    "files",
    "metadata",
    "prefixes",
    "push_configs",
    "runs",
    "schedule_runs",
    "schedules",
    "seeds",
    "session_leases",
    "sessions",
    "signals",
    "steers",
    "steps",
    "turns",
    "webhook_outbox",
]
