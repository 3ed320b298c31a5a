"""The store's side a driver uses: take a session (a new fence) and claim its next
runnable turn, commit each step whole, close the inbox, and commit a turn's end (with the
claim of the next one).  Every write is fenced: it updates the session row ``WHERE fence
= :fence``, so a driver whose token is stale changes nothing (:class:`Fenced`).  Step
inserts are ``ON CONFLICT DO NOTHING`` and guarded by ``runs.steps = :index``, so a
commit retried after a cold shutdown can never write a step twice."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, Literal

from schemas.errors import Fenced, SessionNotFound
from schemas.events import Ended, Event, Started
from schemas.messages import Prefix, StepPayload
from schemas.records import Approval, Steer, SteerKind, TurnRecord, TurnStatus
from workers.coordination import constants as c
from workers.ports.backend import (
    Claim,
    ClaimedTurn,
    FinishReceipt,
    KnownTurns,
    PathTurn,
    SeqFloor,
    StepReceipt,
    TurnEnd,
)
from workers.store import statements as q
from workers.store.connection import StoreConnection, Transactions
from workers.store.outbox import insert_delivery
from workers.store.rows import (
    SessionRow,
    approval_of,
    event_row,
    read_path,
    read_pending,
    read_steps,
    run_state_of,
    session_record,
    turn_of_next_run,
    write_events,
)


def _now() -> datetime:
    return datetime.now(UTC)


class TurnRunStore(Transactions):
    """The driver's protocol (see the module docstring); one transaction per method."""

    # ------------------------------------------------------------------ driving

    def sessions_with_work(self) -> list[str]:
        """Sessions that have a queued or running turn (for sweepers and startup)."""
        return self._reading(lambda db: list(db.execute(q.SESSIONS_WITH_WORK).scalars()))

    def _check_fence(self, db: StoreConnection, session_id: str, fence: int) -> SessionRow:
        """Lock the session row and return it if ``fence`` still holds; else Fenced."""
        row = db.execute(q.LOCK_SESSION, {"b_session_id": session_id}).one_or_none()
        if row is None or row.fence != fence:
            raise Fenced(f"fence {fence} is stale (now {row.fence if row else None})")
        return SessionRow.of(row)

    def start_drive(
        self, session_id: str, *, worker: str, seq_floor: SeqFloor, known: KnownTurns | None = None
    ) -> tuple[int, Claim | None]:
        """For a driver that just took the session's lock: a new fencing token and, in the
        same transaction, the claim of the session's next runnable turn (if any)."""
        if self._q.start_drive is not None:
            fence, claim = self._start_in_one_statement(
                self._q.start_drive, session_id, worker, known
            )
            if claim is not False:
                return fence, claim
            # The run needs its buffer adopted first, or the statement's snapshot missed
            # one: claim in a transaction that holds the session row, under that fence.
            with self._tx() as db:
                locked = self._check_fence(db, session_id, fence)
                return fence, self._claim_next(
                    db, locked, fence=fence, worker=worker, seq_floor=seq_floor, known=known
                )
        with self._tx() as db:
            row = db.execute(q.TAKE_FENCE, {"b_session_id": session_id}).one_or_none()
            if row is None:
                raise SessionNotFound(f"no session {session_id!r}")
            session = SessionRow.of(row)
            return session.fence, self._claim_next(
                db, session, fence=session.fence, worker=worker, seq_floor=seq_floor, known=known
            )

    def _start_in_one_statement(
        self, statement: Any, session_id: str, worker: str, known: KnownTurns | None
    ) -> tuple[int, Claim | Literal[False] | None]:
        """PostgreSQL: take the fence and claim a fresh run in one statement on its own
        (``start_drive`` in DialectStatements).  Returns the fence and the claim, None
        when nothing is runnable, or False when the claim must be made in a transaction:
        a run that started before, or a snapshot that missed a submission."""
        now = _now()
        self._count_transaction()
        with self._autocommit() as db:
            row = db.execute(
                statement, {"b_session_id": session_id, "b_worker": worker, "b_now": now}
            ).one_or_none()
            if row is None:
                raise SessionNotFound(f"no session {session_id!r}")
            values = row._mapping
            session = SessionRow.of(values)
            fence = session.fence
            if not values["claimed"]:
                missed = values[q.RUN_PREFIX + "id"] is None and session.turn_count != row.seen
                return fence, (False if missed or values[q.RUN_PREFIX + "id"] else None)
            width = len(q.RUN_PREFIX)
            run = SimpleNamespace(
                **{k[width:]: v for k, v in values.items() if k.startswith(q.RUN_PREFIX)}
            )
            claim = self._claim(
                db,
                run,
                session,
                turn=turn_of_next_run(run),
                worker=worker,
                seq_floor=0,
                known=known,
                head=None,
                now=now,
                written=True,
            )
            return fence, claim

    def _claim_next(
        self,
        db: StoreConnection,
        session: SessionRow,
        *,
        fence: int,
        worker: str,
        seq_floor: SeqFloor,
        known: KnownTurns | None,
        head: _Head | None = None,
    ) -> Claim | None:
        """Claim the next runnable turn of ``session`` (its row as read, updated by what
        ``head`` says when a turn's end in this transaction came after the read)."""
        now = _now()
        if self._q.claim_next is not None:
            run = db.execute(
                self._q.claim_next,
                {
                    "b_session_id": session.id,
                    "b_worker": worker,
                    "b_now": now,
                    "b_head": session.head_turn_id,
                },
            ).one_or_none()
        else:
            run = db.execute(q.NEXT_RUN, {"b_session_id": session.id}).one_or_none()
        if run is None or run.status == q.WAITING:
            return None  # a turn that waits for answers holds the session's line
        turn = turn_of_next_run(run)
        # A first attempt needs no adoption: no driver ever published for it, and the
        # buffer can hold nothing above the stored ``queued`` event.
        floor = seq_floor(run.turn_id, fence) if run.attempts else 0
        if run.status == q.RUNNING:
            # Cut off mid-turn: how far it published past its last commit, readers may
            # know better than a buffer that lost its tail (a flush, a failover).
            floor = max(floor, run.last_seq + c.TAKEOVER_SEQ_GAP)
        written = bool(getattr(run, "claimed", False))  # (NEXT_RUN has no such column)
        return self._claim(
            db,
            run,
            session,
            turn=turn,
            worker=worker,
            seq_floor=floor,
            known=known,
            head=head,
            now=now,
            written=written,
        )

    def _claim(
        self,
        db: StoreConnection,
        run: Any,
        row: SessionRow,
        *,
        turn: TurnRecord,
        worker: str,
        seq_floor: int,
        known: KnownTurns | None,
        head: _Head | None,
        now: datetime,
        written: bool,
    ) -> Claim:
        """Claim ``run`` (its locked row, as it was before the claim) given its session's
        ``row`` and ``head``.  ``written``: the claim's writes were made already, by the
        statement that read the run.  The steps of history turns ``known`` to the claimant
        are not loaded."""
        turn_id = run.turn_id
        session = session_record(row)
        if run.attempts == 0 and turn.parent_id != session.head_turn_id:
            # A queued turn hangs under the head as it is when it starts (a turn is
            # stored without a parent, so only a session's first turn skips this write).
            if not written:
                db.execute(
                    q.SET_PARENT, {"b_turn_id": turn_id, "b_parent_id": session.head_turn_id}
                )
            turn = replace(turn, parent_id=session.head_turn_id)
        seq = max(run.last_seq, seq_floor) + 1
        started = Event.of(
            turn_id, seq, Started(run_id=run.id, attempt=run.attempts + 1, worker=worker)
        )
        if not written:
            db.execute(
                q.CLAIM_RUN, {"b_run_id": run.id, "b_worker": worker, "b_now": now, "b_seq": seq}
            )
            write_events(db, self._q, [started], now)
        generation = head.generation if head else int(row.prefix_generation)
        if head and head.path is not None and turn.parent_id == head.turn_id:
            path = list(head.path)
        else:
            path = read_path(db, turn.parent_id)
        skipped = {p.turn_id for p in path if known(p.turn_id)} if known else set()
        run_ids = [p.run_id for p in path if p.turn_id not in skipped]
        steps = read_steps(db, run_ids + ([run.id] if run.steps else []))
        claimed = ClaimedTurn(
            session=session,
            turn=turn,
            run=run_state_of(run),
            prefix=head.prefix
            if head and head.prefix is not None
            else self._prefix(db, session.session_id, generation),
            prefix_generation=generation,
            history=tuple(
                PathTurn(
                    turn=p,
                    steps=None if p.turn_id in skipped else tuple(steps.get(p.run_id, ())),
                )
                for p in path
            ),
            steps=tuple(steps.get(run.id, ())),
            # The steers the run row counted: a claim made in a statement of its own no
            # longer holds the row, and a later steer reaches the first boundary anyway.
            pending=tuple(
                s
                for s in read_pending(db, run.id, run.steer_cursor)
                if s.position <= run.steer_count
            )
            if run.steer_count > run.steer_cursor
            else (),
            previous_status=run.status,
            next_seq=seq + 1,
        )
        return claimed, started

    def commit_step(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        index: int,
        payload: StepPayload,
        steer_cursor: int,
        events: Sequence[Event],
        close_inbox_if_idle: bool,
        end: TurnEnd | None = None,
    ) -> StepReceipt:
        """Commit one step whole: step row, run usage and cursor, session tokens, durable
        events, fencing check.  The receipt counts the steers accepted so far; when asked
        and none is pending, the inbox is closed in the same transaction, and with ``end``
        the turn's end is committed there too (a turn whose last step needs nothing after
        it costs one transaction, not two) and is in the receipt."""
        now = _now()
        if end is not None:
            try:
                with self._tx() as db:
                    finished = self._end_turn(
                        db,
                        run_id,
                        session_id,
                        fence,
                        steer_cursor,
                        events,
                        end,
                        now,
                        step=(index, payload),
                    )
                return StepReceipt(finished=finished)
            except _NotFinal:
                pass  # a steer arrived meanwhile, or the run moved on: the step alone, below
        usage = payload.usage
        with self._tx() as db:
            charged = db.execute(
                q.CHARGE_SESSION,
                {"b_session_id": session_id, "b_fence": fence, "b_tokens": usage.total},
            ).rowcount
            if charged != 1:
                raise Fenced(f"fence {fence} is stale; step {index} not committed")
            steer_count = db.execute(
                q.ADVANCE_RUN,
                {
                    "b_run_id": run_id,
                    "b_index": index,
                    "b_input_tokens": usage.input_tokens,
                    "b_output_tokens": usage.output_tokens,
                    "b_cached_tokens": usage.cached_tokens,
                    "b_cursor": steer_cursor,
                    "b_last_seq": max((e.seq for e in events), default=0),
                    "b_close": close_inbox_if_idle or end is not None,
                },
            ).scalar_one_or_none()
            if steer_count is None:
                raise Fenced(f"run {run_id} moved on; step {index} not committed")
            self._insert_step(db, run_id, index, payload, now)
            write_events(db, self._q, events, now)
            # Nothing pending: if asked, the inbox is closed.  Pending steers are read at
            # the next boundary, from the turn's steer list where it has them all.
            return StepReceipt(steer_count=int(steer_count))

    def hold_step(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        held_step: dict[str, Any],
        approvals: Sequence[Approval],
        events: Sequence[Event],
    ) -> None:
        """The step waits for answers: the run becomes ``waiting`` holding ``held_step``,
        each asked call gets its approval row, and ``events`` are stored, in one
        transaction under the session's fence.  The driver then lets the session go."""
        now = _now()
        with self._tx() as db:
            self._check_fence(db, session_id, fence)
            held = db.execute(
                q.HOLD_RUN,
                {
                    "b_run_id": run_id,
                    "b_held_step": held_step,
                    "b_asked": len(approvals),
                    "b_last_seq": max((e.seq for e in events), default=0),
                },
            ).rowcount
            if held != 1:
                raise Fenced(f"run {run_id} moved on; its step was not held")
            for position, approval in enumerate(approvals):
                db.execute(
                    q.INSERT_APPROVAL,
                    {
                        "id": approval.approval_id,
                        "run_id": run_id,
                        "turn_id": approval.turn_id,
                        "step_index": approval.step,
                        "position": position,
                        "call_id": approval.call_id,
                        "tool": approval.tool,
                        "arguments": approval.arguments,
                        "accesses": [dict(a) for a in approval.accesses],
                        "requested_at": approval.requested_at,
                        "expires_at": approval.expires_at,
                        "decision": None,
                        "reason": None,
                        "decided_at": None,
                        "consumed_at": None,
                    },
                )
            write_events(db, self._q, events, now)

    def approvals_of_run(self, run_id: str) -> dict[str, Approval]:
        """A run's approvals by id, in step and call order."""
        rows = self._reading(lambda db: db.execute(q.APPROVALS_OF_RUN, {"b_run_id": run_id}).all())
        return {row.id: approval_of(row) for row in rows}

    def consume_approval(self, *, approval_id: str, session_id: str, fence: int) -> bool:
        """Mark an approved call as started, once, under the session's fence: True the
        first time (run it now), False if an earlier attempt marked it (it may have run)."""
        with self._tx() as db:
            self._check_fence(db, session_id, fence)
            marked = db.execute(
                q.CONSUME_APPROVAL, {"b_approval_id": approval_id, "b_now": _now()}
            ).rowcount
        return bool(marked)

    def _insert_step(
        self, db: StoreConnection, run_id: str, index: int, payload: StepPayload, now: datetime
    ) -> None:
        db.execute(
            self._q.insert_step,
            {
                "run_id": run_id,
                "step_index": index,
                "payload": payload.to_json(),
                "created_at": now,
            },
        )

    def close_inbox(
        self, *, run_id: str, session_id: str, fence: int, cursor: int
    ) -> tuple[Steer, ...]:
        """Close the inbox unless steers are pending; returns the pending ones."""
        with self._tx() as db:
            self._check_fence(db, session_id, fence)
            db.execute(q.LOCK_RUN, {"b_run_id": run_id}).one()
            pending = read_pending(db, run_id, cursor)
            if not pending:
                db.execute(q.CLOSE_INBOX, {"b_run_id": run_id})
            return pending

    def finish_turn(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        cursor: int,
        events: Sequence[Event],
        end: TurnEnd,
    ) -> FinishReceipt:
        """Commit a turn's outcome, reply, head and prefix in one fenced transaction.
        Says still pending are reported as undelivered in the ``end`` event.  With
        ``end.claim_next``, the same transaction claims the session's next runnable turn."""
        now = _now()
        with self._tx() as db:
            return self._end_turn(db, run_id, session_id, fence, cursor, events, end, now)

    def _end_turn(
        self,
        db: StoreConnection,
        run_id: str,
        session_id: str,
        fence: int,
        cursor: int,
        events: Sequence[Event],
        end: TurnEnd,
        now: datetime,
        *,
        step: tuple[int, StepPayload] | None = None,
    ) -> FinishReceipt:
        """The turn-ending statements of a transaction.  With ``step`` (its index and
        payload) the turn's last step commits in the same row updates, provided no steer
        is pending (else :class:`_NotFinal`); without, the inbox is closed here and what
        is pending is reported undelivered."""
        status = end.status
        if step is not None:
            # Nothing pending (or this fails): nothing undelivered.
            end_event = _end_event(end, ())
            session = self._end_with_step(
                db, run_id, session_id, fence, cursor, [*events, end_event], end, now, step
            )
            undelivered: tuple[str, ...] = ()
        else:
            discarded = end.discarded
            session = self._finish_session(db, session_id, fence, end, discarded.total, now)
            closed = db.execute(q.CLOSE_RUNNING, {"b_run_id": run_id}).one_or_none()
            if closed is None:
                raise Fenced(f"run {run_id} is no longer running; not finished")
            steer_count = closed.steer_count
            if discarded.total:
                db.execute(
                    q.CHARGE_RUN,
                    {
                        "b_run_id": run_id,
                        "b_input_tokens": discarded.input_tokens,
                        "b_output_tokens": discarded.output_tokens,
                        "b_cached_tokens": discarded.cached_tokens,
                    },
                )
            pending = read_pending(db, run_id, cursor) if steer_count > cursor else ()
            # The end event reports what this attempt gives up on; the run keeps every say
            # of the turn that never reached the model, across resumes.
            undelivered = tuple(s.text for s in pending if s.kind is SteerKind.SAY)
            end_event = _end_event(end, undelivered)
            last = max([cursor] + [s.position for s in pending])
            kept = [*(closed.undelivered or ()), *undelivered]
            ended = {**_end_values(end, run_id, last, now), "b_undelivered": kept or None}
            db.execute(q.END_RUN, ended)
            write_events(db, self._q, [*events, end_event], now)
        url = session.webhook_url or end.webhook_url
        if url is not None:
            # With the end, in its transaction: delivered at least once (workers.store.outbox).
            insert_delivery(db, delivery_id=str(uuid.uuid4()), run_id=run_id, url=url)
        generation = self._store_prefix(
            db, session_id, session.prefix_generation, status, end.prefix, end.refresh_prefix, now
        )
        # Only a turn submitted (or resumed) after this one can be runnable now.
        later = session.turn_count > end.position
        following = (
            self._claim_next(
                db,
                session,
                fence=fence,
                worker=end.worker,
                seq_floor=end.claim_next,
                known=end.known,
                head=_head_after(end, session.head_turn_id, generation),
            )
            if end.claim_next and later
            else None
        )
        return FinishReceipt(
            end_event=end_event,
            undelivered=undelivered,
            head_turn_id=session.head_turn_id,
            prefix_generation=generation,
            next_claim=following,
            later_turns=later,
        )

    def _finish_session(
        self,
        db: StoreConnection,
        session_id: str,
        fence: int,
        end: TurnEnd,
        tokens: int,
        now: datetime,
    ) -> SessionRow:
        """FINISH_SESSION: the session row as the turn's end leaves it; Fenced if stale."""
        session = db.execute(q.FINISH_SESSION, _finish_values(session_id, fence, end, tokens, now))
        row = session.one_or_none()
        if row is None:
            raise _stale(fence, end)
        return SessionRow.of(row)

    def _end_with_step(
        self,
        db: StoreConnection,
        run_id: str,
        session_id: str,
        fence: int,
        cursor: int,
        events: Sequence[Event],
        end: TurnEnd,
        now: datetime,
        step: tuple[int, StepPayload],
    ) -> SessionRow:
        """The session's, the run's and the step's writes of a turn that ends with its
        last step, and the events; returns the session row as they leave it."""
        index, payload = step
        usage = payload.usage
        ended = {
            **_end_values(end, run_id, cursor, now),
            "b_index": index,
            "b_input_tokens": usage.input_tokens,
            "b_output_tokens": usage.output_tokens,
            "b_cached_tokens": usage.cached_tokens,
        }
        durable = [e for e in events if e.kind.durable]
        fused = self._q.end_with_step(len(durable))
        if fused is None:
            session = self._finish_session(db, session_id, fence, end, usage.total, now)
            if db.execute(q.END_RUN_WITH_STEP, ended).rowcount != 1:
                raise _NotFinal
            self._insert_step(db, run_id, index, payload, now)
            write_events(db, self._q, durable, now)
            return session
        values = {
            **_finish_values(session_id, fence, end, usage.total, now),
            **ended,
            "b_payload": payload.to_json(),
        }
        for n, event in enumerate(durable):
            values.update((q.row_key(n, k), v) for k, v in event_row(event).items())
        row = db.execute(fused, values).one_or_none()
        if row is None:
            raise _stale(fence, end)
        if row.advanced != 1:
            raise _NotFinal
        return SessionRow.of(row)

    def _store_prefix(
        self,
        db: StoreConnection,
        session_id: str,
        generation: int,
        status: TurnStatus,
        prefix: Prefix | None,
        refresh: bool,
        now: datetime,
    ) -> int:
        """Freeze the first committed turn's prefix, or store an explicit refresh as a new
        generation (an identical refresh is a no-op).  Returns the generation in force."""
        if prefix is None or not status.moves_head:
            return generation
        if generation > 0 and (not refresh or self._prefix(db, session_id, generation) == prefix):
            return generation
        generation += 1
        db.execute(
            q.INSERT_PREFIX,
            {
                "session_id": session_id,
                "generation": generation,
                "payload": prefix.to_json(),
                "created_at": now,
            },
        )
        db.execute(q.SET_GENERATION, {"b_session_id": session_id, "b_generation": generation})
        return generation

    def _prefix(self, db: StoreConnection, session_id: str, generation: int) -> Prefix | None:
        if generation == 0:
            return None
        payload = db.execute(
            q.PREFIX, {"b_session_id": session_id, "b_generation": generation}
        ).scalar_one()
        return Prefix.from_json(payload)


def _stale(fence: int, end: TurnEnd) -> Fenced:
    return Fenced(f"fence {fence} is stale; turn {end.turn_id} not finished")


def _finish_values(
    session_id: str, fence: int, end: TurnEnd, tokens: int, now: datetime
) -> dict[str, Any]:
    """FINISH_SESSION's values: ``tokens`` are those of a step committed with the end, or
    of one thrown away (TurnEnd.discarded)."""
    return {
        "b_session_id": session_id,
        "b_fence": fence,
        "b_move_head": end.status.moves_head,
        "b_turn_id": end.turn_id,
        "b_tokens": tokens,
        "b_now": now,
    }


def _end_values(end: TurnEnd, run_id: str, cursor: int, now: datetime) -> dict[str, Any]:
    """END_RUN's values but ``undelivered`` (and END_RUN_WITH_STEP's, but for the
    step's)."""
    status = end.status
    return {
        "b_run_id": run_id,
        "b_status": status.value,
        "b_reply": end.reply if status.has_reply else None,
        "b_error": end.error,
        "b_partial": end.partial,
        "b_cursor": cursor,
        "b_now": now,
        "b_seq": end.end_seq,
    }


def _end_event(end: TurnEnd, undelivered: tuple[str, ...]) -> Event:
    """The ``end`` event of a turn ending as ``end`` says."""
    return Event.of(
        end.turn_id,
        end.end_seq,
        Ended(
            outcome=end.status.value,
            reply=end.reply,
            error=end.error,
            undelivered=undelivered,
            approvals=end.approvals,
        ),
    )


class _NotFinal(Exception):
    """A step asked to end its turn cannot: a steer is pending, or the run moved on.  Its
    transaction rolls back and the step commits on its own (which tells which)."""


@dataclass(frozen=True, kw_only=True)
class _Head:
    """The session as a turn's final transaction leaves it, for the claim of the next
    turn in the same transaction.  The session row was read before this transaction
    froze a first prefix, so the generation in force is carried here; and what the
    ending turn knows spares reading it back: the prefix of that generation and the
    path root → ``turn_id`` (each None when not known)."""

    turn_id: str | None
    generation: int
    prefix: Prefix | None
    path: tuple[TurnRecord, ...] | None


def _head_after(end: TurnEnd, head: str | None, generation: int) -> _Head:
    """What the claim after ``end`` may take as read; ``head`` and ``generation`` are as
    the ending transaction left them."""
    if not (end.status.moves_head and head == end.turn_id):
        return _Head(turn_id=head, generation=generation, prefix=None, path=None)
    # The turn now heads the session, and the prefix in force is the one it ran with: it
    # was frozen or refreshed just now, or was the frozen one already.
    path = None
    ancestors, last = end.path[:-1], end.path[-1] if end.path else None
    if (
        last is not None
        and last.turn_id == end.turn_id
        and all(t.status.settled for t in ancestors)
    ):
        # Parent links are set once and settled turns never change: the path its claim
        # read is still the path, with the turn itself at its outcome.
        reply = end.reply if end.status.has_reply else None
        path = (*ancestors, replace(last, status=end.status, reply=reply))
    return _Head(turn_id=head, generation=generation, prefix=end.prefix, path=path)
