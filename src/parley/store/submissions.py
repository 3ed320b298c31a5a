"""The store's side of submissions: a queued turn and its run, idempotent on a request
id, with what the session's busy policy asks of the turns before it (reject, or
interrupt them); and the resume of a cancelled or failed turn.

A submission's transaction holds the session row (it counts the turn on it), which every
driver's commit updates: it makes no call to anything but the database, so a slow
producer (or a slow Redis or broker behind it) cannot hold up a running turn."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from parley.schemas.errors import Conflict, SessionBusy, SessionNotFound, TurnEnded, TurnNotFound
from parley.schemas.events import Event, Queued
from parley.schemas.records import (
    IfBusy,
    Steer,
    SteerKind,
    TaskContract,
    TurnRecord,
    TurnStatus,
    Waiting,
)
from parley.store import statements as q
from parley.store.approvals import INTERRUPTED, Answered, ApprovalStore
from parley.store.clock import utc_now
from parley.store.connection import IntegrityConflict, StoreConnection, Transactions
from parley.store.ids import new_id
from parley.store.rows import read_session, read_turn, turn_record, write_events
from parley.store.session_titles import title_of_prompt
from parley.store.steering import SteerStore


@dataclass(frozen=True, kw_only=True)
class SubmitReceipt:
    """What ``submit_turn`` did."""

    turn: TurnRecord
    created: bool
    interrupted: tuple[tuple[str, Steer], ...]
    """The running turns of the session an ``interrupt`` submission stopped, each with
    the interrupt steer it accepted (to signal once the submission committed)."""
    queued: Event | None = None
    """The new turn's stored ``queued`` event (None for a repeated request)."""
    denied: tuple[Answered, ...] = ()
    """The pending calls an ``interrupt`` submission denied (of a turn that waited)."""


@dataclass(frozen=True, kw_only=True)
class _Submission:
    """What a submission asks for."""

    session_id: str
    prompt: str
    request_id: str | None
    contract: TaskContract | None
    if_busy: IfBusy
    host_context: dict[str, Any] | None
    priority: str
    trace_context: dict[str, str] | None
    not_before: datetime | None


class SubmissionStore:
    """Submitting and resuming turns (see the module docstring)."""

    def __init__(self, db: Transactions, approvals: ApprovalStore, steers: SteerStore) -> None:
        self._db = db
        self._approvals = approvals
        self._steers = steers

    def submit_turn(  # noqa: PLR0913 (every part of a submission, by keyword, as asked)
        self,
        *,
        session_id: str,
        prompt: str,
        request_id: str | None,
        contract: TaskContract | None,
        if_busy: IfBusy,
        host_context: dict[str, Any] | None = None,
        priority: str = "interactive",
        trace_context: dict[str, str] | None = None,
        not_before: datetime | None = None,
    ) -> SubmitReceipt:
        """Insert a queued turn and its run, idempotently on ``request_id``.
        ``trace_context`` is the submission's W3C trace context, stored with the run so
        that every attempt joins its trace (docs/operations.md#traces).  A turn with a
        ``not_before`` (an aware datetime) waits for that time, holding nothing, and the
        session's later turns wait behind it (docs/time.md#delayed-turns).

        The transaction holds the session row, which every driver's commit updates: it
        makes no call to anything but the database, so a slow producer (or a slow Redis
        or broker behind it) cannot hold up a running turn.  The caller publishes the
        receipt's ``queued`` event and kicks after the commit."""
        asked = _Submission(
            session_id=session_id,
            prompt=prompt,
            request_id=request_id,
            contract=contract,
            if_busy=if_busy,
            host_context=host_context,
            priority=priority,
            trace_context=trace_context,
            not_before=not_before,
        )
        try:
            return self._submit(asked)
        except IntegrityConflict:
            # Two submissions raced on one request_id: the loser returns the winner's turn.
            if request_id is None:
                raise
            with self._db.tx() as db:
                existing = self._by_request(db, session_id, request_id)
            if existing is None:
                raise
            return _existing(existing, prompt)

    def _submit(self, asked: _Submission) -> SubmitReceipt:
        now = utc_now()
        session_id = asked.session_id
        if asked.request_id is None and asked.if_busy is IfBusy.ENQUEUE:
            receipt = self._submit_plain(asked, now)
            if receipt is not None:
                return receipt
        with self._db.tx() as db:
            ordinal = self.count_turn(db, session_id, asked.prompt)
            if asked.request_id is not None:
                existing = self._by_request(db, session_id, asked.request_id)
                if existing is not None:
                    db.rollback()
                    return _existing(existing, asked.prompt)
            return self._queue(db, asked, ordinal, now)

    def _submit_plain(self, asked: _Submission, now: datetime) -> SubmitReceipt | None:
        """On PostgreSQL, a submission with nothing to look up first (no request id, no
        busy policy but to queue) as one statement on its own (``submit_plain``): one
        round trip instead of four.  None where there is no such statement, or when it
        violated a constraint (no such session: it changed nothing), for the
        transaction's path to say what is wrong."""
        statement = self._db.q.submit_plain
        if statement is None:
            return None
        record, queued = _new_turn(asked, now)
        binds = _submission_binds(asked, record, None, queued)  # (counted by the statement)
        binds["b_title"] = title_of_prompt(asked.prompt)
        self._db.count_transaction()
        try:
            with self._db.autocommit() as db:
                db.execute(statement, binds).scalar_one()
        except IntegrityConflict:
            return None
        return SubmitReceipt(turn=record, created=True, interrupted=(), queued=queued)

    def submit_within(
        self,
        db: StoreConnection,
        *,
        session_id: str,
        prompt: str,
        if_busy: IfBusy,
        priority: str,
        trace_context: dict[str, str] | None = None,
    ) -> SubmitReceipt:
        """A submission in the caller's transaction ``db``, without a request id: a
        schedule's firing, whose claim of its slot commits with the turn or not at all
        (docs/time.md#schedules).  :class:`SessionNotFound` if the session is gone."""
        asked = _Submission(
            session_id=session_id,
            prompt=prompt,
            request_id=None,
            contract=None,
            if_busy=if_busy,
            host_context=None,
            priority=priority,
            trace_context=trace_context,
            not_before=None,
        )
        ordinal = self.count_turn(db, session_id, prompt)
        return self._queue(db, asked, ordinal, utc_now())

    def _queue(
        self, db: StoreConnection, asked: _Submission, ordinal: int, now: datetime
    ) -> SubmitReceipt:
        """The submission's rows, once its turn is counted on its session (and, with a
        request id, found new), after what its busy policy asks of the turns before it."""
        session_id = asked.session_id
        interrupted, denied = self.make_way(db, session_id, asked.if_busy, now)
        record, queued = _new_turn(asked, now)
        self._insert_submission(db, _submission_binds(asked, record, ordinal, queued))
        return SubmitReceipt(
            turn=record,
            created=True,
            interrupted=tuple(interrupted),
            queued=queued,
            denied=tuple(denied),
        )

    def count_turn(self, db: StoreConnection, session_id: str, prompt: str) -> int:
        """Count the new turn on its session (its position), titling a session's first
        turn.  Incrementing the counter locks the session row: submissions of one session
        serialise here, which makes the busy check after it race-free."""
        ordinal = db.execute(q.BUMP_TURN_COUNT, {"b_session_id": session_id}).scalar_one_or_none()
        if ordinal is None:
            raise SessionNotFound(f"no session {session_id!r}")
        title = title_of_prompt(prompt) if ordinal == 1 else None
        if title is not None:
            db.execute(q.SET_TITLE_IF_NONE, {"b_session_id": session_id, "b_title": title})
        return int(ordinal)

    def make_way(
        self, db: StoreConnection, session_id: str, if_busy: IfBusy, now: datetime
    ) -> tuple[list[tuple[str, Steer]], list[Answered]]:
        """What ``if_busy`` asks of the session's unfinished turns: nothing (enqueue), to
        find none (reject: :class:`SessionBusy`), or to stop (interrupt: the interrupted
        turns with their steers, and the denials of those that waited)."""
        if if_busy is IfBusy.ENQUEUE:
            return [], []
        active = db.execute(q.ACTIVE_RUNS, {"b_session_id": session_id}).all()
        if active and if_busy is IfBusy.REJECT:
            raise SessionBusy(f"session {session_id!r} has {len(active)} turn(s) queued or running")
        if if_busy is not IfBusy.INTERRUPT:
            return [], []
        interrupted: list[tuple[str, Steer]] = []
        denied: list[Answered] = []
        for run in active:
            if run.status not in (q.RUNNING, q.WAITING):
                continue
            try:
                steer = self._steers.insert_steer(db, run.id, SteerKind.INTERRUPT, "", now)
            except TurnEnded:
                continue  # its inbox closed: it is committing its end already
            interrupted.append((run.turn_id, steer))
            answered = None
            if run.status == q.WAITING:
                answered = self._approvals.deny_pending(db, run.id, INTERRUPTED)
                # (its session is kicked for the new turn: the interrupted one comes first)
                self._steers.stop_waiting(db, run.id)
            if answered is not None:
                denied.append(answered)
        return interrupted, denied

    def _insert_submission(self, db: StoreConnection, binds: dict[str, Any]) -> None:
        """A submission's rows: its turn, its queued run, the run's ``queued`` event."""
        if self._db.q.insert_submission is not None:
            db.execute(self._db.q.insert_submission, binds)
            return
        for statement in (q.INSERT_TURN, q.INSERT_RUN, q.INSERT_QUEUED):
            db.execute(statement, binds)

    def _by_request(
        self, db: StoreConnection, session_id: str, request_id: str
    ) -> TurnRecord | None:
        row = db.execute(
            q.TURN_BY_REQUEST, {"b_session_id": session_id, "b_request_id": request_id}
        ).one_or_none()
        return None if row is None else turn_record(row)

    def resume_turn(self, turn_id: str, seq_floor: int) -> tuple[TurnRecord, Event | None]:
        """Queue a cancelled or failed turn again (same turn, same run).  A turn that is
        still queued or running is left as it is: resuming it only needs a driver."""
        now = utc_now()
        with self._db.tx() as db:
            session_id = db.execute(q.SESSION_OF_TURN, {"b_turn_id": turn_id}).scalar_one_or_none()
            if session_id is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            run, position = lock_for_resume(db, session_id, turn_id)
            if run.status in q.UNFINISHED:
                record = read_turn(db, turn_id)
                db.rollback()  # nothing to change: it only needs a driver (or answers)
                return record, None
            _check_resumable(db, session_id, turn_id, run.status)
            queued = requeue_ended(db, self._db.q, run, position, seq_floor, now)
            return read_turn(db, turn_id), queued


def lock_for_resume(db: StoreConnection, session_id: str, turn_id: str) -> tuple[Any, int]:
    """The run of ``turn_id``, locked to be resumed, and the place in its session's line
    the resume takes (counted on the session)."""
    # Session row first, then the run: the order every writer locks them in.
    position = db.execute(q.BUMP_TURN_COUNT, {"b_session_id": session_id}).scalar_one()
    run = db.execute(q.LOCK_RUN_BY_TURN, {"b_turn_id": turn_id}).one()
    return run, int(position)


def requeue_ended(
    db: StoreConnection, dialect: Any, run: Any, position: int, seq_floor: int, now: datetime
) -> Event:
    """Queue the ended ``run`` (from :func:`lock_for_resume`) again, with its ``queued``
    event (``resume``), stored.  A step it still holds (one that waited for its agent
    calls' children when an interrupt ended it: docs/sub-agents.md#6-control) is marked
    resumed, so that its driver resumes the children the interrupt cancelled."""
    seq = max(run.last_seq, seq_floor) + 1
    db.execute(
        q.RESUME_RUN,
        {"b_run_id": run.id, "b_now": now, "b_seq": seq, "b_position": position},
    )
    if run.held_step is not None:
        db.execute(
            q.SET_HELD_STEP, {"b_run_id": run.id, "b_held_step": {**run.held_step, "resumed": True}}
        )
    queued = Event.of(run.turn_id, seq, Queued(run_id=run.id, resume=True))
    write_events(db, dialect, [queued], now)
    return queued


def resumable(db: StoreConnection, session_id: str, turn_id: str, status: str) -> bool:
    """Whether the ended turn ``turn_id`` may be resumed (see :func:`_check_resumable`)."""
    try:
        _check_resumable(db, session_id, turn_id, status)
    except Conflict:
        return False
    return True


def _new_turn(asked: _Submission, now: datetime) -> tuple[TurnRecord, Event]:
    """The submission's new turn, as stored, and its run's ``queued`` event."""
    record = TurnRecord(
        turn_id=new_id(),
        session_id=asked.session_id,
        parent_id=None,
        prompt=asked.prompt,
        status=TurnStatus.QUEUED,
        reply=None,
        run_id=new_id(),
        request_id=asked.request_id,
        created_at=now,
        not_before=asked.not_before,
        waiting_for=None if asked.not_before is None else Waiting.TIME,
    )
    return record, Event.of(record.turn_id, 1, Queued(run_id=record.run_id))


def _submission_binds(
    asked: _Submission, record: TurnRecord, ordinal: int | None, queued: Event
) -> dict[str, Any]:
    """The binds the statements of a submission's rows share (``ordinal`` None: the
    statement counts the turn itself)."""
    binds: dict[str, Any] = {
        "b_turn_id": record.turn_id,
        "b_run_id": record.run_id,
        "b_session_id": asked.session_id,
        "b_prompt": asked.prompt,
        "b_request_id": asked.request_id,
        "b_contract": asked.contract.to_json() if asked.contract else None,
        "b_host_context": asked.host_context,
        "b_trace_context": asked.trace_context,
        "b_priority": asked.priority,
        "b_not_before": asked.not_before,
        "b_data": queued.data,
        "b_now": record.created_at,
    }
    if ordinal is not None:
        binds["b_position"] = ordinal
    return binds


def _existing(turn: TurnRecord, prompt: str) -> SubmitReceipt:
    if turn.prompt != prompt:
        raise Conflict(
            f"request_id {turn.request_id!r} was already used for another prompt "
            f"(turn {turn.turn_id})"
        )
    return SubmitReceipt(turn=turn, created=False, interrupted=())


def _check_resumable(db: StoreConnection, session_id: str, turn_id: str, status: str) -> None:
    """:class:`Conflict` unless the turn ``turn_id``, ended ``status``, may be resumed."""
    if status not in q.RESUMABLE:
        raise Conflict(
            f"turn {turn_id!r} ended {status}; only a cancelled or failed turn "
            "can be resumed (branch from it to go on)"
        )
    following = _following(db, session_id, read_turn(db, turn_id))
    if following is not None:
        raise Conflict(
            f"turn {turn_id!r} cannot be resumed while later turns follow it "
            f"({following}): its end would move the head back to it.  To go on "
            f"from it, branch_from({turn_id!r}) and submit a new turn"
        )


def _following(db: StoreConnection, session_id: str, turn: TurnRecord) -> str | None:
    """What follows ``turn``, an ended turn of ``session_id``, in its conversation, if
    anything does (None: resuming it drops no turn from the path).  A resumed turn moves
    the head to itself when it ends, so it may only be resumed while it is the last word:
    no turn hangs under it (whose history would change under it), none is still to run
    (it would run first, and hang under the head), and the head is the turn itself or,
    for a turn whose end left the head where it was, its parent."""
    child = db.execute(q.CHILD_OF_TURN, {"b_turn_id": turn.turn_id}).scalar_one_or_none()
    if child is not None:
        return f"turn {child!r} hangs under it"
    unfinished = db.execute(q.ACTIVE_RUNS, {"b_session_id": session_id}).all()
    if unfinished:
        return f"turn {unfinished[0].turn_id!r} is still to run ({unfinished[0].status})"
    head = read_session(db, session_id).head_turn_id
    if head not in (turn.turn_id, turn.parent_id):
        return f"the head has moved on to turn {head!r}"
    return None
