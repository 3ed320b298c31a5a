"""The store's side of sessions for clients: create, list and read one, title it, move
its head (branch), and read its history (the path root → head) and its whole tree."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from parley.schemas.errors import Conflict, ForeignTurn, SessionNotFound, TurnNotFound
from parley.schemas.records import SessionRecord, TurnRecord
from parley.store import statements as q
from parley.store.clock import utc_now
from parley.store.connection import IntegrityConflict, StoreConnection, Transactions
from parley.store.ids import new_id
from parley.store.rows import read_path, read_session, session_record, turn_record


class SessionStore:
    """Sessions as clients see them (see the module docstring)."""

    def __init__(self, db: Transactions) -> None:
        self._db = db

    def create_session(  # noqa: PLR0913 (every option of a new session, by keyword)
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
        agent: str | None = None,
    ) -> SessionRecord:
        """Insert a new session with an empty tree (its id ``session_id``, else a fresh
        one; :class:`Conflict` if that id is taken).  Without a ``title`` it takes its
        first prompt's.  ``agent``: the path of the declared agent its turns run as
        (a top-level session of an agent, as the gateway's MCP tools open)."""
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
            agent=agent,
        )
        return self._insert_session(record)

    def create_replay_session(
        self, original: SessionRecord, metadata: dict[str, Any]
    ) -> SessionRecord:
        """A new empty session replaying ``original`` (docs/replay.md): its root, tenant,
        token ceiling and title, ``metadata``, and ``replay_of`` naming it."""
        return self._insert_session(replay_record(original, metadata))

    def _insert_session(self, record: SessionRecord) -> SessionRecord:
        try:
            with self._db.tx() as db:
                insert_session(db, record)
        except IntegrityConflict as exc:
            raise Conflict(f"a session {record.session_id!r} exists already") from exc
        return record

    def list_sessions(
        self,
        *,
        tenant: str,
        limit: int,
        before: str | None = None,
        batch_sessions: bool = True,
    ) -> list[SessionRecord]:
        """A tenant's sessions, newest first: at most ``limit``, and only those created
        before the session ``before`` (a page's last), if given; :class:`SessionNotFound`
        if ``before`` is not one of the tenant's.  Without ``batch_sessions``, only its
        conversations: not the sessions its batches' lines opened."""
        first, after = (
            (q.SESSIONS_OF_TENANT, q.SESSIONS_OF_TENANT_BEFORE)
            if batch_sessions
            else (q.CONVERSATIONS_OF_TENANT, q.CONVERSATIONS_OF_TENANT_BEFORE)
        )

        def read(db: StoreConnection) -> list[SessionRecord]:
            binds: dict[str, Any] = {"b_tenant": tenant, "b_limit": limit}
            statement = first
            if before is not None:
                mark = read_session(db, before)
                if mark.tenant != tenant:
                    raise SessionNotFound(f"no session {before!r}")
                statement = after
                binds.update(b_created_at=mark.created_at, b_id=mark.session_id)
            return [session_record(row) for row in db.execute(statement, binds)]

        return self._db.reading(read)

    def get_session(self, session_id: str) -> SessionRecord:
        """The stored session; :class:`SessionNotFound` if unknown."""
        return self._db.reading(lambda db: read_session(db, session_id))

    def set_title(self, session_id: str, title: str) -> SessionRecord:
        """Give the session ``title`` (checked by the caller); the session as it is
        now.  :class:`SessionNotFound` if unknown."""
        with self._db.tx() as db:
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
        with self._db.tx() as db:
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
        with self._db.tx() as db:
            return read_path(db, read_session(db, session_id).head_turn_id)

    def path(self, head: str | None) -> list[TurnRecord]:
        """The path root → ``head`` (none without a head)."""
        return self._db.reading(lambda db: read_path(db, head))

    def tree(self, session_id: str) -> list[TurnRecord]:
        """Every turn of every branch, in submission order."""

        def read(db: StoreConnection) -> list[TurnRecord]:
            read_session(db, session_id)
            return [turn_record(row) for row in db.execute(q.TREE, {"b_session_id": session_id})]

        return self._db.reading(read)


def replay_record(original: SessionRecord, metadata: dict[str, Any]) -> SessionRecord:
    """The record of a new empty session replaying ``original`` (its root, tenant, token
    ceiling and title), with ``metadata``."""
    now = utc_now()
    return SessionRecord(
        session_id=new_id(),
        root=original.root,
        metadata=metadata,
        head_turn_id=None,
        token_ceiling=original.token_ceiling,
        tokens_used=0,
        created_at=now,
        tenant=original.tenant,
        last_active_at=now,
        title=original.title,
        replay_of=original.session_id,
    )


def insert_session(db: StoreConnection, record: SessionRecord) -> None:
    """Insert the new session ``record`` in the caller's transaction (a schedule's firing
    opens its session with its turn)."""
    db.execute(q.INSERT_SESSION, session_row(record))


def session_row(record: SessionRecord) -> dict[str, Any]:
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
        "batch_id": None,
        "replay_of": record.replay_of,
        "agent": record.agent,
    }
