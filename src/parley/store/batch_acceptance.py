"""The store's side of accepting a batch (docs/batches.md#how-the-lines-reach-the-fleet):
a chunk of lines per transaction, so that others write between them (a hundred thousand
lines in one transaction held SQLite's write lock for seconds), and all or nothing to
anyone who looks.

:meth:`AcceptanceStore.open_batch` writes the batch's row, ``accepting``;
:meth:`~AcceptanceStore.accept_lines` writes a chunk of its lines, for each that opens a
session its session, turn, run and ``queued`` event (each table in bulk: ``COPY`` on
PostgreSQL); :meth:`~AcceptanceStore.finish_batch` queues the lines that continue
conversations, in their sessions, and makes it a batch (``in_progress``, or ``failed``
if no line was accepted) in one last transaction.  Until then no reader sees the batch
(it is not found, not listed) and the batch window starts none of its lines
(src/parley/store/statements/batches.py), so a batch is never seen or run half accepted.
An acceptance given up (its own failure, or a retry of its request id that finds it
stalled, or ``parley prune`` once it is an hour old) is dropped: its rows are deleted,
a chunk at a time, and the roots of the sessions it opened handed back to remove.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from parley.schemas import tables as t
from parley.schemas.batches import BatchRecord, FileKind, FileRecord, LinePlan, LineRefusal
from parley.schemas.errors import BatchNotFound, Conflict, SessionNotFound
from parley.store import line_rows as lr
from parley.store import statements as q
from parley.store.batches import BatchStore
from parley.store.clock import utc_now
from parley.store.connection import IntegrityConflict, StoreConnection, Transactions
from parley.store.files import file_row
from parley.store.ids import new_id
from parley.store.statements import batches as bq
from parley.store.submissions import SubmissionStore

MAX_ERRORS = 100
"""The most refusals a failed batch's ``errors`` lists (the first lines')."""
DROP_CHUNK = 500
"""Sessions of a dropped acceptance deleted per transaction."""


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
class Acceptance:
    """A batch still being accepted (or dropped): its id, and the lines written so far
    (which grow while its acceptance is alive)."""

    batch_id: str
    lines: int
    dropping: bool


class AcceptanceStore:
    """Accepting batches (see the module docstring)."""

    def __init__(self, db: Transactions, batches: BatchStore, submissions: SubmissionStore) -> None:
        self._db = db
        self._batches = batches
        self._submissions = submissions

    def open_batch(self, batch: NewBatch) -> BatchRecord | Acceptance | None:
        """Begin accepting ``batch``: its row (seen by no reader yet) and its output and
        error files' rows.  None once begun; if its request id is one the tenant gave
        before, what that made: the batch, or its acceptance still under way (or
        given up and not yet dropped)."""
        for _attempt in range(3):
            if batch.request_id is not None:
                found = self.batch_by_request(batch.tenant, batch.request_id)
                if found is not None:
                    return found
            try:
                self._open(batch)
            except IntegrityConflict:
                if batch.request_id is None:
                    raise
                continue  # made meanwhile by a retry of the same request (or dropped)
            return None
        raise Conflict(f"request id {batch.request_id!r} is being used by another batch")

    def _open(self, batch: NewBatch) -> None:
        now = utc_now()
        with self._db.tx() as db:
            for kind, file_id in (
                (FileKind.BATCH_OUTPUT, batch.output_file_id),
                (FileKind.BATCH_ERROR, batch.error_file_id),
            ):
                db.execute(bq.INSERT_FILE, _batch_file_row(batch, kind, file_id, now))
            db.execute(bq.INSERT_BATCH, _batch_row(batch, now))

    def batch_by_request(
        self, tenant: str | None, request_id: str
    ) -> BatchRecord | Acceptance | None:
        """The batch the tenant made with ``request_id``, or its acceptance under way."""
        row = self._db.reading(
            lambda db: db.execute(
                bq.BATCH_BY_REQUEST, {"b_tenant": tenant, "b_request_id": request_id}
            ).one_or_none()
        )
        if row is None:
            return None
        if row.status in bq.UNACCEPTED:
            return Acceptance(batch_id=row.id, lines=row.total, dropping=row.status == bq.DROPPING)
        try:
            return self._batches.get_batch(row.id)
        except BatchNotFound:
            return None  # dropped since

    def accept_lines(
        self,
        batch_id: str,
        tenant: str | None,
        opening: Sequence[LinePlan],
        refused: Sequence[LineRefusal],
    ) -> None:
        """Write a chunk of an accepting batch's lines, in one transaction: for each of
        ``opening`` its session, turn, run and ``queued`` event, and each line's row
        (``refused`` ones with their refusal).  :class:`Conflict` if the batch is no
        longer being accepted (a retry of its request id found it stalled, and drops
        it)."""
        now = utc_now()
        with self._db.tx() as db:
            advanced = db.execute(
                bq.ADVANCE_ACCEPTANCE,
                {"b_batch_id": batch_id, "b_lines": len(opening) + len(refused)},
            ).rowcount
            if not advanced:
                raise Conflict(f"batch {batch_id} is no longer being accepted")
            lines = self._insert_openings(db, (batch_id, tenant), opening, now)
            lines.extend(lr.refused_row(r) for r in refused)
            db.insert_bulk(t.batch_lines, [{**row, "batch_id": batch_id} for row in lines])

    def _insert_openings(
        self,
        db: StoreConnection,
        batch: tuple[str, str | None],
        plans: Sequence[LinePlan],
        now: datetime,
    ) -> list[dict[str, Any]]:
        """The lines that open sessions, of the batch ``(id, tenant)``: every table's rows
        in one bulk write each (the conversations chat-completions lines import too);
        returns their line rows."""
        batch_id, tenant = batch
        sessions, runs, events, lines = [], [], [], []
        turns: list[dict[str, Any]] = []
        seeded_runs: list[dict[str, Any]] = []
        seeded_steps: list[dict[str, Any]] = []
        seeds: list[dict[str, Any]] = []
        for plan in plans:
            turn_id, run_id = new_id(), new_id()
            history = lr.history_rows(plan, now)
            position = 1 + (len(history.records) if history is not None else 0)
            if history is not None:
                turns.extend(history.turns)
                seeded_runs.extend(history.runs)
                seeded_steps.extend(history.steps)
                seeds.append(lr.history_seed_row(plan, now))
            sessions.append(lr.opened_session_row(plan, tenant, batch_id, now, history))
            turns.append(lr.turn_row(plan, turn_id, position, now))
            runs.append(lr.run_row(plan, tenant, turn_id, run_id, position, now))
            events.append(lr.queued_row(turn_id, run_id, now))
            lines.append(lr.line_row(plan, turn_id))
        for table, rows in (
            (t.sessions, sessions),
            (t.turns, turns),
            (t.runs, seeded_runs),
            (t.runs, runs),
            (t.steps, seeded_steps),
            (t.seeds, seeds),
            (t.events, events),
        ):
            db.insert_bulk(table, rows)
        return lines

    def finish_batch(self, batch_id: str, continuing: Sequence[LinePlan]) -> BatchRecord:
        """Make an accepting batch one, in one transaction: queue ``continuing`` (lines
        that continue conversations) in their sessions, each refused alone if its
        ``custom_id`` was a request id there or its session is gone, and put the batch
        in progress, or failed if none of its lines was accepted (its ``errors`` the
        first lines' refusals).  From its commit readers see the batch whole and its
        lines may start.  :class:`Conflict` if it is no longer being accepted."""
        now = utc_now()
        with self._db.tx() as db:
            if db.execute(bq.LOCK_ACCEPTING, {"b_batch_id": batch_id}).one_or_none() is None:
                raise Conflict(f"batch {batch_id} is no longer being accepted")
            lines = [self._continue(db, plan, now) for plan in continuing]
            db.insert_bulk(t.batch_lines, [{**row, "batch_id": batch_id} for row in lines])
            counts = db.execute(bq.LINE_COUNTS, {"b_batch_id": batch_id}).one()
            failed = counts.accepted == 0
            errors = None
            if failed:
                first = db.execute(bq.FIRST_ERRORS, {"b_batch_id": batch_id, "b_limit": MAX_ERRORS})
                errors = list(first.scalars())
            db.execute(
                bq.FINISH_ACCEPTANCE,
                {
                    "b_batch_id": batch_id,
                    "b_status": "failed" if failed else "in_progress",
                    "b_total": counts.lines,
                    "b_errors": errors,
                    "b_ended_at": now if failed else None,
                },
            )
        return self._batches.get_batch(batch_id)

    def _continue(self, db: StoreConnection, plan: LinePlan, now: datetime) -> dict[str, Any]:
        """The row of a line that continues its session: queued after what the session
        has, as a submission is; refused if its ``custom_id`` was a request id there
        already, or the session is gone (pruned since the line was read)."""
        existing = db.execute(
            q.TURN_BY_REQUEST, {"b_session_id": plan.session_id, "b_request_id": plan.custom_id}
        ).one_or_none()
        if existing is not None:
            return lr.refused_row(
                LineRefusal(
                    line=plan.line,
                    custom_id=plan.custom_id,
                    code="duplicate_custom_id",
                    message=f"custom_id {plan.custom_id!r} was a request id of conversation "
                    f"{plan.session_id!r} already (turn {existing.id})",
                    param="custom_id",
                )
            )
        try:
            ordinal = self._submissions.count_turn(db, plan.session_id, plan.prompt)
        except SessionNotFound:
            return lr.refused_row(
                LineRefusal(
                    line=plan.line,
                    custom_id=plan.custom_id,
                    code="conversation_not_found",
                    message=f"Conversation with id '{plan.session_id}' not found.",
                    param="body.conversation",
                )
            )
        turn_id, run_id = new_id(), new_id()
        db.execute(q.INSERT_TURN, lr.turn_binds(lr.turn_row(plan, turn_id, ordinal, now)))
        db.execute(q.INSERT_RUN, lr.run_binds(plan, turn_id, run_id, ordinal, now))
        queued = lr.queued_row(turn_id, run_id, now)
        db.execute(q.INSERT_QUEUED, {"b_turn_id": turn_id, "b_data": queued["data"], "b_now": now})
        return lr.line_row(plan, turn_id)

    # --------------------------------------------------------------------- dropping

    def drop_batch(self, batch_id: str, *, seen: int | None = None) -> list[str] | None:
        """Delete an acceptance never finished, with every row it wrote: its sessions
        (and all that refers to them) a chunk per transaction, then its lines, its row
        and its files' rows.  Returns the roots of the sessions its lines opened (their
        directories are the caller's to remove); None if it is not to be dropped: it
        was finished, or (``seen``: a count of its lines another process saw) it has
        written lines since, so it is alive."""
        marking = bq.DROP_OWN if seen is None else bq.DROP_STALLED
        with self._db.tx() as db:
            if not db.execute(marking, {"b_batch_id": batch_id, "b_seen": seen}).rowcount:
                return None
        roots: list[str] = []
        while True:
            with self._db.tx() as db:
                page = db.execute(
                    bq.OPENED_BY_LINES, {"b_batch_id": batch_id, "b_limit": DROP_CHUNK}
                ).all()
                if page:
                    sessions = {"b_session_ids": [row.id for row in page]}
                    for statement in q.PRUNE_DELETES:
                        db.execute(statement, sessions)
                    roots.extend(row.root for row in page)
                    continue
                binds = {"b_batch_ids": [batch_id]}
                files = list(db.execute(bq.FILES_OF_BATCHES, binds).scalars())
                db.execute(bq.DELETE_LINES_OF_BATCH, {"b_batch_id": batch_id})
                db.execute(bq.DELETE_BATCHES, binds)
                db.execute(bq.DELETE_FILE_PARTS, {"b_file_ids": files})
                db.execute(bq.DELETE_FILES, {"b_file_ids": files})
                return roots

    def abandoned_acceptances(self, begun_before: datetime) -> list[Acceptance]:
        """Acceptances begun before ``begun_before`` and never finished."""
        rows = self._db.reading(
            lambda db: db.execute(bq.ABANDONED_BEFORE, {"b_cut": begun_before}).all()
        )
        return [Acceptance(batch_id=r.id, lines=r.total, dropping=False) for r in rows]


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


def _batch_row(batch: NewBatch, now: datetime) -> dict[str, Any]:
    """A batch's row as its acceptance begins: no line written yet."""
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
        "status": bq.ACCEPTING,
        "total": 0,
        "errors": None,
        "created_at": now,
        "cancelling_at": None,
        "ended_at": None,
    }
