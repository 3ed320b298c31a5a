"""The store's side of compactions (docs/compaction.md): a session's list, one dropped,
one made between turns stored with its ``compacted`` event, and the one that applies to
a turn about to run with the path after it, read with its claim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parley.schemas.compactions import (
    CompactionDraft,
    CompactionRecord,
    CompactionStrategy,
    NativeItem,
    applicable,
    messages_from_json,
    messages_to_json,
)
from parley.schemas.errors import CompactionNotFound, Conflict, InvalidRequest, SessionNotFound
from parley.schemas.events import Compacted, Event
from parley.schemas.messages import Prefix
from parley.schemas.records import TurnRecord, Usage
from parley.store import statements as q
from parley.store.clock import utc_now
from parley.store.connection import StoreConnection, Transactions
from parley.store.ids import new_id
from parley.store.rows import aware, read_path, read_session, turn_record, write_events


class CompactionStore:
    """Compactions as clients see them (see the module docstring)."""

    def __init__(self, db: Transactions) -> None:
        self._db = db

    def frozen_prefix(self, session_id: str) -> Prefix | None:
        """The prefix the session's turns are sent under (None before its first turn
        froze one): what a native compaction's request is made under, so that the
        provider sees the tools its item accounts for."""

        def read(db: StoreConnection) -> Prefix | None:
            row = db.execute(q.SESSION, {"b_session_id": session_id}).one_or_none()
            if row is None:
                raise SessionNotFound(f"no session {session_id!r}")
            generation = int(row.prefix_generation or 0)
            if generation == 0:
                return None
            binds = {"b_session_id": session_id, "b_generation": generation}
            payload = db.execute(q.PREFIX, binds).scalar_one_or_none()
            return None if payload is None else Prefix.from_json(payload)

        return self._db.reading(read)

    def compacted_path(
        self, head: str | None, native_of: str
    ) -> tuple[CompactionRecord | None, list[TurnRecord]]:
        """The compaction that applies under ``head`` for a model of the provider
        ``native_of`` names, and the turns after it (:func:`read_compacted_path`)."""
        return self._db.reading(lambda db: read_compacted_path(db, head, native_of))

    def compactions(self, session_id: str) -> list[CompactionRecord]:
        """The session's compactions, oldest first, dropped ones included."""

        def read(db: StoreConnection) -> list[CompactionRecord]:
            read_session(db, session_id)
            rows = db.execute(q.COMPACTIONS_OF_SESSION, {"b_session_id": session_id}).all()
            return [compaction_record(r) for r in rows]

        return self._db.reading(read)

    def drop_compaction(self, session_id: str, compaction_id: str) -> CompactionRecord:
        """Drop one of the session's compactions: from the next turn on the model sees
        what it covered again (or an older one's form of it).  Dropping a dropped one
        changes nothing.  :class:`CompactionNotFound` if the session has no such one."""
        with self._db.tx() as db:
            read_session(db, session_id)
            binds = {"b_compaction_id": compaction_id, "b_session_id": session_id}
            db.execute(q.DROP_COMPACTION, {**binds, "b_now": utc_now()})
            row = db.execute(q.COMPACTION, binds).one_or_none()
            if row is None or row.session_id != session_id:
                raise CompactionNotFound(
                    f"session {session_id!r} has no compaction {compaction_id!r}"
                )
            return compaction_record(row)

    def add_compaction(
        self, draft: CompactionDraft, *, head: str, known: int | None = None
    ) -> tuple[CompactionRecord, Event]:
        """Store a compaction made between turns from the path to ``head``, and its
        ``compacted`` event on the head's run, in one transaction.  :class:`Conflict` if
        the head moved meanwhile, if the session no longer has ``known`` compactions (the
        count it was made from: another was made meanwhile, and this one would repeat
        it), or a turn of the session is unfinished (compactions are made at a turn
        boundary), :class:`InvalidRequest` if it covers a turn off the path."""
        with self._db.tx() as db:
            row = db.execute(q.LOCK_SESSION, {"b_session_id": draft.session_id}).one_or_none()
            if row is None:
                raise SessionNotFound(f"no session {draft.session_id!r}")
            if row.head_turn_id != head:
                raise Conflict("the session's head moved while the compaction was made")
            binds = {"b_session_id": draft.session_id}
            if (
                known is not None
                and db.execute(q.COUNT_COMPACTIONS_OF_SESSION, binds).scalar_one() != known
            ):
                raise Conflict(
                    "another compaction of the session was made while this one was: "
                    "nothing was stored (list the compactions, and ask again if need be)"
                )
            if db.execute(q.ACTIVE_RUNS, {"b_session_id": draft.session_id}).all():
                raise Conflict(
                    "a turn of the session is queued, running or waiting: compact between turns"
                )
            if draft.through_turn_id not in {t.turn_id for t in read_path(db, head)}:
                raise InvalidRequest(f"turn {draft.through_turn_id!r} is not on the history path")
            record = insert_compaction(db, draft)
            run = db.execute(q.RUN_BY_TURN, {"b_turn_id": head}).one()
            event = Event.of(head, run.last_seq + 1, compacted_payload(record))
            write_events(db, self._db.q, [event], record.created_at)
            db.execute(q.NOTE_EVENT_ON_RUN, {"b_run_id": run.id, "b_seq": event.seq})
            return record, event


def insert_compaction(db: StoreConnection, draft: CompactionDraft) -> CompactionRecord:
    """Insert ``draft`` (in the caller's transaction) and return it as stored."""
    record = CompactionRecord(
        compaction_id=new_id(),
        session_id=draft.session_id,
        through_turn_id=draft.through_turn_id,
        strategy=draft.strategy,
        text=draft.text,
        messages=draft.messages,
        tokens_before=draft.tokens_before,
        tokens_after=draft.tokens_after,
        created_at=utc_now(),
        made_by_turn_id=draft.made_by_turn_id,
        usage=draft.usage,
        native=draft.native,
    )
    native = record.native
    # (The caller holds the session row: both callers lock it first.)
    db.execute(q.MARK_COMPACTED, {"b_session_id": record.session_id})
    db.execute(
        q.INSERT_COMPACTION,
        {
            "b_compaction_id": record.compaction_id,
            "b_session_id": record.session_id,
            "b_through_turn_id": record.through_turn_id,
            "b_made_by_turn_id": record.made_by_turn_id,
            "b_strategy": str(record.strategy),
            "b_text": record.text,
            "b_messages": messages_to_json(record.messages),
            "b_tokens_before": record.tokens_before,
            "b_tokens_after": record.tokens_after,
            "b_usage": record.usage.to_json() if record.usage is not None else None,
            "b_native_provider": None if native is None else native.provider,
            "b_native_item": None if native is None else native.to_json(),
            "b_now": record.created_at,
        },
    )
    return record


def compacted_payload(record: CompactionRecord) -> Compacted:
    """The ``compacted`` event's payload of ``record``."""
    return Compacted(
        compaction_id=record.compaction_id,
        through_turn_id=record.through_turn_id,
        strategy=str(record.strategy),
        text=record.text,
        tokens_before=record.tokens_before,
        tokens_after=record.tokens_after,
    )


def read_compacted_path(
    db: StoreConnection,
    head: str | None,
    native_of: str = q.ANY_NATIVE,
    *,
    compacted: bool = True,
) -> tuple[CompactionRecord | None, list[TurnRecord]]:
    """The compaction that applies to a turn hung under ``head``, and the path's turns
    after it (root first; the whole path when none applies): one recursive walk up from
    ``head`` that stops at the newest turn a live compaction covers through, so a long
    session's claim reads what its request is made of, not its depth.  ``native_of``:
    the provider whose native compactions can apply (``q.ANY_NATIVE``: any provider's;
    ``""``: none); the others are walked past, as a branch walks past nothing.
    ``compacted``: False when the session never had a compaction (its row's flag, read
    under its lock), so that the walk reaches the root and nothing is asked of it."""
    path: list[TurnRecord] = []
    while head is not None:
        binds = {"b_head": head, "b_native_of": native_of}
        walked = [turn_record(row) for row in db.execute(q.PATH_TO_COMPACTION, binds)]
        if not walked:
            return None, path
        path = walked + path
        if not compacted:
            return None, path
        first = walked[0]
        binds = {"b_turn_id": first.turn_id, "b_native_of": native_of}
        row = db.execute(q.LIVE_COMPACTION_THROUGH, binds).one_or_none()
        if row is not None:
            return compaction_record(row), path[1:]
        # The root, or a turn whose compaction was dropped between the two statements
        # (each reads its own snapshot on PostgreSQL): walk on from its parent.
        head = first.parent_id
    return None, path


def known_compacted_path(
    db: StoreConnection, start: CompactionRecord | None, known: Sequence[TurnRecord]
) -> tuple[CompactionRecord | None, list[TurnRecord]] | None:
    """:func:`read_compacted_path` for a path the caller knows: ``known``, the turns
    after ``start`` (the compaction that applied when it was read; None: from the root).
    A compaction made since on it, or ``start`` still live, decides it; None when
    ``start`` was dropped and none covers a turn of ``known`` (read the path again)."""
    ids = [t.turn_id for t in known]
    through = [start.through_turn_id] if start is not None else []
    if not through + ids:
        return None, []
    rows = db.execute(q.LIVE_COMPACTIONS_THROUGH, {"b_turn_ids": through + ids}).all()
    found = applicable((compaction_record(r) for r in rows), through + ids)
    if found is None:
        return (None, list(known)) if start is None else None
    after = ids.index(found.through_turn_id) + 1 if found.through_turn_id in ids else 0
    return found, list(known[after:])


def compaction_record(row: Any) -> CompactionRecord:
    """A compaction row as its record."""
    return CompactionRecord(
        compaction_id=row.id,
        session_id=row.session_id,
        through_turn_id=row.through_turn_id,
        strategy=CompactionStrategy(row.strategy),
        text=row.text,
        messages=messages_from_json(row.messages),
        tokens_before=row.tokens_before,
        tokens_after=row.tokens_after,
        created_at=aware(row.created_at),
        made_by_turn_id=row.made_by_turn_id,
        dropped_at=None if row.dropped_at is None else aware(row.dropped_at),
        usage=None if row.usage is None else Usage.from_json(row.usage),
        native=None if row.native_item is None else NativeItem.from_json(row.native_item),
    )
