"""The store: every SQL statement parley runs, one transaction per method.

The same code serves SQLite (embedded) and PostgreSQL (fleet).  Concurrency rules:

* A session row is the lock for submissions and the fence for commits: every step and
  turn commit updates it ``WHERE fence = :fence``, so a driver whose token is stale
  changes nothing (:class:`Fenced`).
* A run row is the lock for its steer inbox: ``say`` and the inbox close both update it
  first, so a steer is either seen by the close (one more step) or refused (``TurnEnded``).
* Step inserts are ``ON CONFLICT DO NOTHING`` and guarded by ``runs.steps = :index``, so a
  commit retried after a cold shutdown can never write a step twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, case, func, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

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
from schemas.events import Event, EventKind
from schemas.messages import Prefix, StepPayload
from schemas.records import (
    Contract,
    IfBusy,
    RunState,
    SessionRecord,
    Steer,
    SteerKind,
    TurnRecord,
    TurnResult,
    TurnStatus,
    Usage,
)
from workers.database import create_database_engine, transaction_lock
from workers.ports import ClaimedTurn, CommittedStep, PathTurn

ACTIVE = (TurnStatus.QUEUED.value, TurnStatus.RUNNING.value)
RESUMABLE = (TurnStatus.CANCELLED.value, TurnStatus.FAILED.value)


def _now() -> datetime:
    return datetime.now(UTC)


def _aware(value: datetime) -> datetime:
    # SQLite hands timestamps back naive; everything parley stores is UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def new_id() -> str:
    """A fresh identifier for a session, turn or run."""
    return str(uuid.uuid4())


class IntegrityConflict(StoreError):
    """A write violated a constraint (e.g. two submissions racing on one request_id)."""


@dataclass(frozen=True, kw_only=True)
class SubmitReceipt:
    """What ``submit_turn`` did."""

    turn: TurnRecord
    created: bool
    queued_event: Event | None
    interrupted_turn_ids: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class FinishReceipt:
    """What ``finish_turn`` committed."""

    end_event: Event
    undelivered: tuple[str, ...]
    head_turn_id: str | None
    prefix_generation: int


class SqlStore:
    """parley's durable state on SQLite or PostgreSQL (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = transaction_lock(engine)
        dialect = engine.dialect.name
        self._insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        self._lock_rows = dialect == "postgresql"

    @classmethod
    def from_url(cls, url: str) -> SqlStore:
        """A store on a new engine for ``url``."""
        return cls(create_database_engine(url))

    def close(self) -> None:
        """Release every pooled connection."""
        self.engine.dispose()

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        """One transaction; driver errors become :class:`StoreError`."""
        if self._lock is not None:
            self._lock.acquire()
        try:
            with self.engine.begin() as connection:
                yield connection
        except ParleyError:
            raise
        except IntegrityError as exc:
            raise IntegrityConflict(f"constraint violated: {exc.orig}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"database error: {exc.__class__.__name__}: {exc}") from exc
        finally:
            if self._lock is not None:
                self._lock.release()

    def _for_update(self, statement: Any) -> Any:
        # SQLite serialises writers with BEGIN IMMEDIATE; PostgreSQL needs row locks.
        return statement.with_for_update() if self._lock_rows else statement

    # ------------------------------------------------------------------ sessions

    def create_session(
        self, *, root: str, metadata: dict[str, Any], token_ceiling: int | None
    ) -> SessionRecord:
        """Insert a new session with an empty tree."""
        session_id = new_id()
        now = _now()
        with self._tx() as db:
            db.execute(
                t.sessions.insert().values(
                    id=session_id,
                    root=root,
                    metadata=metadata,
                    head_turn_id=None,
                    fence=0,
                    turn_count=0,
                    tokens_used=0,
                    token_ceiling=token_ceiling,
                    prefix_generation=0,
                    created_at=now,
                )
            )
        return SessionRecord(
            session_id=session_id,
            root=root,
            metadata=metadata,
            head_turn_id=None,
            token_ceiling=token_ceiling,
            tokens_used=0,
            created_at=now,
        )

    def get_session(self, session_id: str) -> SessionRecord:
        """The stored session; :class:`SessionNotFound` if unknown."""
        with self._tx() as db:
            return self._session(db, session_id)

    def _session(self, db: Connection, session_id: str) -> SessionRecord:
        row = db.execute(select(t.sessions).where(t.sessions.c.id == session_id)).one_or_none()
        if row is None:
            raise SessionNotFound(f"no session {session_id!r}")
        return SessionRecord(
            session_id=row.id,
            root=row.root,
            metadata=dict(row.metadata),
            head_turn_id=row.head_turn_id,
            token_ceiling=row.token_ceiling,
            tokens_used=row.tokens_used,
            created_at=_aware(row.created_at),
        )

    def branch(self, session_id: str, turn_id: str) -> None:
        """Move the session's head to ``turn_id`` (one write; nothing else changes)."""
        with self._tx() as db:
            self._session(db, session_id)
            owner = db.execute(
                select(t.turns.c.session_id).where(t.turns.c.id == turn_id)
            ).scalar_one_or_none()
            if owner is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            if owner != session_id:
                raise ForeignTurn(f"turn {turn_id!r} belongs to another session")
            db.execute(
                update(t.sessions).where(t.sessions.c.id == session_id).values(head_turn_id=turn_id)
            )

    def history(self, session_id: str) -> list[TurnRecord]:
        """The path root → head."""
        with self._tx() as db:
            session = self._session(db, session_id)
            return self._path(db, session.head_turn_id)

    def tree(self, session_id: str) -> list[TurnRecord]:
        """Every turn of every branch, in submission order."""
        with self._tx() as db:
            self._session(db, session_id)
            rows = db.execute(
                self._turn_select()
                .where(t.turns.c.session_id == session_id)
                .order_by(t.turns.c.ordinal)
            ).all()
            return [self._turn_record(row) for row in rows]

    def _path(self, db: Connection, head: str | None) -> list[TurnRecord]:
        if head is None:
            return []
        # Walk parent links in one recursive query (same SQL on SQLite and PostgreSQL).
        walk = (
            select(t.turns.c.id, t.turns.c.parent_id, literal(0).label("depth"))
            .where(t.turns.c.id == head)
            .cte("walk", recursive=True)
        )
        walk = walk.union_all(
            select(t.turns.c.id, t.turns.c.parent_id, (walk.c.depth + 1).label("depth")).where(
                t.turns.c.id == walk.c.parent_id
            )
        )
        rows = db.execute(
            self._turn_select().join(walk, walk.c.id == t.turns.c.id).order_by(walk.c.depth.desc())
        ).all()
        return [self._turn_record(row) for row in rows]

    # ------------------------------------------------------------------ turns

    @staticmethod
    def _turn_select() -> Any:
        return select(
            t.turns.c.id,
            t.turns.c.session_id,
            t.turns.c.parent_id,
            t.turns.c.prompt,
            t.turns.c.request_id,
            t.turns.c.created_at,
            t.runs.c.id.label("run_id"),
            t.runs.c.status,
            t.runs.c.reply,
        ).join(t.runs, t.runs.c.turn_id == t.turns.c.id)

    @staticmethod
    def _turn_record(row: Any) -> TurnRecord:
        return TurnRecord(
            turn_id=row.id,
            session_id=row.session_id,
            parent_id=row.parent_id,
            prompt=row.prompt,
            status=TurnStatus(row.status),
            reply=row.reply,
            run_id=row.run_id,
            request_id=row.request_id,
            created_at=_aware(row.created_at),
        )

    def get_turn(self, turn_id: str) -> TurnRecord:
        """One turn; :class:`TurnNotFound` if unknown."""
        with self._tx() as db:
            return self._turn(db, turn_id)

    def _turn(self, db: Connection, turn_id: str) -> TurnRecord:
        row = db.execute(self._turn_select().where(t.turns.c.id == turn_id)).one_or_none()
        if row is None:
            raise TurnNotFound(f"no turn {turn_id!r}")
        return self._turn_record(row)

    def submit_turn(
        self,
        *,
        session_id: str,
        prompt: str,
        request_id: str | None,
        contract: Contract | None,
        if_busy: IfBusy,
    ) -> SubmitReceipt:
        """Insert a queued turn and its run, idempotently on ``request_id``."""
        try:
            return self._submit(session_id, prompt, request_id, contract, if_busy)
        except IntegrityConflict:
            # Two submissions raced on one request_id: the loser returns the winner's turn.
            if request_id is None:
                raise StoreError("turn insert conflicted without a request_id") from None
            with self._tx() as db:
                existing = self._by_request(db, session_id, request_id)
            if existing is None:
                raise StoreError("turn insert conflicted, then vanished") from None
            return self._existing(existing, prompt)

    def _submit(
        self,
        session_id: str,
        prompt: str,
        request_id: str | None,
        contract: Contract | None,
        if_busy: IfBusy,
    ) -> SubmitReceipt:
        now = _now()
        with self._tx() as db:
            # Incrementing the counter locks the session row: submissions of one
            # session serialise here, which makes the busy check below race-free.
            ordinal = db.execute(
                update(t.sessions)
                .where(t.sessions.c.id == session_id)
                .values(turn_count=t.sessions.c.turn_count + 1)
                .returning(t.sessions.c.turn_count)
            ).scalar_one_or_none()
            if ordinal is None:
                raise SessionNotFound(f"no session {session_id!r}")
            if request_id is not None:
                existing = self._by_request(db, session_id, request_id)
                if existing is not None:
                    db.rollback()
                    return self._existing(existing, prompt)
            active = db.execute(
                select(t.runs.c.id, t.runs.c.turn_id, t.runs.c.status).where(
                    t.runs.c.session_id == session_id, t.runs.c.status.in_(ACTIVE)
                )
            ).all()
            if active and if_busy is IfBusy.REJECT:
                raise SessionBusy(
                    f"session {session_id!r} has {len(active)} turn(s) queued or running"
                )
            interrupted: list[str] = []
            if if_busy is IfBusy.INTERRUPT:
                for run in active:
                    if run.status == TurnStatus.RUNNING.value:
                        self._add_steer(db, run.id, SteerKind.INTERRUPT, "", now)
                        interrupted.append(run.turn_id)
            turn_id, run_id = new_id(), new_id()
            db.execute(
                t.turns.insert().values(
                    id=turn_id,
                    session_id=session_id,
                    parent_id=None,
                    ordinal=ordinal,
                    prompt=prompt,
                    request_id=request_id,
                    created_at=now,
                )
            )
            db.execute(
                t.runs.insert().values(
                    id=run_id,
                    turn_id=turn_id,
                    session_id=session_id,
                    status=TurnStatus.QUEUED.value,
                    attempts=0,
                    contract=contract.to_json() if contract else None,
                    steps=0,
                    input_tokens=0,
                    output_tokens=0,
                    cached_tokens=0,
                    steer_count=0,
                    steer_cursor=0,
                    inbox_open=True,
                    last_seq=1,
                    queued_at=now,
                )
            )
            queued = Event(turn_id=turn_id, seq=1, kind=EventKind.QUEUED, data={"run_id": run_id})
            self._insert_events(db, [queued], now)
            record = TurnRecord(
                turn_id=turn_id,
                session_id=session_id,
                parent_id=None,
                prompt=prompt,
                status=TurnStatus.QUEUED,
                reply=None,
                run_id=run_id,
                request_id=request_id,
                created_at=now,
            )
        return SubmitReceipt(
            turn=record, created=True, queued_event=queued, interrupted_turn_ids=tuple(interrupted)
        )

    def _by_request(self, db: Connection, session_id: str, request_id: str) -> TurnRecord | None:
        row = db.execute(
            self._turn_select().where(
                t.turns.c.session_id == session_id, t.turns.c.request_id == request_id
            )
        ).one_or_none()
        return None if row is None else self._turn_record(row)

    @staticmethod
    def _existing(turn: TurnRecord, prompt: str) -> SubmitReceipt:
        if turn.prompt != prompt:
            raise Conflict(
                f"request_id {turn.request_id!r} was already used for another prompt "
                f"(turn {turn.turn_id})"
            )
        return SubmitReceipt(turn=turn, created=False, queued_event=None, interrupted_turn_ids=())

    def resume_turn(self, turn_id: str, seq_floor: int) -> tuple[TurnRecord, Event | None]:
        """Queue a cancelled or failed turn again (same turn, same run).  A turn that is
        still queued or running is left as it is: resuming it only needs a driver."""
        now = _now()
        with self._tx() as db:
            run = db.execute(
                self._for_update(select(t.runs).where(t.runs.c.turn_id == turn_id))
            ).one_or_none()
            if run is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            if run.status in ACTIVE:
                return self._turn(db, turn_id), None
            if run.status not in RESUMABLE:
                raise Conflict(
                    f"turn {turn_id!r} ended {run.status}; only a cancelled or failed turn "
                    "can be resumed (branch from it to go on)"
                )
            seq = max(run.last_seq, seq_floor) + 1
            db.execute(
                update(t.runs)
                .where(t.runs.c.id == run.id)
                .values(
                    status=TurnStatus.QUEUED.value,
                    queued_at=now,
                    inbox_open=True,
                    error=None,
                    reply=None,
                    last_seq=seq,
                )
            )
            queued = Event(
                turn_id=turn_id,
                seq=seq,
                kind=EventKind.QUEUED,
                data={"run_id": run.id, "resume": True},
            )
            self._insert_events(db, [queued], now)
            return self._turn(db, turn_id), queued

    def turn_result(self, turn_id: str) -> TurnResult | None:
        """The result of an ended turn (None while it is queued or running)."""
        with self._tx() as db:
            run = db.execute(select(t.runs).where(t.runs.c.turn_id == turn_id)).one_or_none()
        if run is None:
            raise TurnNotFound(f"no turn {turn_id!r}")
        status = TurnStatus(run.status)
        if not status.terminal:
            return None
        return TurnResult(
            turn_id=turn_id,
            run_id=run.id,
            outcome=status,
            reply=run.reply,
            steps=run.steps,
            usage=Usage(
                input_tokens=run.input_tokens,
                output_tokens=run.output_tokens,
                cached_tokens=run.cached_tokens,
            ),
            error=run.error,
            undelivered=tuple(run.undelivered or ()),
            partial=run.partial,
        )

    def run_state(self, turn_id: str) -> RunState:
        """The execution record of a turn."""
        with self._tx() as db:
            run = db.execute(select(t.runs).where(t.runs.c.turn_id == turn_id)).one_or_none()
        if run is None:
            raise TurnNotFound(f"no turn {turn_id!r}")
        return self._run_state(run)

    @staticmethod
    def _run_state(run: Any) -> RunState:
        return RunState(
            run_id=run.id,
            turn_id=run.turn_id,
            session_id=run.session_id,
            status=TurnStatus(run.status),
            attempts=run.attempts,
            steps=run.steps,
            usage=Usage(
                input_tokens=run.input_tokens,
                output_tokens=run.output_tokens,
                cached_tokens=run.cached_tokens,
            ),
            steer_cursor=run.steer_cursor,
            contract=Contract.from_json(run.contract),
            partial=run.partial,
            error=run.error,
            undelivered=tuple(run.undelivered or ()),
        )

    def steps_of(self, turn_id: str) -> list[CommittedStep]:
        """The committed steps of a turn, in order."""
        with self._tx() as db:
            run_id = db.execute(
                select(t.runs.c.id).where(t.runs.c.turn_id == turn_id)
            ).scalar_one_or_none()
            if run_id is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            return self._steps(db, [run_id]).get(run_id, [])

    def _steps(self, db: Connection, run_ids: Sequence[str]) -> dict[str, list[CommittedStep]]:
        found: dict[str, list[CommittedStep]] = {}
        if not run_ids:
            return found
        rows = db.execute(
            select(t.steps.c.run_id, t.steps.c.step_index, t.steps.c.payload)
            .where(t.steps.c.run_id.in_(run_ids))
            .order_by(t.steps.c.run_id, t.steps.c.step_index)
        ).all()
        for row in rows:
            found.setdefault(row.run_id, []).append(
                CommittedStep(index=row.step_index, payload=StepPayload.from_json(row.payload))
            )
        return found

    # ------------------------------------------------------------------ steering

    def add_steer(self, turn_id: str, kind: SteerKind, text: str) -> Steer:
        """Accept a steer into a turn's inbox; :class:`TurnEnded` once the turn ended."""
        with self._tx() as db:
            run_id = db.execute(
                select(t.runs.c.id).where(t.runs.c.turn_id == turn_id)
            ).scalar_one_or_none()
            if run_id is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            return self._add_steer(db, run_id, kind, text, _now())

    def _add_steer(
        self, db: Connection, run_id: str, kind: SteerKind, text: str, now: datetime
    ) -> Steer:
        # Bumping the counter only while the inbox is open takes the run row's lock and
        # checks it in one statement: a concurrent close either sees this steer or wins.
        position = db.execute(
            update(t.runs)
            .where(t.runs.c.id == run_id, t.runs.c.inbox_open.is_(True))
            .values(steer_count=t.runs.c.steer_count + 1)
            .returning(t.runs.c.steer_count)
        ).scalar_one_or_none()
        if position is None:
            status = db.execute(select(t.runs.c.status).where(t.runs.c.id == run_id)).scalar_one()
            raise TurnEnded(f"the turn has ended ({status}); the steer was not delivered")
        db.execute(
            t.steers.insert().values(
                run_id=run_id, position=position, kind=kind.value, text=text, created_at=now
            )
        )
        return Steer(position=position, kind=kind, text=text)

    def pending_steers(self, run_id: str, cursor: int) -> tuple[Steer, ...]:
        """The steers of a run accepted after ``cursor``."""
        with self._tx() as db:
            return self._pending(db, run_id, cursor)

    def _pending(self, db: Connection, run_id: str, cursor: int) -> tuple[Steer, ...]:
        rows = db.execute(
            select(t.steers.c.position, t.steers.c.kind, t.steers.c.text)
            .where(t.steers.c.run_id == run_id, t.steers.c.position > cursor)
            .order_by(t.steers.c.position)
        ).all()
        return tuple(Steer(position=r.position, kind=SteerKind(r.kind), text=r.text) for r in rows)

    # ------------------------------------------------------------------ driving

    def take_fence(self, session_id: str) -> int:
        """A new fencing token for the driver that just took the session's lock."""
        with self._tx() as db:
            fence = db.execute(
                update(t.sessions)
                .where(t.sessions.c.id == session_id)
                .values(fence=t.sessions.c.fence + 1)
                .returning(t.sessions.c.fence)
            ).scalar_one_or_none()
        if fence is None:
            raise SessionNotFound(f"no session {session_id!r}")
        return int(fence)

    def next_turn(self, session_id: str) -> str | None:
        """The turn to run next: a stranded running one first, then the oldest queued."""
        with self._tx() as db:
            return self._next_turn(db, session_id)

    def _next_turn(self, db: Connection, session_id: str) -> str | None:
        return db.execute(
            select(t.runs.c.turn_id)
            .join(t.turns, t.turns.c.id == t.runs.c.turn_id)
            .where(t.runs.c.session_id == session_id, t.runs.c.status.in_(ACTIVE))
            .order_by(
                case((t.runs.c.status == TurnStatus.RUNNING.value, 0), else_=1),
                t.runs.c.queued_at,
                t.turns.c.ordinal,
            )
            .limit(1)
        ).scalar_one_or_none()

    def sessions_with_work(self) -> list[str]:
        """Sessions that have a queued or running turn (for sweepers and startup)."""
        with self._tx() as db:
            return list(
                db.execute(
                    select(t.runs.c.session_id).where(t.runs.c.status.in_(ACTIVE)).distinct()
                ).scalars()
            )

    def _check_fence(self, db: Connection, session_id: str, fence: int) -> None:
        current = db.execute(
            self._for_update(select(t.sessions.c.fence).where(t.sessions.c.id == session_id))
        ).scalar_one_or_none()
        if current != fence:
            raise Fenced(f"fence {fence} is stale (now {current})")

    def claim_turn(
        self, turn_id: str, *, fence: int, worker: str, seq_floor: int
    ) -> tuple[ClaimedTurn, Event]:
        """Mark a turn running under ``fence`` and read everything needed to run it.
        Returns the claim and its ``started`` event (already stored)."""
        now = _now()
        with self._tx() as db:
            run = db.execute(
                self._for_update(select(t.runs).where(t.runs.c.turn_id == turn_id))
            ).one_or_none()
            if run is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            self._check_fence(db, run.session_id, fence)
            if run.status not in ACTIVE:
                raise Conflict(f"turn {turn_id!r} is {run.status}, not runnable")
            session = self._session(db, run.session_id)
            turn = self._turn(db, turn_id)
            if run.attempts == 0:
                # A queued turn hangs under the head as it is when it starts.
                db.execute(
                    update(t.turns)
                    .where(t.turns.c.id == turn_id)
                    .values(parent_id=session.head_turn_id)
                )
                turn = self._turn(db, turn_id)
            seq = max(run.last_seq, seq_floor) + 1
            started = Event(
                turn_id=turn_id,
                seq=seq,
                kind=EventKind.STARTED,
                data={"run_id": run.id, "attempt": run.attempts + 1, "worker": worker},
            )
            db.execute(
                update(t.runs)
                .where(t.runs.c.id == run.id)
                .values(
                    status=TurnStatus.RUNNING.value,
                    attempts=run.attempts + 1,
                    worker=worker,
                    started_at=run.started_at or now,
                    inbox_open=True,
                    last_seq=seq,
                )
            )
            self._insert_events(db, [started], now)
            generation = db.execute(
                select(t.sessions.c.prefix_generation).where(t.sessions.c.id == session.session_id)
            ).scalar_one()
            prefix = self._prefix(db, session.session_id, generation)
            path = self._path(db, turn.parent_id)
            steps = self._steps(db, [p.run_id for p in path] + [run.id])
            state = self._run_state(run)
            claimed = ClaimedTurn(
                session=session,
                turn=turn,
                run=state,
                prefix=prefix,
                prefix_generation=generation,
                history=tuple(PathTurn(turn=p, steps=tuple(steps.get(p.run_id, ()))) for p in path),
                steps=tuple(steps.get(run.id, ())),
                pending=self._pending(db, run.id, run.steer_cursor),
                previous_status=run.status,
                next_seq=seq + 1,
            )
        return claimed, started

    def _prefix(self, db: Connection, session_id: str, generation: int) -> Prefix | None:
        if generation == 0:
            return None
        payload = db.execute(
            select(t.prefixes.c.payload).where(
                t.prefixes.c.session_id == session_id, t.prefixes.c.generation == generation
            )
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
    ) -> tuple[Steer, ...]:
        """Commit one step whole: step row, run usage and cursor, session tokens, durable
        events, fencing check.  Returns the steers that arrived meanwhile; when asked and
        none did, closes the inbox in the same transaction."""
        now = _now()
        usage = payload.usage
        with self._tx() as db:
            fenced = db.execute(
                update(t.sessions)
                .where(t.sessions.c.id == session_id, t.sessions.c.fence == fence)
                .values(tokens_used=t.sessions.c.tokens_used + usage.total)
            ).rowcount
            if fenced != 1:
                raise Fenced(f"fence {fence} is stale; step {index} not committed")
            values: dict[str, Any] = {
                "steps": index + 1,
                "input_tokens": t.runs.c.input_tokens + usage.input_tokens,
                "output_tokens": t.runs.c.output_tokens + usage.output_tokens,
                "cached_tokens": t.runs.c.cached_tokens + usage.cached_tokens,
                "steer_cursor": steer_cursor,
            }
            if events:
                values["last_seq"] = max(e.seq for e in events)
            advanced = db.execute(
                update(t.runs)
                .where(
                    t.runs.c.id == run_id,
                    t.runs.c.status == TurnStatus.RUNNING.value,
                    t.runs.c.steps == index,
                )
                .values(**values)
            ).rowcount
            if advanced != 1:
                raise Fenced(f"run {run_id} moved on; step {index} not committed")
            db.execute(
                self._insert(t.steps)
                .values(run_id=run_id, step_index=index, payload=payload.to_json(), created_at=now)
                .on_conflict_do_nothing()
            )
            self._insert_events(db, events, now)
            pending = self._pending(db, run_id, steer_cursor)
            if close_inbox_if_idle and not pending:
                db.execute(update(t.runs).where(t.runs.c.id == run_id).values(inbox_open=False))
            return pending

    def close_inbox(
        self, *, run_id: str, session_id: str, fence: int, cursor: int
    ) -> tuple[Steer, ...]:
        """Close the inbox unless steers are pending; returns the pending ones."""
        with self._tx() as db:
            self._check_fence(db, session_id, fence)
            db.execute(self._for_update(select(t.runs.c.id).where(t.runs.c.id == run_id))).one()
            pending = self._pending(db, run_id, cursor)
            if not pending:
                db.execute(update(t.runs).where(t.runs.c.id == run_id).values(inbox_open=False))
            return pending

    def finish_turn(
        self,
        *,
        run_id: str,
        turn_id: str,
        session_id: str,
        fence: int,
        status: TurnStatus,
        reply: str | None,
        error: str | None,
        partial: str | None,
        cursor: int,
        prefix: Prefix | None,
        refresh_prefix: bool,
        events: Sequence[Event],
        end_seq: int,
    ) -> FinishReceipt:
        """Commit a turn's outcome, reply, head and prefix in one fenced transaction.
        Says still pending are reported as undelivered in the ``end`` event."""
        now = _now()
        with self._tx() as db:
            session_values: dict[str, Any] = {}
            if status.moves_head:
                session_values["head_turn_id"] = turn_id
            fenced = db.execute(
                update(t.sessions)
                .where(t.sessions.c.id == session_id, t.sessions.c.fence == fence)
                .values(**session_values, fence=t.sessions.c.fence)
            ).rowcount
            if fenced != 1:
                raise Fenced(f"fence {fence} is stale; turn {turn_id} not finished")
            # Closing the inbox first takes the run row's lock, so no steer slips in
            # between the read of the pending ones and the close.
            closed = db.execute(
                update(t.runs)
                .where(t.runs.c.id == run_id, t.runs.c.status == TurnStatus.RUNNING.value)
                .values(inbox_open=False)
            ).rowcount
            if closed != 1:
                raise Fenced(f"run {run_id} is no longer running; not finished")
            pending = self._pending(db, run_id, cursor)
            undelivered = tuple(s.text for s in pending if s.kind is SteerKind.SAY)
            steer_count = max([cursor] + [s.position for s in pending])
            generation = self._store_prefix(db, session_id, status, prefix, refresh_prefix, now)
            end = Event(
                turn_id=turn_id,
                seq=end_seq,
                kind=EventKind.END,
                data={
                    "outcome": status.value,
                    "reply": reply,
                    "error": error,
                    "undelivered": list(undelivered),
                },
            )
            db.execute(
                update(t.runs)
                .where(t.runs.c.id == run_id)
                .values(
                    status=status.value,
                    reply=reply if status.has_reply else None,
                    error=error,
                    partial=partial,
                    undelivered=list(undelivered) or None,
                    steer_cursor=steer_count,
                    ended_at=now,
                    last_seq=end_seq,
                )
            )
            self._insert_events(db, [*events, end], now)
            head = db.execute(
                select(t.sessions.c.head_turn_id).where(t.sessions.c.id == session_id)
            ).scalar_one()
        return FinishReceipt(
            end_event=end, undelivered=undelivered, head_turn_id=head, prefix_generation=generation
        )

    def _store_prefix(
        self,
        db: Connection,
        session_id: str,
        status: TurnStatus,
        prefix: Prefix | None,
        refresh: bool,
        now: datetime,
    ) -> int:
        generation: int = db.execute(
            select(t.sessions.c.prefix_generation).where(t.sessions.c.id == session_id)
        ).scalar_one()
        if prefix is None or not status.moves_head:
            return generation
        if generation > 0:
            if not refresh:
                return generation
            if self._prefix(db, session_id, generation) == prefix:
                return generation  # refreshing to an identical prefix is a no-op
        generation += 1
        db.execute(
            t.prefixes.insert().values(
                session_id=session_id,
                generation=generation,
                payload=prefix.to_json(),
                created_at=now,
            )
        )
        db.execute(
            update(t.sessions)
            .where(t.sessions.c.id == session_id)
            .values(prefix_generation=generation)
        )
        return generation

    # ------------------------------------------------------------------ events

    def _insert_events(self, db: Connection, events: Sequence[Event], now: datetime) -> None:
        durable = [e for e in events if e.kind.durable]
        if not durable:
            return
        db.execute(
            self._insert(t.events)
            .values(
                [
                    {
                        "turn_id": e.turn_id,
                        "seq": e.seq,
                        "kind": e.kind.value,
                        "data": e.data,
                        "created_at": now,
                    }
                    for e in durable
                ]
            )
            .on_conflict_do_nothing()
        )

    def events_after(self, turn_id: str, seq: int) -> list[Event]:
        """The durable events of a turn with ``seq`` greater than the one given."""
        with self._tx() as db:
            rows = db.execute(
                select(t.events.c.seq, t.events.c.kind, t.events.c.data)
                .where(t.events.c.turn_id == turn_id, t.events.c.seq > seq)
                .order_by(t.events.c.seq)
            ).all()
        return [
            Event(turn_id=turn_id, seq=r.seq, kind=EventKind(r.kind), data=dict(r.data))
            for r in rows
        ]

    def last_event_seq(self, turn_id: str) -> int:
        """The highest stored seq of a turn (0 if none)."""
        with self._tx() as db:
            value = db.execute(
                select(func.max(t.events.c.seq)).where(t.events.c.turn_id == turn_id)
            ).scalar_one()
        return int(value or 0)

    # ------------------------------------------------------------------ sizes

    def table_counts(self) -> dict[str, int]:
        """Row counts per table (for benchmarks and storage checks)."""
        with self._tx() as db:
            return {
                table.name: int(db.execute(select(func.count()).select_from(table)).scalar_one())
                for table in (t.sessions, t.prefixes, t.turns, t.runs, t.steps, t.steers, t.events)
            }


def validate_ids(*ids: str | None) -> None:
    """Reject ids that cannot be parley ids before any query runs."""
    for value in ids:
        if not isinstance(value, str) or not value or len(value) > 36:
            raise InvalidRequest(f"not a parley id: {value!r}")
