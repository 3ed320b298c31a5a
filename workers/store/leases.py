"""The store's side of session leases: which embedded process drives a session (see
``schemas.tables.session_leases`` and :mod:`workers.runtime.session_leases`, the process side)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workers.store import statements as q
from workers.store.connection import Transactions


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A session's lease as the database holds it."""

    owner: str
    expires_at: float
    """Seconds since the epoch, by the holder's clock."""


class LeaseStore(Transactions):
    """Taking, renewing and letting go of session leases, one statement each."""

    def take_lease(self, session_id: str, owner: str, *, until: float, now: float) -> str | None:
        """Hold the session for ``owner`` until ``until`` if nobody else holds it live
        at ``now``; returns None when taken, else the live holder (empty if it let go
        between the two statements: try again later)."""
        with self._tx() as db:
            params = {"b_session_id": session_id, "b_owner": owner, "b_expires_at": until}
            taken = db.execute(self._q.take_lease, {**params, "b_now": now}).one_or_none()
            if taken is not None:
                return None
            holder = db.execute(q.LEASE_HOLDER, {"b_session_id": session_id}).scalar_one_or_none()
            return holder or ""

    def take_lease_of(self, session_id: str, dead: str, owner: str, *, until: float) -> bool:
        """Take over the session from ``dead``, a holder known to be gone, if it still
        holds it."""
        with self._tx() as db:
            params = {"b_session_id": session_id, "b_dead": dead, "b_owner": owner}
            taken = db.execute(q.TAKE_LEASE_OF_THE_DEAD, {**params, "b_expires_at": until})
            return bool(taken.rowcount)

    def renew_leases(self, owner: str, session_ids: Sequence[str], *, until: float) -> None:
        """Move the expiry of ``owner``'s leases on ``session_ids`` to ``until``."""
        with self._tx() as db:
            db.execute(
                q.RENEW_LEASES,
                {"b_owner": owner, "b_session_ids": list(session_ids), "b_expires_at": until},
            )

    def release_lease(self, session_id: str, owner: str) -> None:
        """Let go of the session, if ``owner`` holds it."""
        with self._tx() as db:
            db.execute(q.RELEASE_LEASE, {"b_session_id": session_id, "b_owner": owner})

    def leases_of(self, session_ids: Sequence[str]) -> dict[str, Lease]:
        """The leases held on any of ``session_ids``, by session."""
        if not session_ids:
            return {}
        rows = self._reading(
            lambda db: db.execute(q.LEASES_OF, {"b_session_ids": list(session_ids)}).all()
        )
        return {row.session_id: Lease(owner=row.owner, expires_at=row.expires_at) for row in rows}
