"""The store's side of a replay batch (docs/replay.md#many): many recorded sessions
replayed as one batch, a line per session replayed.

A line's request is the replay of one session: its replay session is written with the
line, in one transaction, while the batch is still being accepted (so the batch window
starts none of its turns: src/parley/store/statements/window.py), then the session's
turns are queued as any replay's, and the line's turn is set to the session's last
(they run in order, so the line ends when the replay has).  The batch is finished as
any other (:meth:`~parley.store.batch_acceptance.AcceptanceStore.finish_batch`), and
dropped as any other if its acceptance fails half-way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parley.schemas import tables as t
from parley.schemas.batches import BatchRecord
from parley.schemas.errors import Conflict
from parley.schemas.records import SessionRecord
from parley.store import statements as q
from parley.store.batch_acceptance import AcceptanceStore
from parley.store.connection import Transactions
from parley.store.sessions import replay_record, session_row
from parley.store.statements import batches as bq


class ReplayBatchStore:
    """Replay batches' lines (see the module docstring)."""

    def __init__(self, db: Transactions, acceptance: AcceptanceStore) -> None:
        self._db = db
        self._acceptance = acceptance

    def open_replay_line(
        self, batch_id: str, line: int, original: SessionRecord, metadata: dict[str, Any]
    ) -> SessionRecord:
        """Write line ``line`` of the accepting batch ``batch_id``: the replay session of
        ``original`` (with ``metadata``) and the line naming it (``custom_id``: the
        original's id; its turn set by :meth:`finish_replay_batch`).  :class:`Conflict`
        if the batch is no longer being accepted."""
        record = replay_record(original, metadata)
        with self._db.tx() as db:
            advanced = db.execute(
                bq.ADVANCE_ACCEPTANCE, {"b_batch_id": batch_id, "b_lines": 1}
            ).rowcount
            if not advanced:
                raise Conflict(f"batch {batch_id} is no longer being accepted")
            db.execute(q.INSERT_SESSION, session_row(record))
            db.insert_bulk(
                t.batch_lines,
                [
                    {
                        "batch_id": batch_id,
                        "line": line,
                        "custom_id": original.session_id,
                        "turn_id": None,
                        "session_id": record.session_id,
                        "opened_session": True,
                        "error": None,
                    }
                ],
            )
        return record

    def finish_replay_batch(self, batch_id: str, last_turns: Mapping[int, str]) -> BatchRecord:
        """Set each line's turn (``last_turns``: by line, its replay session's last turn)
        and make the batch one: from then on it is seen, and its turns are started."""
        with self._db.tx() as db:
            for line, turn_id in last_turns.items():
                db.execute(
                    bq.SET_LINE_TURN, {"b_batch_id": batch_id, "b_line": line, "b_turn_id": turn_id}
                )
        return self._acceptance.finish_batch(batch_id, ())
