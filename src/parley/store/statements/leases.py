"""Statements on session leases: which embedded process drives a session."""

from __future__ import annotations

from sqlalchemy import delete, func, select, update

from parley.schemas import tables as t
from parley.store.statements.binds import b
from parley.store.statements.run_status import RUNNING

# Which embedded process drives a session (see parley.schemas.tables.session_leases).  Taking a
# lease is one statement per dialect (an upsert that only overwrites the holder's own
# row or an expired one): DialectStatements.take_lease.
_leases = t.session_leases

TAKE_LEASE_OF_THE_DEAD = (
    update(_leases)
    .where(_leases.c.session_id == b("session_id"), _leases.c.owner == b("dead"))
    .values(owner=b("owner"), expires_at=b("expires_at"))
)

LEASE_HOLDER = select(_leases.c.owner).where(_leases.c.session_id == b("session_id"))

RENEW_LEASES = (
    update(_leases)
    .where(
        _leases.c.owner == b("owner"),
        _leases.c.session_id.in_(b("session_ids", expanding=True)),
    )
    .values(expires_at=b("expires_at"))
)

RELEASE_LEASE = delete(_leases).where(
    _leases.c.session_id == b("session_id"), _leases.c.owner == b("owner")
)

LEASES_OF = select(_leases.c.session_id, _leases.c.owner, _leases.c.expires_at).where(
    _leases.c.session_id.in_(b("session_ids", expanding=True))
)

# Every holder, with its latest expiry: whether any embedded process drives a session.
LEASE_HOLDERS = select(
    _leases.c.owner, func.max(_leases.c.expires_at).label("expires_at")
).group_by(_leases.c.owner)

# Those that drive a batch line now: the processes working through the batch lines, each
# of which takes the queued ones in turn (its batch window, src/parley/runtime/batch_window.py).
BATCH_LINE_HOLDERS = LEASE_HOLDERS.where(
    select(t.runs.c.id)
    .where(
        t.runs.c.session_id == _leases.c.session_id,
        t.runs.c.priority == "batch",
        t.runs.c.status == RUNNING,
    )
    .exists()
)
