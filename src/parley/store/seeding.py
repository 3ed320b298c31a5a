"""The store's side of an imported conversation: a session's first turns stored as they
were (each a prompt and its committed steps, ended ``finished``), the last one the head,
with the messages and raw rows it was imported from kept beside them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from parley.coordination import constants as c
from parley.schemas.errors import Conflict, SessionNotFound
from parley.schemas.messages import StepPayload
from parley.schemas.records import TurnRecord, TurnStatus
from parley.store import statements as q
from parley.store.clock import utc_now
from parley.store.connection import Transactions
from parley.store.ids import new_id


class SeedStore:
    """Seeded histories (see the module docstring)."""

    def __init__(self, db: Transactions) -> None:
        self._db = db

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
        with self._db.tx() as db:
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
            rows = seeded_rows(session_id, turns, now)
            for turn_row, run_row in zip(rows.turns, rows.runs, strict=True):
                db.execute(q.SEED_TURN, turn_row)
                db.execute(q.SEED_RUN, run_row)
            for step_row in rows.steps:
                db.execute(self._db.q.insert_step, step_row)
            db.execute(
                q.SET_TURN_COUNT,
                {"b_session_id": session_id, "b_count": len(turns), "b_now": now},
            )
            db.execute(q.SET_HEAD, {"b_session_id": session_id, "b_head": rows.head})
            db.execute(q.INSERT_SEED, seed_row(session_id, messages, raw_rows, now))
        return list(rows.records)

    def seeded(self, session_id: str) -> tuple[list[Any], list[Any] | None] | None:
        """A session's seeded messages and raw rows, as given (None: not seeded)."""
        row = self._db.reading(
            lambda db: db.execute(q.SEED_OF_SESSION, {"b_session_id": session_id}).one_or_none()
        )
        return None if row is None else (list(row.messages), row.raw_rows)


@dataclass(frozen=True, kw_only=True)
class SeededRows:
    """An imported conversation's rows, each turn under the one before it: the turns
    (``records``, and their rows), their finished runs and their steps."""

    records: tuple[TurnRecord, ...]
    turns: tuple[dict[str, Any], ...]
    runs: tuple[dict[str, Any], ...]
    steps: tuple[dict[str, Any], ...]

    @property
    def head(self) -> str | None:
        """The last turn: the session's head once they are stored."""
        return self.records[-1].turn_id if self.records else None


def seeded_rows(
    session_id: str,
    turns: Sequence[tuple[str, tuple[StepPayload, ...]]],
    now: datetime,
) -> SeededRows:
    """The rows of ``turns`` (each a prompt and its steps) as a session's first turns,
    numbered from 1: ``Session.seed_history`` writes them one by one, a batch's lines in
    bulk with the rest of their sessions (every row of a table has the same keys)."""
    records: list[TurnRecord] = []
    runs: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for position, (prompt, payloads) in enumerate(turns, start=1):
        record = TurnRecord(
            turn_id=new_id(),
            session_id=session_id,
            parent_id=records[-1].turn_id if records else None,
            prompt=prompt,
            status=TurnStatus.FINISHED,
            reply=payloads[-1].text if payloads else None,
            run_id=new_id(),
            request_id=None,
            created_at=now,
        )
        records.append(record)
        runs.append(_seeded_run_row(record, position, len(payloads)))
        steps.extend(
            {
                "run_id": record.run_id,
                "step_index": index,
                "payload": p.to_json(),
                "created_at": now,
            }
            for index, p in enumerate(payloads)
        )
    return SeededRows(
        records=tuple(records),
        turns=tuple(_seeded_turn_row(r, n) for n, r in enumerate(records, start=1)),
        runs=tuple(runs),
        steps=tuple(steps),
    )


def seed_row(
    session_id: str, messages: Sequence[Any], raw_rows: list[Any] | None, now: datetime
) -> dict[str, Any]:
    """The row that keeps an imported conversation's messages (and raw rows) as given."""
    return {
        "session_id": session_id,
        "messages": list(messages),
        "raw_rows": raw_rows,
        "created_at": now,
    }


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
