"""The store's side of batches (docs/batches.md); their files are :mod:`workers.store.files`.

A batch is accepted in one transaction: its rows, and for every line that opens a
session the session, turn, run and ``queued`` event, each table written in bulk
(``COPY`` on PostgreSQL); a line that continues a session is submitted in it the way
any submission is (its session row locked, its ordinal counted), in the same
transaction.  Nothing of a batch is updated as its lines run: its counts, its output and
its error file are queries over its lines' runs, so no turn's end touches a batch row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from schemas import tables as t
from schemas.batches import (
    ANSWERED,
    UNANSWERED,
    BatchCounts,
    BatchLine,
    BatchRecord,
    BatchStatus,
    FileKind,
    FileRecord,
    LinePlan,
    LineRefusal,
)
from schemas.errors import BatchNotFound
from schemas.events import Ended, Event
from schemas.records import Approval, RunState, TurnRecord, TurnStatus
from workers.ports.backend import CommittedStep
from workers.store import line_rows as lr
from workers.store import statements as q
from workers.store.clock import utc_now
from workers.store.connection import IntegrityConflict, StoreConnection
from workers.store.files import FileStore, file_row
from workers.store.ids import new_id
from workers.store.rows import (
    aware,
    event_row,
    read_approvals,
    read_steps,
    run_state_of,
    turn_record,
)
from workers.store.statements import batches as bq

CANCELLED_UNSTARTED = "the batch was cancelled before this line started"


@dataclass(frozen=True, kw_only=True)
class NewBatch:
    """What a batch is created with (its id, its files' ids, its owner and settings)."""

    batch_id: str
    tenant: str | None
    input_file_id: str | None
    output_file_id: str
    error_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, Any] | None
    request_id: str | None


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


class BatchStore(FileStore):
    """Files and batches (see the module docstring)."""

    # --------------------------------------------------------------------- batches

    def create_batch(
        self, batch: NewBatch, plans: Sequence[LinePlan], refusals: Sequence[LineRefusal]
    ) -> tuple[BatchRecord, bool]:
        """Accept a batch: its rows and every planned line's turn, in one transaction.
        Returns the batch and whether it was created (False: ``request_id`` named one
        already, which is returned as it stands)."""
        if batch.request_id is not None:
            existing = self._batch_by_request(batch.tenant, batch.request_id)
            if existing is not None:
                return existing, False
        try:
            batch_id = self._create(batch, plans, list(refusals))
        except IntegrityConflict:
            if batch.request_id is None:
                raise
            existing = self._batch_by_request(batch.tenant, batch.request_id)
            if existing is None:
                raise
            return existing, False
        return self.get_batch(batch_id), True

    def _create(
        self, batch: NewBatch, plans: Sequence[LinePlan], refusals: list[LineRefusal]
    ) -> str:
        now = utc_now()
        with self._tx() as db:
            for kind, file_id in (
                (FileKind.BATCH_OUTPUT, batch.output_file_id),
                (FileKind.BATCH_ERROR, batch.error_file_id),
            ):
                db.execute(bq.INSERT_FILE, _batch_file_row(batch, kind, file_id, now))
            opening = [p for p in plans if p.opens_session]
            lines = self._insert_openings(db, batch.tenant, opening, now)
            for plan in plans:
                if not plan.opens_session:
                    continued = self._continue(db, plan, now)
                    if isinstance(continued, LineRefusal):
                        refusals.append(continued)
                    else:
                        lines.append(continued)
            # The batch row once its lines are known (a continuation may be refused).
            db.execute(bq.INSERT_BATCH, _batch_row(batch, len(lines), refusals, now))
            lines.extend(lr.refused_row(r) for r in refusals)
            db.insert_bulk(t.batch_lines, [{**row, "batch_id": batch.batch_id} for row in lines])
        return batch.batch_id

    def _insert_openings(
        self, db: StoreConnection, tenant: str | None, plans: Sequence[LinePlan], now: datetime
    ) -> list[dict[str, Any]]:
        """The lines that open sessions: every table's rows in one bulk write each;
        returns their line rows."""
        sessions, turns, runs, events, lines = [], [], [], [], []
        for plan in plans:
            turn_id, run_id = new_id(), new_id()
            sessions.append(lr.opened_session_row(plan, tenant, now))
            turns.append(lr.turn_row(plan, turn_id, 1, now))
            runs.append(lr.run_row(plan, turn_id, run_id, 1, now))
            events.append(lr.queued_row(turn_id, run_id, now))
            lines.append(lr.line_row(plan, turn_id))
        for table, rows in (
            (t.sessions, sessions),
            (t.turns, turns),
            (t.runs, runs),
            (t.events, events),
        ):
            db.insert_bulk(table, rows)
        return lines

    def _continue(
        self, db: StoreConnection, plan: LinePlan, now: datetime
    ) -> dict[str, Any] | LineRefusal:
        """A line that continues its session: queued after what the session has, as a
        submission is; refused if its ``custom_id`` was a request id there already."""
        existing = db.execute(
            q.TURN_BY_REQUEST, {"b_session_id": plan.session_id, "b_request_id": plan.custom_id}
        ).one_or_none()
        if existing is not None:
            return LineRefusal(
                line=plan.line,
                custom_id=plan.custom_id,
                code="duplicate_custom_id",
                message=f"custom_id {plan.custom_id!r} was a request id of conversation "
                f"{plan.session_id!r} already (turn {existing.id})",
                param="custom_id",
            )
        ordinal = self._count_turn(db, plan.session_id, plan.prompt)
        turn_id, run_id = new_id(), new_id()
        db.execute(q.INSERT_TURN, lr.turn_binds(lr.turn_row(plan, turn_id, ordinal, now)))
        db.execute(q.INSERT_RUN, lr.run_binds(plan, turn_id, run_id, ordinal, now))
        queued = lr.queued_row(turn_id, run_id, now)
        db.execute(q.INSERT_QUEUED, {"b_turn_id": turn_id, "b_data": queued["data"], "b_now": now})
        return lr.line_row(plan, turn_id)

    def _batch_by_request(self, tenant: str | None, request_id: str) -> BatchRecord | None:
        row = self._reading(
            lambda db: db.execute(
                bq.BATCH_BY_REQUEST, {"b_tenant": tenant, "b_request_id": request_id}
            ).one_or_none()
        )
        return None if row is None else self.get_batch(row.id)

    def get_batch(self, batch_id: str) -> BatchRecord:
        """The batch with its counts as they stand; the first read to find every line
        ended writes its end."""
        row, counts = self._reading(lambda db: _batch_and_counts(db, batch_id))
        record = _batch_record(row, counts)
        if record.ended_at is None and counts.ended >= counts.total:
            now = utc_now()
            status = "cancelled" if record.status is BatchStatus.CANCELLING else "completed"
            with self._tx() as db:
                db.execute(
                    bq.END_BATCH, {"b_batch_id": batch_id, "b_status": status, "b_ended_at": now}
                )
            row, counts = self._reading(lambda db: _batch_and_counts(db, batch_id))
            record = _batch_record(row, counts)
        return record

    def list_batches(
        self, *, tenant: str | None, limit: int, after: str | None = None
    ) -> list[BatchRecord]:
        """A tenant's batches, newest first: at most ``limit``, and only those created
        before ``after`` (a batch of the tenant's) if given."""

        def read(db: StoreConnection) -> list[str]:
            binds: dict[str, Any] = {"b_tenant": tenant, "b_limit": limit}
            statement = bq.BATCHES_OF_TENANT
            if after is not None:
                mark = db.execute(bq.BATCH, {"b_batch_id": after}).one_or_none()
                if mark is None or mark.tenant != tenant:
                    raise BatchNotFound(f"no batch {after!r}")
                statement = bq.BATCHES_OF_TENANT_AFTER
                binds.update(b_created_at=mark.created_at, b_id=mark.id)
            return [row.id for row in db.execute(statement, binds)]

        return [self.get_batch(batch_id) for batch_id in self._reading(read)]

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
        rows = self._reading(
            lambda db: db.execute(
                statement, {"b_batch_id": batch_id, "b_line": after_line, "b_limit": limit}
            ).all()
        )
        return [_batch_line(row) for row in rows]

    def lines_ended_since(self, batch_id: str, since: datetime, limit: int) -> list[BatchLine]:
        """The lines that ended at or after ``since`` (and the refused ones), in the
        order they ended: at most ``limit``."""
        rows = self._reading(
            lambda db: db.execute(
                bq.ENDED_SINCE, {"b_batch_id": batch_id, "b_since": since, "b_limit": limit}
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

        return self._reading(read) if turn_ids else {}

    # ----------------------------------------------------------------------- cancel

    def cancel_batch(self, batch_id: str) -> Cancelled:
        """Mark the batch cancelling and end, unrun, every line that opened its session
        and never started (its run's row is updated only while still queued, so a line
        a driver claimed meanwhile is left to it); the rest of its unfinished lines are
        returned, to be interrupted at their next boundary."""
        now = utc_now()
        with self._tx() as db:
            if db.execute(bq.BATCH, {"b_batch_id": batch_id}).one_or_none() is None:
                raise BatchNotFound(f"no batch {batch_id!r}")
            db.execute(bq.SET_CANCELLING, {"b_batch_id": batch_id, "b_now": now})
            db.execute(bq.TOUCH_SESSIONS, {"b_batch_id": batch_id, "b_now": now})
            ended = db.execute(
                bq.END_UNSTARTED,
                {"b_batch_id": batch_id, "b_now": now, "b_error": CANCELLED_UNSTARTED},
            ).all()
            events = [
                Event.of(
                    row.turn_id,
                    row.last_seq,
                    Ended(outcome=TurnStatus.CANCELLED.value, error=CANCELLED_UNSTARTED),
                )
                for row in ended
            ]
            db.insert_bulk(t.events, [{**event_row(e), "created_at": now} for e in events])
        unfinished = self._reading(
            lambda db: list(db.execute(bq.UNFINISHED_TURNS, {"b_batch_id": batch_id}).scalars())
        )
        return Cancelled(ended=tuple(events), unfinished=tuple(unfinished))

    # ------------------------------------------------------------------------ window

    def oldest_queued_batch_sessions(self, limit: int) -> list[str]:
        """The sessions of the oldest batch runs that may start now, oldest first (a
        session once, however many of its runs are among them)."""
        rows = self._reading(
            lambda db: list(
                db.execute(bq.OLDEST_QUEUED_BATCH, {"b_now": utc_now(), "b_limit": limit}).scalars()
            )
        )
        return list(dict.fromkeys(rows))

    def batch_runs_in_flight(self) -> int:
        """Batch runs a driver has now, or that wait for provider capacity."""
        return int(
            self._reading(
                lambda db: db.execute(bq.BATCH_IN_FLIGHT, {"b_now": utc_now()}).scalar_one()
            )
        )

    # ----------------------------------------------------------------------- pruning

    def prune_batches(self, ended_before: datetime, *, dry_run: bool = False) -> list[str]:
        """Delete the batches that ended before ``ended_before`` with their remaining
        lines and their files (input, output, error); returns their ids (``dry_run``:
        only lists them).  Their sessions are pruned as sessions are
        (docs/operations.md#retention)."""
        with self._tx() as db:
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


def _batch_and_counts(db: StoreConnection, batch_id: str) -> tuple[Any, BatchCounts]:
    row = db.execute(bq.BATCH, {"b_batch_id": batch_id}).one_or_none()
    if row is None:
        raise BatchNotFound(f"no batch {batch_id!r}")
    tally: dict[str, int] = {}
    for count in db.execute(bq.BATCH_COUNTS, {"b_batch_id": batch_id, "b_now": utc_now()}):
        key = _count_key(count.status, bool(count.throttled))
        tally[key] = tally.get(key, 0) + int(count.lines)
    return row, BatchCounts(total=row.total, **tally)


def _count_key(status: str | None, throttled: bool) -> str:
    """Which of :class:`BatchCounts`' fields a line of run ``status`` counts in."""
    if status is None:
        return "failed"  # refused at submission
    turn_status = TurnStatus(status)
    if turn_status in ANSWERED:
        return "completed"
    if turn_status in UNANSWERED:
        return "failed"
    if turn_status is TurnStatus.QUEUED:
        return "throttled" if throttled else "queued"
    return "running" if turn_status is TurnStatus.RUNNING else "waiting"


def _batch_record(row: Any, counts: BatchCounts) -> BatchRecord:
    return BatchRecord(
        batch_id=row.id,
        tenant=row.tenant,
        input_file_id=row.input_file_id,
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        endpoint=row.endpoint,
        completion_window=row.completion_window,
        metadata=row.metadata,
        request_id=row.request_id,
        status=BatchStatus(row.status),
        errors=row.errors,
        created_at=aware(row.created_at),
        cancelling_at=None if row.cancelling_at is None else aware(row.cancelling_at),
        ended_at=None if row.ended_at is None else aware(row.ended_at),
        counts=counts,
    )


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


def _batch_file_row(batch: NewBatch, kind: FileKind, file_id: str, now: datetime) -> dict[str, Any]:
    name = "output" if kind is FileKind.BATCH_OUTPUT else "errors"
    return file_row(
        FileRecord(
            file_id=file_id,
            tenant=batch.tenant,
            purpose="batch_output",  # (OpenAI's, for both)
            filename=f"{batch.batch_id}_{name}.jsonl",
            kind=kind,
            bytes=None,
            batch_id=batch.batch_id,
            created_at=now,
        )
    )


def _batch_row(
    batch: NewBatch, accepted: int, refusals: Sequence[LineRefusal], now: datetime
) -> dict[str, Any]:
    """A new batch's row: in progress, or failed at once if none of its lines was
    accepted (its ``errors`` OpenAI's ``errors.data``: the first hundred lines' reasons)."""
    failed = accepted == 0
    return {
        "id": batch.batch_id,
        "tenant": batch.tenant,
        "input_file_id": batch.input_file_id,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "endpoint": batch.endpoint,
        "completion_window": batch.completion_window,
        "metadata": batch.metadata,
        "request_id": batch.request_id,
        "status": "failed" if failed else "in_progress",
        "total": accepted + len(refusals),
        "errors": [r.to_json() for r in refusals[:100]] if failed else None,
        "created_at": now,
        "cancelling_at": None,
        "ended_at": now if failed else None,
    }
