"""Statements of the batch window (src/parley/runtime/batch_window.py): the places held, by
tenant; the tenants with batch runs waiting for a place; each tenant's oldest; their
placing; the batch runs placed and not yet driven (the embedded window's drivers); and
the lanes' moves (a line promoted, an interactive turn held back: claims.py); and the
tenants' interactive turns running and waiting for a worker
(src/parley/runtime/interactive_share.py).

Each reads an index, never the backlog: a tenant with 100,000 queued lines costs the
window what a tenant with ten does.  The conditions are spelt out as the partial indexes
they read say them (src/parley/schemas/tables/), with literals where an index's predicate has
them, so that PostgreSQL and SQLite can prove the index applies.

(The store's window reads these as ``wq.NAME``; they are a concern of their own.)
"""

from __future__ import annotations

from sqlalchemy import ColumnClause, and_, func, literal_column, or_, select, text, update

from parley.schemas import tables as t
from parley.store.statements.batches import UNACCEPTED
from parley.store.statements.binds import b

_QUEUED: ColumnClause[str] = literal_column("'queued'")
_BATCH: ColumnClause[str] = literal_column("'batch'")

# A batch run waiting for its place (ix_runs_batch_queue's predicate).
_UNPLACED = and_(
    t.runs.c.status == _QUEUED, t.runs.c.priority == _BATCH, t.runs.c.placed_at.is_(None)
)

# The places held, by tenant (ix_runs_batch_places).
PLACES_BY_TENANT = (
    select(t.runs.c.tenant, func.count().label("places"))
    .where(text(t.PLACED_BATCH_RUN))
    .group_by(t.runs.c.tenant)
)

# All of them: the count a filler reads before it takes the window's lock.
PLACES_HELD = select(func.count()).select_from(t.runs).where(text(t.PLACED_BATCH_RUN))

# The tenants with batch runs waiting for a place: one index probe per tenant (a loose
# index scan), not a read of every queued run.
_first = select(func.min(t.runs.c.tenant).label("tenant")).where(_UNPLACED)
_waiting = _first.cte("waiting_tenants", recursive=True)
_later = t.runs.alias("later")
_next = (
    select(func.min(_later.c.tenant))
    .where(
        _later.c.status == _QUEUED,
        _later.c.priority == _BATCH,
        _later.c.placed_at.is_(None),
        _later.c.tenant > _waiting.c.tenant,
    )
    .scalar_subquery()
)
_waiting = _waiting.union_all(select(_next).where(_waiting.c.tenant.is_not(None)))
TENANTS_WAITING = select(_waiting.c.tenant).where(_waiting.c.tenant.is_not(None))

# A run of a line whose batch is still being accepted (or dropped): not to start (a batch
# is seen and run only whole: src/parley/store/batch_acceptance.py).  Only the candidates
# are probed, by batch_lines' session index.
_UNACCEPTED_LINE = (
    select(t.batch_lines.c.line)
    .select_from(t.batch_lines.join(t.batches, t.batches.c.id == t.batch_lines.c.batch_id))
    .where(
        t.batch_lines.c.session_id == t.runs.c.session_id,
        t.batches.c.status.in_([literal_column(f"'{status}'") for status in UNACCEPTED]),
    )
    .exists()
)

# A tenant's oldest batch runs waiting for a place, oldest first (ix_runs_batch_queue),
# of batches accepted whole.
OLDEST_OF_TENANT = (
    select(t.runs.c.id, t.runs.c.session_id)
    .where(
        _UNPLACED,
        t.runs.c.tenant == b("tenant"),
        ~_UNACCEPTED_LINE,
        # A delayed run takes no place before its time (it is queued from then on, so
        # the scan meets it last).
        t.runs.c.not_before.is_(None),
    )
    .order_by(t.runs.c.queued_at)
    .limit(b("limit"))
)

# Places given (under the window's lock; a run cancelled meanwhile is not placed).
PLACE = (
    update(t.runs)
    .where(t.runs.c.id.in_(b("run_ids", expanding=True)), _UNPLACED)
    .values(placed_at=b("now"))
    .returning(t.runs.c.session_id)
)

# The sessions of placed batch runs a driver may claim now: queued and not waiting for
# capacity still to come, or running (a driver that died left it mid-step: the embedded
# window drives such a session when its recovery kicks it; ix_runs_batch_places holds
# them).
PLACED_RUNNABLE = select(t.runs.c.session_id).where(
    text(t.PLACED_BATCH_RUN),
    or_(t.runs.c.not_before.is_(None), t.runs.c.not_before <= b("now")),
)

# Interactive runs queued after a run of the same session: the run holds their way.
INTERACTIVE_AFTER = (
    select(t.runs.c.id)
    .where(
        t.runs.c.session_id == b("session_id"),
        t.runs.c.status == _QUEUED,
        t.runs.c.priority == literal_column("'interactive'"),
        t.runs.c.queue_position > b("position"),
    )
    .limit(1)
)

# A batch run moved to the interactive lane (an interactive turn waits behind it).
PROMOTE = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.status == _QUEUED)
    .values(priority="interactive")
)

# An interactive run moved to the batch lane (its tenant holds its share of the workers
# while another waits: src/parley/runtime/interactive_share.py); it waits for a place.
DEMOTE = (
    update(t.runs)
    .where(
        t.runs.c.id == b("run_id"),
        t.runs.c.status == _QUEUED,
        t.runs.c.priority == literal_column("'interactive'"),
    )
    .values(priority="batch", placed_at=None)
)

# Each tenant's interactive runs driven now (ix_runs_interactive).
INTERACTIVE_RUNNING = (
    select(t.runs.c.tenant, func.count().label("runs"))
    .where(text(t.INTERACTIVE_RUN), t.runs.c.status == literal_column("'running'"))
    .group_by(t.runs.c.tenant)
)

# Each tenant's interactive runs waiting for a worker: queued since before ``since`` (a
# kick would have been taken by then, had a worker been free), not waiting for
# capacity, and next in their session (no turn of it under way or waiting for answers).
_busy = t.runs.alias("busy")
INTERACTIVE_WAITING = (
    select(t.runs.c.tenant, func.count().label("runs"))
    .where(
        text(t.INTERACTIVE_RUN),
        t.runs.c.status == _QUEUED,
        t.runs.c.not_before.is_(None),
        t.runs.c.waiting_since < b("since"),
        ~select(_busy.c.id)
        .where(
            _busy.c.session_id == t.runs.c.session_id,
            _busy.c.status.in_([literal_column("'running'"), literal_column("'waiting'")]),
        )
        .exists(),
    )
    .group_by(t.runs.c.tenant)
)
