"""Statements on session leases: which embedded process drives a session."""

from __future__ import annotations

from sqlalchemy import delete, select, update

from schemas import tables as t
from workers.store.statements.binds import b

# Which embedded process drives a session (see schemas.tables.session_leases).  Taking a
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
