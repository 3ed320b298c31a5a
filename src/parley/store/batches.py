"""The store's side of batches (docs/batches.md) once accepted: their reads, counts,
output and error files, cancel, the batch window's reads and pruning.  How a batch is
accepted is :mod:`parley.store.batch_acceptance`; their files are
:mod:`parley.store.files`.

Nothing of a batch is updated as its lines run: its counts, its usage, its output and
its error file are queries over its lines' runs, so no turn's end touches a batch row.  A batch
still being accepted is no batch to a reader: it is not found, nor listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from parley.ports.backend import CommittedStep
from parley.schemas import tables as t
from parley.schemas.batches import (
    BatchHeader,
    BatchLine,
    BatchRecord,
    BatchStatus,
    Endpoint,
    FileKind,
)
from parley.schemas.errors import BatchNotFound
from parley.schemas.events import Ended, Event
from parley.schemas.records import Approval, RunState, SteerKind, TurnRecord, TurnStatus
from parley.store.batch_reads import accepted_batch, read_batch
from parley.store.clock import utc_now
from parley.store.connection import StoreConnection, Transactions
from parley.store.rows import (
    aware,
    event_row,
    read_approvals,
    read_pending,
    read_steps,
    run_state_of,
    turn_record,
)
from parley.store.statements import batches as bq

CANCELLED_UNSTARTED = "the batch was cancelled before this line started"
CANCELLED_WAITING = "the batch was cancelled while this line waited to go on"
SAY = SteerKind.SAY


@dataclass(frozen=True, kw_only=True)
class RenderedTurn:
    """What a line's response object is made of."""

    turn: TurnRecord
    run: RunState
    steps: tuple[CommittedStep, ...]
    approvals: tuple[Approval, ...]


@dataclass(frozen=True, kw_only=True)
class Cancelled:
    """What a batch's cancel did: the ``end`` events of the lines it ended unrun (to
    publish), and the turns still unfinished (to interrupt through their inboxes)."""

    ended: tuple[Event, ...]
    unfinished: tuple[str, ...]


class BatchStore:
    """Files and batches (see the module docstring)."""

    def __init__(self, db: Transactions) -> None:
        self._db = db

    # --------------------------------------------------------------------- batches

    def get_batch(self, batch_id: str) -> BatchRecord:
        """The batch with its counts, usage and model as they stand; the first read to
        find every line ended writes its end."""
        record = self._db.reading(lambda db: read_batch(db, batch_id))
        if record.ended_at is None and record.counts.ended >= record.counts.total:
            now = utc_now()
            status = "cancelled" if record.status is BatchStatus.CANCELLING else "completed"
            with self._db.tx() as db:
                db.execute(
                    bq.END_BATCH, {"b_batch_id": batch_id, "b_status": status, "b_ended_at": now}
                )
            record = self._db.reading(lambda db: read_batch(db, batch_id))
        return record

    def batch_header(self, batch_id: str) -> BatchHeader:
        """What rendering the batch's lines needs of it (one row read, no counting)."""
        row = self._db.reading(lambda db: accepted_batch(db, batch_id))
        return BatchHeader(
            batch_id=row.id,
            endpoint=Endpoint(row.endpoint),
            cancelling_at=None if row.cancelling_at is None else aware(row.cancelling_at),
        )

    def list_batches(
        self, *, tenant: str | None, limit: int, after: str | None = None
    ) -> list[BatchRecord]:
        """A tenant's batches, newest first: at most ``limit``, and only those created
        before ``after`` (a batch of the tenant's) if given."""
        return self._newest_batches(limit, after, tenant, every_tenant=False)

    def all_batches(self, *, limit: int, after: str | None = None) -> list[BatchRecord]:
        """Every tenant's batches, newest first: at most ``limit``, and only those
        created before the batch ``after`` if given."""
        return self._newest_batches(limit, after, None, every_tenant=True)

    def _newest_batches(
        self, limit: int, after: str | None, tenant: str | None, *, every_tenant: bool
    ) -> list[BatchRecord]:
        def read(db: StoreConnection) -> list[str]:
            binds: dict[str, Any] = {"b_limit": limit}
            if not every_tenant:
                binds["b_tenant"] = tenant
            statement = bq.ALL_BATCHES if every_tenant else bq.BATCHES_OF_TENANT
            if after is not None:
                mark = accepted_batch(db, after)
                if not (every_tenant or mark.tenant == tenant):
                    raise BatchNotFound(f"no batch {after!r}")
                statement = bq.ALL_BATCHES_AFTER if every_tenant else bq.BATCHES_OF_TENANT_AFTER
                binds.update(b_created_at=mark.created_at, b_id=mark.id)
            return [row.id for row in db.execute(statement, binds)]

        return [self.get_batch(batch_id) for batch_id in self._db.reading(read)]

    # ------------------------------------------------------------------------ lines

    def batch_lines(
        self, batch_id: str, which: FileKind | None, after_line: int, limit: int
    ) -> list[BatchLine]:
        """A page of the output file's lines (``BATCH_OUTPUT``), the error file's
        (``BATCH_ERROR``) or all of them (None) after line ``after_line``, in file
        order."""
        statement = {
            FileKind.BATCH_OUTPUT: bq.OUTPUT_PAGE,
            FileKind.BATCH_ERROR: bq.ERROR_PAGE,
            None: bq.LINES_PAGE,
        }[which]
        rows = self._db.reading(
            lambda db: db.execute(
                statement, {"b_batch_id": batch_id, "b_line": after_line, "b_limit": limit}
            ).all()
        )
        return [_batch_line(row) for row in rows]

    def lines_ended_after(
        self, batch_id: str, after: tuple[datetime, int], limit: int
    ) -> list[BatchLine]:
        """At most ``limit`` of the batch's lines whose turns ended after ``after`` (an
        end's time and a line's number), in the order of their ends: a page costs what it
        returns (ix_runs_batch_ended)."""
        binds = {"b_batch_id": batch_id, "b_after_at": after[0], "b_after_line": after[1]}
        statement = bq.ended_after(self._db.engine.dialect.name)
        rows = self._db.reading(lambda db: db.execute(statement, {**binds, "b_limit": limit}).all())
        return [_batch_line(row) for row in rows]

    def refused_lines(self, batch_id: str, after_line: int, limit: int) -> list[BatchLine]:
        """At most ``limit`` of the batch's refused lines after line ``after_line``."""
        rows = self._db.reading(
            lambda db: db.execute(
                bq.REFUSED_PAGE, {"b_batch_id": batch_id, "b_line": after_line, "b_limit": limit}
            ).all()
        )
        return [_batch_line(row) for row in rows]

    def rendered_turns(self, turn_ids: Sequence[str]) -> dict[str, RenderedTurn]:
        """What the response objects of ``turn_ids`` are made of, in three queries."""

        def read(db: StoreConnection) -> dict[str, RenderedTurn]:
            binds = {"b_turn_ids": list(turn_ids)}
            turns = {row.id: turn_record(row) for row in db.execute(bq.TURNS_BY_IDS, binds)}
            runs = {row.turn_id: run_state_of(row) for row in db.execute(bq.RUNS_BY_TURNS, binds)}
            steps = read_steps(db, [run.run_id for run in runs.values()])
            return {
                turn_id: RenderedTurn(
                    turn=turn,
                    run=runs[turn_id],
                    steps=tuple(steps.get(runs[turn_id].run_id, ())),
                    approvals=read_approvals(db, turn_id) if runs[turn_id].approval_count else (),
                )
                for turn_id, turn in turns.items()
            }

        return self._db.reading(read) if turn_ids else {}

    # ----------------------------------------------------------------------- cancel

    def cancel_batch(self, batch_id: str) -> Cancelled:
        """Mark the batch cancelling (unless every line has ended: then it is completed)
        and end, unrun, every line still queued, in a session of its own or queued in a
        conversation (its run's row is updated only while still queued, so a line a
        driver claimed meanwhile is left to it; says sent to it are reported
        undelivered); the rest of its unfinished lines are returned, to be interrupted
        at their next boundary."""
        now = utc_now()
        binds = {
            "b_batch_id": batch_id,
            "b_now": now,
            "b_unstarted": CANCELLED_UNSTARTED,
            "b_waiting": CANCELLED_WAITING,
        }
        with self._db.tx() as db:
            accepted_batch(db, batch_id)
            db.execute(bq.SET_CANCELLING, {"b_batch_id": batch_id, "b_now": now})
            db.execute(bq.TOUCH_SESSIONS, {"b_batch_id": batch_id, "b_now": now})
            events = self._end_steered(db, binds)
            events += [_cancelled(row, ()) for row in db.execute(bq.END_UNSTARTED, binds).all()]
            db.insert_bulk(t.events, [{**event_row(e), "created_at": now} for e in events])
        unfinished = self._db.reading(
            lambda db: list(db.execute(bq.UNFINISHED_TURNS, {"b_batch_id": batch_id}).scalars())
        )
        return Cancelled(ended=tuple(events), unfinished=tuple(unfinished))

    def _end_steered(self, db: StoreConnection, binds: dict[str, Any]) -> list[Event]:
        """End the batch's queued lines that have steers pending (rare: a line steered
        while it waited), each with its says reported undelivered; their end events."""
        events = []
        for run in db.execute(bq.STEERED_UNSTARTED, binds).all():
            says = [s.text for s in read_pending(db, run.id, run.steer_cursor) if s.kind is SAY]
            undelivered = [*(run.undelivered or ()), *says]
            ended = db.execute(
                bq.END_STEERED, {**binds, "b_run_id": run.id, "b_undelivered": undelivered or None}
            ).one()
            events.append(_cancelled(ended, tuple(says)))
        return events

    # ----------------------------------------------------------------------- pruning

    def prune_batches(self, ended_before: datetime, *, dry_run: bool = False) -> list[str]:
        """Delete the batches that ended before ``ended_before`` with their remaining
        lines and their files (input, output, error); returns their ids (``dry_run``:
        only lists them).  Their sessions are pruned as sessions are
        (docs/operations.md#retention)."""
        with self._db.tx() as db:
            ids = list(db.execute(bq.ENDED_BATCHES_BEFORE, {"b_cut": ended_before}).scalars())
            if not ids or dry_run:
                return ids
            binds = {"b_batch_ids": ids}
            files = list(db.execute(bq.FILES_OF_BATCHES, binds).scalars())
            files += [f for f in db.execute(bq.INPUT_FILES_OF_BATCHES, binds).scalars() if f]
            db.execute(bq.DELETE_LINES, binds)
            db.execute(bq.DELETE_BATCHES, binds)
            if files:
                db.execute(bq.DELETE_FILE_PARTS, {"b_file_ids": files})
                db.execute(bq.DELETE_FILES, {"b_file_ids": files})
        return ids


# ------------------------------------------------------------------------------ rows


def _batch_line(row: Any) -> BatchLine:
    return BatchLine(
        line=row.line,
        custom_id=row.custom_id,
        turn_id=row.turn_id,
        session_id=row.session_id,
        status=None if row.status is None else TurnStatus(row.status),
        error=row.error,
        ended_at=None if row.ended_at is None else aware(row.ended_at),
    )


def _cancelled(row: Any, undelivered: tuple[str, ...]) -> Event:
    """The ``end`` event of a line a cancel ended unrun (its run's row as updated)."""
    ended = Ended(outcome=TurnStatus.CANCELLED.value, error=row.error, undelivered=undelivered)
    return Event.of(row.turn_id, row.last_seq, ended)
