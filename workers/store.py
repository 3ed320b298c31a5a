"""The store: parley's durable state, one transaction per method.

The same code serves SQLite (embedded) and PostgreSQL (fleet); the SQL itself lives,
named, in :mod:`workers.statements`.  Concurrency rules:

* A session row is the lock for submissions and the fence for commits: every step and
  turn commit updates it ``WHERE fence = :fence``, so a driver whose token is stale
  changes nothing (:class:`Fenced`).
* A run row is the lock for its steer inbox: ``say`` and the inbox close both update it
  first, so a steer is either seen by the close (one more step) or refused (``TurnEnded``).
* Step inserts are ``ON CONFLICT DO NOTHING`` and guarded by ``runs.steps = :index``, so a
  commit retried after a cold shutdown can never write a step twice.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, Literal, TypeVar

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from schemas import tables as t
from schemas.errors import (
    Conflict,
    Fenced,
    ForeignTurn,
    InvalidRequest,
    ParleyError,
    SessionBusy,
    SessionNotFound,
    StoreError,
    TurnEnded,
    TurnNotFound,
)
from schemas.events import Ended, Event, EventKind, Queued, Started
from schemas.messages import Prefix, StepPayload
from schemas.records import (
    IfBusy,
    RunState,
    SessionRecord,
    Steer,
    SteerKind,
    TaskContract,
    TurnRecord,
    TurnResult,
    TurnStatus,
)
from workers import constants as c
from workers import statements as q
from workers.backend_ports import (
    Claim,
    ClaimedTurn,
    CommittedStep,
    FinishReceipt,
    KnownTurns,
    PathTurn,
    SeqFloor,
    StepReceipt,
    TurnEnd,
)
from workers.database import create_database_engine, transaction_lock
from workers.rows import run_state_of, session_record, turn_of_next_run, turn_record
from workers.store_connection import DirectStatements, StoreConnection, row_key

_T = TypeVar("_T")


def _now() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    """A fresh identifier for a session, turn or run."""
    return str(uuid.uuid4())


def validate_ids(*ids: str | None) -> None:
    """Reject ids that cannot be parley ids before any query runs."""
    for value in ids:
        if not isinstance(value, str) or not value or len(value) > 36:
            raise InvalidRequest(f"not a parley id: {value!r}")


class IntegrityConflict(StoreError):
    """A write violated a constraint (e.g. two submissions racing on one request_id)."""


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


class SqlStore:
    """parley's durable state on SQLite or PostgreSQL (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = transaction_lock(engine)
        self._q = q.DialectStatements(engine.dialect.name)
        postgres = engine.dialect.name == "postgresql"
        self._direct = DirectStatements(engine.dialect) if postgres else None
        self.transactions = 0  # counted for logs and benchmarks: the process's, and
        self._thread = threading.local()  # each thread's (a driver's, on a threads pool)

    @classmethod
    def from_url(cls, url: str) -> SqlStore:
        """A store on a new engine for ``url``."""
        return cls(create_database_engine(url))

    def close(self) -> None:
        """Release every pooled connection."""
        self.engine.dispose()

    @property
    def thread_transactions(self) -> int:
        """How many transactions the calling thread has begun (:attr:`transactions`
        counts the whole process's)."""
        count: int = getattr(self._thread, "transactions", 0)
        return count

    def _count_transaction(self) -> None:
        self.transactions += 1
        self._thread.transactions = self.thread_transactions + 1

    @contextmanager
    def _tx(self) -> Iterator[StoreConnection]:
        """One transaction; driver errors become :class:`StoreError`."""
        if self._lock is not None:
            self._lock.acquire()
        self._count_transaction()
        try:
            with _store_errors(), self.engine.begin() as connection:
                yield StoreConnection(connection, self._direct)
        finally:
            if self._lock is not None:
                self._lock.release()

    def _reading(self, read: Callable[[StoreConnection], _T]) -> _T:
        """Run ``read``, whose statements need no snapshot shared between them: on
        PostgreSQL each runs on its own (autocommit), sparing a ``BEGIN`` and a ``COMMIT``
        round trip per call, which readers polling a turn pay often.  SQLite reads in a
        transaction."""
        if self._lock is not None:
            with self._tx() as db:
                return read(db)
        try:
            return self._read_once(read)
        except StoreError as exc:
            if not _dropped(exc):
                raise
        # The server dropped the pooled connection just before it was checked out (its
        # goodbye not yet on the socket, so the checkout's look missed it).  SQLAlchemy
        # has discarded it and every connection pooled before; a read changes nothing,
        # so it runs once more on a fresh connection.
        return self._read_once(read)

    def _read_once(self, read: Callable[[StoreConnection], _T]) -> _T:
        with self._autocommit() as db:
            return read(db)

    @contextmanager
    def _autocommit(self) -> Iterator[StoreConnection]:
        """A PostgreSQL connection on which each statement commits on its own."""
        with (
            _store_errors(),
            self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as db,
        ):
            yield StoreConnection(db, self._direct)

    # ------------------------------------------------------------------ sessions

    def create_session(
        self, *, root: str, metadata: dict[str, Any], token_ceiling: int | None
    ) -> SessionRecord:
        """Insert a new session with an empty tree."""
        record = SessionRecord(
            session_id=new_id(),
            root=root,
            metadata=metadata,
            head_turn_id=None,
            token_ceiling=token_ceiling,
            tokens_used=0,
            created_at=_now(),
        )
        with self._tx() as db:
            db.execute(
                q.INSERT_SESSION,
                {
                    "id": record.session_id,
                    "root": root,
                    "metadata": metadata,
                    "head_turn_id": None,
                    "fence": 0,
                    "turn_count": 0,
                    "tokens_used": 0,
                    "token_ceiling": token_ceiling,
                    "prefix_generation": 0,
                    "created_at": record.created_at,
                },
            )
        return record

    def get_session(self, session_id: str) -> SessionRecord:
        """The stored session; :class:`SessionNotFound` if unknown."""
        return self._reading(lambda db: self._session(db, session_id))

    def _session(self, db: StoreConnection, session_id: str) -> SessionRecord:
        row = db.execute(q.SESSION, {"b_session_id": session_id}).one_or_none()
        if row is None:
            raise SessionNotFound(f"no session {session_id!r}")
        return session_record(row)

    def branch(self, session_id: str, turn_id: str) -> None:
        """Move the session's head to ``turn_id`` (one write; nothing else changes).

        The turn must have started: a turn takes its place in the tree, under the head
        of that moment, when it first starts, so a head that never started would become
        its own parent, or the parent of turns queued before it (a cycle).  Started is
        for good, so no lock is needed: a turn starting meanwhile is merely refused."""
        with self._tx() as db:
            self._session(db, session_id)
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
            db.execute(q.SET_HEAD, {"b_session_id": session_id, "b_head": turn_id})

    def history(self, session_id: str) -> list[TurnRecord]:
        """The path root → head."""
        with self._tx() as db:
            return self._path(db, self._session(db, session_id).head_turn_id)

    def tree(self, session_id: str) -> list[TurnRecord]:
        """Every turn of every branch, in submission order."""

        def read(db: StoreConnection) -> list[TurnRecord]:
            self._session(db, session_id)
            return [turn_record(row) for row in db.execute(q.TREE, {"b_session_id": session_id})]

        return self._reading(read)

    def _path(self, db: StoreConnection, head: str | None) -> list[TurnRecord]:
        if head is None:
            return []
        return [turn_record(row) for row in db.execute(q.PATH, {"b_head": head}).all()]

    # ------------------------------------------------------------------ turns

    def get_turn(self, turn_id: str) -> TurnRecord:
        """One turn; :class:`TurnNotFound` if unknown."""
        return self._reading(lambda db: self._turn(db, turn_id))

    def _turn(self, db: StoreConnection, turn_id: str) -> TurnRecord:
        row = db.execute(q.TURN, {"b_turn_id": turn_id}).one_or_none()
        if row is None:
            raise TurnNotFound(f"no turn {turn_id!r}")
        return turn_record(row)

    def submit_turn(
        self,
        *,
        session_id: str,
        prompt: str,
        request_id: str | None,
        contract: TaskContract | None,
        if_busy: IfBusy,
    ) -> SubmitReceipt:
        """Insert a queued turn and its run, idempotently on ``request_id``.

        The transaction holds the session row, which every driver's commit updates: it
        makes no call to anything but the database, so a slow producer (or a slow Redis
        or broker behind it) cannot hold up a running turn.  The caller publishes the
        receipt's ``queued`` event and kicks after the commit."""
        try:
            return self._submit(session_id, prompt, request_id, contract, if_busy)
        except IntegrityConflict:
            # Two submissions raced on one request_id: the loser returns the winner's turn.
            if request_id is None:
                raise
            with self._tx() as db:
                existing = self._by_request(db, session_id, request_id)
            if existing is None:
                raise
            return _existing(existing, prompt)

    def _submit(
        self,
        session_id: str,
        prompt: str,
        request_id: str | None,
        contract: TaskContract | None,
        if_busy: IfBusy,
    ) -> SubmitReceipt:
        now = _now()
        with self._tx() as db:
            # Incrementing the counter locks the session row: submissions of one
            # session serialise here, which makes the busy check below race-free.
            ordinal = db.execute(
                q.BUMP_TURN_COUNT, {"b_session_id": session_id}
            ).scalar_one_or_none()
            if ordinal is None:
                raise SessionNotFound(f"no session {session_id!r}")
            if request_id is not None:
                existing = self._by_request(db, session_id, request_id)
                if existing is not None:
                    db.rollback()
                    return _existing(existing, prompt)
            active = (
                db.execute(q.ACTIVE_RUNS, {"b_session_id": session_id}).all()
                if if_busy is not IfBusy.ENQUEUE
                else []
            )
            if active and if_busy is IfBusy.REJECT:
                raise SessionBusy(
                    f"session {session_id!r} has {len(active)} turn(s) queued or running"
                )
            interrupted: list[tuple[str, Steer]] = []
            if if_busy is IfBusy.INTERRUPT:
                for run in active:
                    if run.status != q.RUNNING:
                        continue
                    try:
                        steer = self._add_steer(db, run.id, SteerKind.INTERRUPT, "", now)
                    except TurnEnded:
                        continue  # its inbox closed: it is committing its end already
                    interrupted.append((run.turn_id, steer))
            record = TurnRecord(
                turn_id=new_id(),
                session_id=session_id,
                parent_id=None,
                prompt=prompt,
                status=TurnStatus.QUEUED,
                reply=None,
                run_id=new_id(),
                request_id=request_id,
                created_at=now,
            )
            queued = Event.of(record.turn_id, 1, Queued(run_id=record.run_id))
            rows = {
                "b_turn_id": record.turn_id,
                "b_run_id": record.run_id,
                "b_session_id": session_id,
                "b_position": ordinal,
                "b_prompt": prompt,
                "b_request_id": request_id,
                "b_contract": contract.to_json() if contract else None,
                "b_data": queued.data,
                "b_now": now,
            }
            if self._q.insert_submission is not None:
                db.execute(self._q.insert_submission, rows)
            else:
                for statement in (q.INSERT_TURN, q.INSERT_RUN, q.INSERT_QUEUED):
                    db.execute(statement, rows)
        return SubmitReceipt(
            turn=record, created=True, interrupted=tuple(interrupted), queued=queued
        )

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
        now = _now()
        with self._tx() as db:
            session_id = db.execute(q.SESSION_OF_TURN, {"b_turn_id": turn_id}).scalar_one_or_none()
            if session_id is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            # Session row first, then the run: the order every writer locks them in.
            position = db.execute(q.BUMP_TURN_COUNT, {"b_session_id": session_id}).scalar_one()
            run = db.execute(q.LOCK_RUN_BY_TURN, {"b_turn_id": turn_id}).one()
            if run.status in q.ACTIVE:
                record = self._turn(db, turn_id)
                db.rollback()  # nothing to change: it only needs a driver
                return record, None
            if run.status not in q.RESUMABLE:
                raise Conflict(
                    f"turn {turn_id!r} ended {run.status}; only a cancelled or failed turn "
                    "can be resumed (branch from it to go on)"
                )
            seq = max(run.last_seq, seq_floor) + 1
            db.execute(
                q.RESUME_RUN,
                {"b_run_id": run.id, "b_now": now, "b_seq": seq, "b_position": position},
            )
            queued = Event.of(turn_id, seq, Queued(run_id=run.id, resume=True))
            self._insert_events(db, [queued], now)
            return self._turn(db, turn_id), queued

    def turn_result(self, turn_id: str) -> TurnResult | None:
        """The result of an ended turn (None while it is queued or running)."""
        state = self.run_state(turn_id)
        if not state.status.terminal:
            return None
        return TurnResult(
            turn_id=turn_id,
            run_id=state.run_id,
            outcome=state.status,
            reply=state.reply,
            steps=state.steps,
            usage=state.usage,
            error=state.error,
            undelivered=state.undelivered,
            partial=state.partial,
        )

    def run_state(self, turn_id: str) -> RunState:
        """The execution record of a turn."""
        run = self._reading(
            lambda db: db.execute(q.RUN_BY_TURN, {"b_turn_id": turn_id}).one_or_none()
        )
        if run is None:
            raise TurnNotFound(f"no turn {turn_id!r}")
        return run_state_of(run)

    def steps_of(self, turn_id: str) -> list[CommittedStep]:
        """The committed steps of a turn, in order."""

        def read(db: StoreConnection) -> list[CommittedStep]:
            run_id = db.execute(q.RUN_ID_OF_TURN, {"b_turn_id": turn_id}).scalar_one_or_none()
            if run_id is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            return self._steps(db, [run_id]).get(run_id, [])

        return self._reading(read)

    def _steps(self, db: StoreConnection, run_ids: Sequence[str]) -> dict[str, list[CommittedStep]]:
        found: dict[str, list[CommittedStep]] = {}
        if not run_ids:
            return found
        for row in db.execute(q.STEPS_OF_RUNS, {"b_run_ids": list(run_ids)}).all():
            found.setdefault(row.run_id, []).append(
                CommittedStep(index=row.step_index, payload=StepPayload.from_json(row.payload))
            )
        return found

    # ------------------------------------------------------------------ steering

    def add_steer(self, turn_id: str, kind: SteerKind, text: str) -> Steer:
        """Accept a steer into a turn's inbox; :class:`TurnEnded` once the turn ended."""
        with self._tx() as db:
            run_id = db.execute(q.RUN_ID_OF_TURN, {"b_turn_id": turn_id}).scalar_one_or_none()
            if run_id is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            return self._add_steer(db, run_id, kind, text, _now())

    def _add_steer(
        self, db: StoreConnection, run_id: str, kind: SteerKind, text: str, now: datetime
    ) -> Steer:
        position = db.execute(q.COUNT_STEER, {"b_run_id": run_id}).scalar_one_or_none()
        if position is None:
            status = db.execute(q.RUN_STATUS, {"b_run_id": run_id}).scalar_one()
            raise TurnEnded(f"the turn has ended ({status}); the steer was not delivered")
        db.execute(
            q.INSERT_STEER,
            {
                "run_id": run_id,
                "position": position,
                "kind": kind.value,
                "text": text,
                "created_at": now,
            },
        )
        return Steer(position=position, kind=kind, text=text)

    def pending_steers(self, run_id: str, cursor: int) -> tuple[Steer, ...]:
        """The steers of a run accepted after ``cursor``."""
        return self._reading(lambda db: self._pending(db, run_id, cursor))

    def _pending(self, db: StoreConnection, run_id: str, cursor: int) -> tuple[Steer, ...]:
        rows = db.execute(q.PENDING_STEERS, {"b_run_id": run_id, "b_cursor": cursor}).all()
        return tuple(Steer(position=r.position, kind=SteerKind(r.kind), text=r.text) for r in rows)

    # ------------------------------------------------------------------ driving

    def sessions_with_work(self) -> list[str]:
        """Sessions that have a queued or running turn (for sweepers and startup)."""
        return self._reading(lambda db: list(db.execute(q.SESSIONS_WITH_WORK).scalars()))

    def _check_fence(self, db: StoreConnection, session_id: str, fence: int) -> Any:
        """Lock the session row and return it if ``fence`` still holds; else Fenced."""
        row = db.execute(q.LOCK_SESSION, {"b_session_id": session_id}).one_or_none()
        if row is None or row.fence != fence:
            raise Fenced(f"fence {fence} is stale (now {row.fence if row else None})")
        return row

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
                return fence, self._claim_next(db, locked, fence, worker, seq_floor, known)
        with self._tx() as db:
            session = db.execute(q.TAKE_FENCE, {"b_session_id": session_id}).one_or_none()
            if session is None:
                raise SessionNotFound(f"no session {session_id!r}")
            fence = int(session.fence)
            return fence, self._claim_next(db, session, fence, worker, seq_floor, known)

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
            session = SimpleNamespace(**{name: values[name] for name in q.SESSION_COLUMNS})
            fence = int(session.fence)
            if not values["claimed"]:
                missed = values[q.RUN_PREFIX + "id"] is None and session.turn_count != row.seen
                return fence, (False if missed or values[q.RUN_PREFIX + "id"] else None)
            width = len(q.RUN_PREFIX)
            run = SimpleNamespace(
                **{k[width:]: v for k, v in values.items() if k.startswith(q.RUN_PREFIX)}
            )
            claim = self._claim(
                db, run, worker, 0, session, turn_of_next_run(run), known, None, now, True
            )
            return fence, claim

    def _claim_next(
        self,
        db: StoreConnection,
        session: Any,
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
        if run is None:
            return None
        turn = turn_of_next_run(run)
        # A first attempt needs no adoption: no driver ever published for it, and the
        # buffer can hold nothing above the stored ``queued`` event.
        floor = seq_floor(run.turn_id, fence) if run.attempts else 0
        if run.status == q.RUNNING:
            # Cut off mid-turn: how far it published past its last commit, readers may
            # know better than a buffer that lost its tail (a flush, a failover).
            floor = max(floor, run.last_seq + c.TAKEOVER_SEQ_GAP)
        written = bool(getattr(run, "claimed", False))  # (NEXT_RUN has no such column)
        return self._claim(db, run, worker, floor, session, turn, known, head, now, written)

    def _claim(
        self,
        db: StoreConnection,
        run: Any,
        worker: str,
        seq_floor: int,
        row: Any,
        turn: TurnRecord,
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
            self._insert_events(db, [started], now)
        generation = head.generation if head else int(row.prefix_generation)
        if head and head.path is not None and turn.parent_id == head.turn_id:
            path = list(head.path)
        else:
            path = self._path(db, turn.parent_id)
        skipped = {p.turn_id for p in path if known(p.turn_id)} if known else set()
        run_ids = [p.run_id for p in path if p.turn_id not in skipped]
        steps = self._steps(db, run_ids + ([run.id] if run.steps else []))
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
                for s in self._pending(db, run.id, run.steer_cursor)
                if s.position <= run.steer_count
            )
            if run.steer_count > run.steer_cursor
            else (),
            previous_status=run.status,
            next_seq=seq + 1,
        )
        return claimed, started

    def _prefix(self, db: StoreConnection, session_id: str, generation: int) -> Prefix | None:
        if generation == 0:
            return None
        payload = db.execute(
            q.PREFIX, {"b_session_id": session_id, "b_generation": generation}
        ).scalar_one()
        return Prefix.from_json(payload)

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
            self._insert_events(db, events, now)
            # Nothing pending: if asked, the inbox is closed.  Pending steers are read at
            # the next boundary, from the turn's steer list where it has them all.
            return StepReceipt(steer_count=int(steer_count))

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
            pending = self._pending(db, run_id, cursor)
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
            session = self._finish_session(db, session_id, fence, end, discarded.total)
            steer_count = db.execute(q.CLOSE_RUNNING, {"b_run_id": run_id}).scalar_one_or_none()
            if steer_count is None:
                raise Fenced(f"run {run_id} is no longer running; not finished")
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
            pending = self._pending(db, run_id, cursor) if steer_count > cursor else ()
            undelivered = tuple(s.text for s in pending if s.kind is SteerKind.SAY)
            end_event = _end_event(end, undelivered)
            last = max([cursor] + [s.position for s in pending])
            ended = _end_values(end, run_id, last, now, undelivered)
            db.execute(q.END_RUN, ended)
            self._insert_events(db, [*events, end_event], now)
        generation = self._store_prefix(
            db, session_id, session.prefix_generation, status, end.prefix, end.refresh_prefix, now
        )
        # Only a turn submitted (or resumed) after this one can be runnable now.
        later = session.turn_count > end.position
        following = (
            self._claim_next(
                db,
                session,
                fence,
                end.worker,
                end.claim_next,
                end.known,
                _head_after(end, session.head_turn_id, generation),
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
        self, db: StoreConnection, session_id: str, fence: int, end: TurnEnd, tokens: int
    ) -> Any:
        """FINISH_SESSION: the session row as the turn's end leaves it; Fenced if stale."""
        session = db.execute(q.FINISH_SESSION, _finish_values(session_id, fence, end, tokens))
        row = session.one_or_none()
        if row is None:
            raise _stale(fence, end)
        return row

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
    ) -> Any:
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
            session = self._finish_session(db, session_id, fence, end, usage.total)
            if db.execute(q.END_RUN_WITH_STEP, ended).rowcount != 1:
                raise _NotFinal
            self._insert_step(db, run_id, index, payload, now)
            self._insert_events(db, durable, now)
            return session
        values = {
            **_finish_values(session_id, fence, end, usage.total),
            **ended,
            "b_payload": payload.to_json(),
        }
        for n, event in enumerate(durable):
            values.update((row_key(n, k), v) for k, v in _event_row(event).items())
        row = db.execute(fused, values).one_or_none()
        if row is None:
            raise _stale(fence, end)
        if row.advanced != 1:
            raise _NotFinal
        return row

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

    # ------------------------------------------------------------------ events

    def _insert_events(self, db: StoreConnection, events: Sequence[Event], now: datetime) -> None:
        durable = [{**_event_row(e), "created_at": now} for e in events if e.kind.durable]
        if durable:
            db.execute(self._q.insert_events, durable)

    def events_after(self, turn_id: str, seq: int) -> list[Event]:
        """The durable events of a turn with ``seq`` greater than the one given."""
        rows = self._reading(
            lambda db: db.execute(q.EVENTS_AFTER, {"b_turn_id": turn_id, "b_seq": seq}).all()
        )
        return [
            Event(turn_id=turn_id, seq=r.seq, kind=EventKind(r.kind), data=dict(r.data))
            for r in rows
        ]

    def last_event_seq(self, turn_id: str) -> int:
        """The newest durable seq of a turn (0 if it has none)."""
        seq = self._reading(
            lambda db: db.execute(q.LAST_EVENT_SEQ, {"b_turn_id": turn_id}).scalar_one()
        )
        return int(seq or 0)

    # ------------------------------------------------------------------ sizes

    def table_counts(self) -> dict[str, int]:
        """Row counts per table (for benchmarks and storage checks)."""
        with self._tx() as db:
            return {
                table.name: int(db.execute(select(func.count()).select_from(table)).scalar_one())
                for table in t.metadata.sorted_tables
            }


def _dropped(error: StoreError) -> bool:
    """Whether ``error`` came of a connection the server had dropped."""
    cause = error.__cause__
    return isinstance(cause, DBAPIError) and bool(cause.connection_invalidated)


def _event_row(event: Event) -> dict[str, Any]:
    """An event's row, but ``created_at`` (see ``statements.EVENT_COLUMNS``)."""
    return {
        "turn_id": event.turn_id,
        "seq": event.seq,
        "kind": event.kind.value,
        "data": event.data,
    }


def _stale(fence: int, end: TurnEnd) -> Fenced:
    return Fenced(f"fence {fence} is stale; turn {end.turn_id} not finished")


def _finish_values(session_id: str, fence: int, end: TurnEnd, tokens: int) -> dict[str, Any]:
    """FINISH_SESSION's values: ``tokens`` are those of a step committed with the end, or
    of one thrown away (TurnEnd.discarded)."""
    return {
        "b_session_id": session_id,
        "b_fence": fence,
        "b_move_head": end.status.moves_head,
        "b_turn_id": end.turn_id,
        "b_tokens": tokens,
    }


def _end_values(
    end: TurnEnd, run_id: str, cursor: int, now: datetime, undelivered: tuple[str, ...] = ()
) -> dict[str, Any]:
    """END_RUN's values (and END_RUN_WITH_STEP's, but for the step's)."""
    status = end.status
    return {
        "b_run_id": run_id,
        "b_status": status.value,
        "b_reply": end.reply if status.has_reply else None,
        "b_error": end.error,
        "b_partial": end.partial,
        "b_undelivered": list(undelivered) or None,
        "b_cursor": cursor,
        "b_now": now,
        "b_seq": end.end_seq,
    }


def _end_event(end: TurnEnd, undelivered: tuple[str, ...]) -> Event:
    """The ``end`` event of a turn ending as ``end`` says."""
    return Event.of(
        end.turn_id,
        end.end_seq,
        Ended(outcome=end.status.value, reply=end.reply, error=end.error, undelivered=undelivered),
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


@contextmanager
def _store_errors() -> Iterator[None]:
    """Driver errors become :class:`StoreError` (a violated constraint the subclass
    :class:`IntegrityConflict`); parley's own errors pass through."""
    try:
        yield
    except ParleyError:
        raise
    except IntegrityError as exc:
        raise IntegrityConflict(f"constraint violated: {exc.orig}") from exc
    except SQLAlchemyError as exc:
        raise StoreError(f"database error: {exc.__class__.__name__}: {exc}") from exc


def _existing(turn: TurnRecord, prompt: str) -> SubmitReceipt:
    if turn.prompt != prompt:
        raise Conflict(
            f"request_id {turn.request_id!r} was already used for another prompt "
            f"(turn {turn.turn_id})"
        )
    return SubmitReceipt(turn=turn, created=False, interrupted=())
