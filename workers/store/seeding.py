"""The store's side of an imported conversation: a session's first turns stored as they
were (each a prompt and its committed steps, ended ``finished``), the last one the head,
with the messages and raw rows it was imported from kept beside them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from schemas.errors import Conflict, SessionNotFound
from schemas.messages import StepPayload
from schemas.records import TurnRecord, TurnStatus
from workers.coordination import constants as c
from workers.store import statements as q
from workers.store.clock import utc_now
from workers.store.connection import StoreConnection, Transactions
from workers.store.ids import new_id
from workers.store.rows import insert_step


class SeedStore(Transactions):
    """Seeded histories (see the module docstring)."""

    def seed_history(
        self,
        session_id: str,
        turns: Sequence[tuple[str, tuple[StepPayload, ...]]],
        *,
        messages: list[Any],
        raw_rows: list[Any] | None,
    ) -> list[TurnRecord]:
        """Store an imported conversation as the session's first turns (each a prompt
        and its committed steps, ended ``finished``), the last one the head, and keep
        ``messages`` and ``raw_rows`` beside them; one transaction.  :class:`Conflict`
        once the session has a turn (or a seeded history) already."""
        now = utc_now()
        with self._tx() as db:
            # Counting locks the session row: a submission racing this one waits, then
            # counts a turn after the seeded ones.
            ordinal = db.execute(
                q.BUMP_TURN_COUNT, {"b_session_id": session_id}
            ).scalar_one_or_none()
            if ordinal is None:
                raise SessionNotFound(f"no session {session_id!r}")
            if ordinal != 1:
                raise Conflict(
                    f"session {session_id!r} has turns already: a history is seeded before "
                    "its first turn"
                )
            records: list[TurnRecord] = []
            for position, (prompt, steps) in enumerate(turns, start=1):
                parent = records[-1].turn_id if records else None
                seeded = self._seed_turn(db, session_id, parent, position, (prompt, steps), now)
                records.append(seeded)
            db.execute(
                q.SET_TURN_COUNT,
                {"b_session_id": session_id, "b_count": len(turns), "b_now": now},
            )
            head = records[-1].turn_id if records else None
            db.execute(q.SET_HEAD, {"b_session_id": session_id, "b_head": head})
            db.execute(
                q.INSERT_SEED,
                {
                    "session_id": session_id,
                    "messages": messages,
                    "raw_rows": raw_rows,
                    "created_at": now,
                },
            )
        return records

    def _seed_turn(
        self,
        db: StoreConnection,
        session_id: str,
        parent: str | None,
        position: int,
        turn: tuple[str, tuple[StepPayload, ...]],
        now: datetime,
    ) -> TurnRecord:
        """Store one seeded turn (its prompt and steps), its finished run and its steps."""
        prompt, steps = turn
        record = TurnRecord(
            turn_id=new_id(),
            session_id=session_id,
            parent_id=parent,
            prompt=prompt,
            status=TurnStatus.FINISHED,
            reply=steps[-1].text if steps else None,
            run_id=new_id(),
            request_id=None,
            created_at=now,
        )
        db.execute(q.SEED_TURN, _seeded_turn_row(record, position))
        db.execute(q.SEED_RUN, _seeded_run_row(record, position, len(steps)))
        for index, payload in enumerate(steps):
            insert_step(db, self._q, record.run_id, index, payload, now)
        return record

    def seeded(self, session_id: str) -> tuple[list[Any], list[Any] | None] | None:
        """A session's seeded messages and raw rows, as given (None: not seeded)."""
        row = self._reading(
            lambda db: db.execute(q.SEED_OF_SESSION, {"b_session_id": session_id}).one_or_none()
        )
        return None if row is None else (list(row.messages), row.raw_rows)


def _seeded_turn_row(record: TurnRecord, position: int) -> dict[str, Any]:
    return {
        "id": record.turn_id,
        "session_id": record.session_id,
        "parent_id": record.parent_id,
        "ordinal": position,
        "prompt": record.prompt,
        "request_id": None,
        "created_at": record.created_at,
    }


def _seeded_run_row(record: TurnRecord, position: int, steps: int) -> dict[str, Any]:
    """The run of a seeded turn: finished, by no driver (``worker`` says seeded)."""
    now = record.created_at
    return {
        "id": record.run_id,
        "turn_id": record.turn_id,
        "session_id": record.session_id,
        "status": TurnStatus.FINISHED.value,
        "attempts": 1,
        "stalled_attempts": 0,
        "steps": steps,
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_tokens": 0,
        "steer_count": 0,
        "steer_cursor": 0,
        "inbox_open": False,
        "last_seq": 0,
        "reply": record.reply,
        "worker": c.SEEDED,
        "queued_at": now,
        "queue_position": position,
        "started_at": now,
        "ended_at": now,
    }
