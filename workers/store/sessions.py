"""The store's side of sessions for clients: create, list and read one, title it, move
its head (branch), and read its history (the path root → head) and its whole tree."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from schemas.errors import Conflict, ForeignTurn, SessionNotFound, TurnNotFound
from schemas.records import SessionRecord, TurnRecord
from workers.store import statements as q
from workers.store.clock import utc_now
from workers.store.connection import IntegrityConflict, StoreConnection, Transactions
from workers.store.ids import new_id
from workers.store.rows import read_path, read_session, session_record, turn_record


class SessionStore(Transactions):
    """Sessions as clients see them (see the module docstring)."""

    def create_session(
        self,
        *,
        root: str,
        metadata: dict[str, Any],
        token_ceiling: int | None,
        tenant: str | None = None,
        session_id: str | None = None,
        retention: timedelta | None = None,
        webhook_url: str | None = None,
        title: str | None = None,
    ) -> SessionRecord:
        """Insert a new session with an empty tree (its id ``session_id``, else a fresh
        one; :class:`Conflict` if that id is taken).  Without a ``title`` it takes its
        first prompt's."""
        now = utc_now()
        record = SessionRecord(
            session_id=session_id or new_id(),
            root=root,
            metadata=metadata,
            head_turn_id=None,
            token_ceiling=token_ceiling,
            tokens_used=0,
            created_at=now,
            tenant=tenant,
            retention=retention,
            webhook_url=webhook_url,
            last_active_at=now,
            title=title,
        )
        try:
            with self._tx() as db:
                db.execute(q.INSERT_SESSION, _session_row(record))
        except IntegrityConflict as exc:
            raise Conflict(f"a session {record.session_id!r} exists already") from exc
        return record

    def list_sessions(
        self, *, tenant: str, limit: int, before: str | None = None
    ) -> list[SessionRecord]:
        """A tenant's sessions, newest first: at most ``limit``, and only those created
        before the session ``before`` (a page's last), if given; :class:`SessionNotFound`
        if ``before`` is not one of the tenant's."""

        def read(db: StoreConnection) -> list[SessionRecord]:
            binds: dict[str, Any] = {"b_tenant": tenant, "b_limit": limit}
            if before is None:
                statement = q.SESSIONS_OF_TENANT
            else:
                mark = read_session(db, before)
                if mark.tenant != tenant:
                    raise SessionNotFound(f"no session {before!r}")
                statement = q.SESSIONS_OF_TENANT_BEFORE
                binds.update(b_created_at=mark.created_at, b_id=mark.session_id)
            return [session_record(row) for row in db.execute(statement, binds)]

        return self._reading(read)

    def get_session(self, session_id: str) -> SessionRecord:
        """The stored session; :class:`SessionNotFound` if unknown."""
        return self._reading(lambda db: read_session(db, session_id))

    def set_title(self, session_id: str, title: str) -> SessionRecord:
        """Give the session ``title`` (checked by the caller); the session as it is
        now.  :class:`SessionNotFound` if unknown."""
        with self._tx() as db:
            moved = db.execute(q.SET_TITLE, {"b_session_id": session_id, "b_title": title})
            if moved.rowcount != 1:
                raise SessionNotFound(f"no session {session_id!r}")
            return read_session(db, session_id)

    def branch(self, session_id: str, turn_id: str) -> None:
        """Move the session's head to ``turn_id`` (one write; nothing else changes).

        The turn must have started: a turn takes its place in the tree, under the head
        of that moment, when it first starts, so a head that never started would become
        its own parent, or the parent of turns queued before it (a cycle).  Started is
        for good, so no lock is needed: a turn starting meanwhile is merely refused."""
        with self._tx() as db:
            read_session(db, session_id)
            owner = db.execute(q.TURN_OWNER, {"b_turn_id": turn_id}).scalar_one_or_none()
            if owner is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            if owner != session_id:
                raise ForeignTurn(f"turn {turn_id!r} belongs to another session")
            run = db.execute(q.RUN_BY_TURN, {"b_turn_id": turn_id}).one()
            if run.attempts == 0:
                raise Conflict(
                    f"turn {turn_id!r} has not started ({run.status}): it takes its place "
                    "in the tree when it starts; branch from it after that"
                )
            moved = db.execute(q.SET_HEAD, {"b_session_id": session_id, "b_head": turn_id})
            if moved.rowcount != 1:  # pruned since it was read
                raise SessionNotFound(f"no session {session_id!r}")

    def history(self, session_id: str) -> list[TurnRecord]:
        """The path root → head."""
        with self._tx() as db:
            return read_path(db, read_session(db, session_id).head_turn_id)

    def tree(self, session_id: str) -> list[TurnRecord]:
        """Every turn of every branch, in submission order."""

        def read(db: StoreConnection) -> list[TurnRecord]:
            read_session(db, session_id)
            return [turn_record(row) for row in db.execute(q.TREE, {"b_session_id": session_id})]

        return self._reading(read)


def _session_row(record: SessionRecord) -> dict[str, Any]:
    """A new session's row."""
    retention = record.retention
    return {
        "id": record.session_id,
        "root": record.root,
        "metadata": record.metadata,
        "head_turn_id": None,
        "fence": 0,
        "turn_count": 0,
        "tokens_used": 0,
        "token_ceiling": record.token_ceiling,
        "prefix_generation": 0,
        "created_at": record.created_at,
        "tenant": record.tenant,
        "retention_seconds": None if retention is None else int(retention.total_seconds()),
        "webhook_url": record.webhook_url,
        "last_active_at": record.last_active_at,
        "title": record.title,
    }
