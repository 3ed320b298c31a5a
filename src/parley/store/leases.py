"""The store's side of session leases: which embedded process drives a session (see
``parley.schemas.tables.session_leases`` and :mod:`parley.runtime.session_leases`, the
process side)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parley.store import statements as q
from parley.store.connection import Transactions


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A session's lease as the database holds it."""

    owner: str
    expires_at: float
    """Seconds since the epoch, by the holder's clock."""


class LeaseStore:
    """Taking, renewing and letting go of session leases, one statement each."""

    def __init__(self, db: Transactions) -> None:
        self._db = db

    def take_lease(self, session_id: str, owner: str, *, until: float, now: float) -> str | None:
        """Hold the session for ``owner`` until ``until`` if nobody else holds it live
        at ``now``; returns None when taken, else the live holder (empty if it let go
        between the two statements: try again later)."""
        with self._db.tx() as db:
            params = {"b_session_id": session_id, "b_owner": owner, "b_expires_at": until}
            taken = db.execute(self._db.q.take_lease, {**params, "b_now": now}).one_or_none()
            if taken is not None:
                return None
            holder = db.execute(q.LEASE_HOLDER, {"b_session_id": session_id}).scalar_one_or_none()
            return holder or ""

    def take_lease_of(self, session_id: str, dead: str, owner: str, *, until: float) -> bool:
        """Take over the session from ``dead``, a holder known to be gone, if it still
        holds it."""
        with self._db.tx() as db:
            params = {"b_session_id": session_id, "b_dead": dead, "b_owner": owner}
            taken = db.execute(q.TAKE_LEASE_OF_THE_DEAD, {**params, "b_expires_at": until})
            return bool(taken.rowcount)

    def renew_leases(self, owner: str, session_ids: Sequence[str], *, until: float) -> None:
        """Move the expiry of ``owner``'s leases on ``session_ids`` to ``until``."""
        with self._db.tx() as db:
            db.execute(
                q.RENEW_LEASES,
                {"b_owner": owner, "b_session_ids": list(session_ids), "b_expires_at": until},
            )

    def release_lease(self, session_id: str, owner: str) -> None:
        """Let go of the session, if ``owner`` holds it."""
        with self._db.tx() as db:
            db.execute(q.RELEASE_LEASE, {"b_session_id": session_id, "b_owner": owner})

    def leases_of(self, session_ids: Sequence[str]) -> dict[str, Lease]:
        """The leases held on any of ``session_ids``, by session."""
        if not session_ids:
            return {}
        rows = self._db.reading(
            lambda db: db.execute(q.LEASES_OF, {"b_session_ids": list(session_ids)}).all()
        )
        return {row.session_id: Lease(owner=row.owner, expires_at=row.expires_at) for row in rows}

    def lease_holders(self, *, batch_lines: bool = False) -> list[Lease]:
        """Every process that holds a session's lease (only a session with a batch line
        running, with ``batch_lines``), each with its latest expiry."""
        statement = q.BATCH_LINE_HOLDERS if batch_lines else q.LEASE_HOLDERS
        rows = self._db.reading(lambda db: db.execute(statement).all())
        return [Lease(owner=row.owner, expires_at=row.expires_at) for row in rows]
