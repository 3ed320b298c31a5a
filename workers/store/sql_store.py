"""The store: parley's durable state, one transaction per method, on SQLite (embedded)
and PostgreSQL (fleet); the SQL itself lives, named, in :mod:`workers.store.statements`.

:class:`SqlStore` is the client-facing side (sessions, turns, submissions, steers,
history, events) on top of the driver's protocol (:mod:`workers.store.turn_runs`) and the
transaction plumbing (:mod:`workers.store.connection`).  Concurrency rules:

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
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from schemas import tables as t
from schemas.errors import (
    Conflict,
    ForeignTurn,
    InvalidRequest,
    SessionBusy,
    SessionNotFound,
    StoreError,
    TurnEnded,
    TurnNotFound,
)
from schemas.events import Event, EventKind, Queued
from schemas.messages import StepPayload
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
from workers.coordination import constants as c
from workers.ports.backend import CommittedStep, Store
from workers.store import statements as q
from workers.store.approvals import INTERRUPTED, Answered, ApprovalStore
from workers.store.connection import IntegrityConflict, StoreConnection
from workers.store.database import create_database_engine
from workers.store.leases import LeaseStore
from workers.store.outbox import OutboxStore
from workers.store.retention import RetentionStore
from workers.store.rows import (
    insert_step,
    read_path,
    read_pending,
    read_session,
    read_steps,
    read_turn,
    run_state_of,
    session_record,
    turn_record,
    write_events,
)
from workers.store.session_titles import title_of_prompt
from workers.store.status import StatusStore
from workers.store.turn_runs import TurnRunStore

__all__ = ["IntegrityConflict", "SqlStore", "SubmitReceipt", "new_id", "storable", "validate_ids"]


def _now() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    """A fresh identifier for a session, turn or run."""
    return str(uuid.uuid4())


def validate_ids(*ids: str | None) -> None:
    """Reject ids that cannot be parley ids before any query runs (PostgreSQL cannot
    even compare text with a NUL or a lone surrogate in it: it fails the query)."""
    for value in ids:
        if not isinstance(value, str) or not value or len(value) > 36 or not storable(value):
            raise InvalidRequest(f"not a parley id: {value!r}")


def storable(text: str) -> bool:
    """Whether both databases keep ``text`` as it is: no NUL (PostgreSQL refuses it in
    text and JSON) and no lone surrogate (not UTF-8, so neither driver can send it)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
class SteerReceipt:
    """What ``add_steer`` did: the accepted steer, and for an interrupt of a turn that
    waited for answers, the denials it gave its pending calls (publish them; the turn is
    runnable again, to commit its held step with them and stop)."""

    steer: Steer
    denied: Answered | None = None


class SqlStore(
    ApprovalStore, TurnRunStore, LeaseStore, RetentionStore, OutboxStore, StatusStore, Store
):
    """parley's durable state on SQLite or PostgreSQL (see the module docstring): the
    store port the engine talks to, and what clients read and write."""

    @classmethod
    def from_url(cls, url: str, **pool: int) -> SqlStore:
        """A store on a new engine for ``url`` (``pool``: ``pool_size``, ``max_overflow``
        for :func:`~workers.store.database.create_database_engine`)."""
        return cls(create_database_engine(url, **pool))

    # ------------------------------------------------------------------ sessions

    def create_session(
        self,
        *,
        root: str,
        metadata: dict[str, Any],
        token_ceiling: int | None,
        tenant: str | None = None,
        session_id: str | None = None,
        retention: timedelta | None = None,
        webhook_url: str | None = None,
        title: str | None = None,
    ) -> SessionRecord:
        """Insert a new session with an empty tree (its id ``session_id``, else a fresh
        one; :class:`Conflict` if that id is taken).  Without a ``title`` it takes its
        first prompt's."""
        now = _now()
        record = SessionRecord(
            session_id=session_id or new_id(),
            root=root,
            metadata=metadata,
            head_turn_id=None,
            token_ceiling=token_ceiling,
            tokens_used=0,
            created_at=now,
            tenant=tenant,
            retention=retention,
            webhook_url=webhook_url,
            last_active_at=now,
            title=title,
        )
        try:
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
                        "created_at": now,
                        "tenant": tenant,
                        "retention_seconds": (
                            None if retention is None else int(retention.total_seconds())
                        ),
                        "webhook_url": webhook_url,
                        "last_active_at": now,
                        "title": title,
                    },
                )
        except IntegrityConflict as exc:
            raise Conflict(f"a session {record.session_id!r} exists already") from exc
        return record

    def list_sessions(
        self, *, tenant: str, limit: int, before: str | None = None
    ) -> list[SessionRecord]:
        """A tenant's sessions, newest first: at most ``limit``, and only those created
        before the session ``before`` (a page's last), if given; :class:`SessionNotFound`
        if ``before`` is not one of the tenant's."""

        def read(db: StoreConnection) -> list[SessionRecord]:
            binds: dict[str, Any] = {"b_tenant": tenant, "b_limit": limit}
            if before is None:
                statement = q.SESSIONS_OF_TENANT
            else:
                mark = read_session(db, before)
                if mark.tenant != tenant:
                    raise SessionNotFound(f"no session {before!r}")
                statement = q.SESSIONS_OF_TENANT_BEFORE
                binds.update(b_created_at=mark.created_at, b_id=mark.session_id)
            return [session_record(row) for row in db.execute(statement, binds)]

        return self._reading(read)

    def get_session(self, session_id: str) -> SessionRecord:
        """The stored session; :class:`SessionNotFound` if unknown."""
        return self._reading(lambda db: read_session(db, session_id))

    def set_title(self, session_id: str, title: str) -> SessionRecord:
        """Give the session ``title`` (checked by the caller); the session as it is
        now.  :class:`SessionNotFound` if unknown."""
        with self._tx() as db:
            moved = db.execute(q.SET_TITLE, {"b_session_id": session_id, "b_title": title})
            if moved.rowcount != 1:
                raise SessionNotFound(f"no session {session_id!r}")
            return read_session(db, session_id)

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
        now = _now()
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
            parent: str | None = None
            records = []
            for position, (prompt, steps) in enumerate(turns, start=1):
                turn_id, run_id = new_id(), new_id()
                reply = steps[-1].text if steps else None
                db.execute(
                    q.SEED_TURN,
                    {
                        "id": turn_id,
                        "session_id": session_id,
                        "parent_id": parent,
                        "ordinal": position,
                        "prompt": prompt,
                        "request_id": None,
                        "created_at": now,
                    },
                )
                db.execute(
                    q.SEED_RUN,
                    {
                        "id": run_id,
                        "turn_id": turn_id,
                        "session_id": session_id,
                        "status": TurnStatus.FINISHED.value,
                        "attempts": 1,
                        "stalled_attempts": 0,
                        "steps": len(steps),
                        "input_tokens": 0,
                        "output_tokens": 0,
                        "cached_tokens": 0,
                        "steer_count": 0,
                        "steer_cursor": 0,
                        "inbox_open": False,
                        "last_seq": 0,
                        "reply": reply,
                        "worker": c.SEEDED,
                        "queued_at": now,
                        "queue_position": position,
                        "started_at": now,
                        "ended_at": now,
                    },
                )
                for index, payload in enumerate(steps):
                    insert_step(db, self._q, run_id, index, payload, now)
                records.append(
                    TurnRecord(
                        turn_id=turn_id,
                        session_id=session_id,
                        parent_id=parent,
                        prompt=prompt,
                        status=TurnStatus.FINISHED,
                        reply=reply,
                        run_id=run_id,
                        request_id=None,
                        created_at=now,
                    )
                )
                parent = turn_id
            db.execute(
                q.SET_TURN_COUNT,
                {"b_session_id": session_id, "b_count": len(turns), "b_now": now},
            )
            db.execute(q.SET_HEAD, {"b_session_id": session_id, "b_head": parent})
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

    def seeded(self, session_id: str) -> tuple[list[Any], list[Any] | None] | None:
        """A session's seeded messages and raw rows, as given (None: not seeded)."""
        row = self._reading(
            lambda db: db.execute(q.SEED_OF_SESSION, {"b_session_id": session_id}).one_or_none()
        )
        return None if row is None else (list(row.messages), row.raw_rows)

    def branch(self, session_id: str, turn_id: str) -> None:
        """Move the session's head to ``turn_id`` (one write; nothing else changes).

        The turn must have started: a turn takes its place in the tree, under the head
        of that moment, when it first starts, so a head that never started would become
        its own parent, or the parent of turns queued before it (a cycle).  Started is
        for good, so no lock is needed: a turn starting meanwhile is merely refused."""
        with self._tx() as db:
            read_session(db, session_id)
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
            moved = db.execute(q.SET_HEAD, {"b_session_id": session_id, "b_head": turn_id})
            if moved.rowcount != 1:  # pruned since it was read
                raise SessionNotFound(f"no session {session_id!r}")

    def history(self, session_id: str) -> list[TurnRecord]:
        """The path root → head."""
        with self._tx() as db:
            return read_path(db, read_session(db, session_id).head_turn_id)

    def tree(self, session_id: str) -> list[TurnRecord]:
        """Every turn of every branch, in submission order."""

        def read(db: StoreConnection) -> list[TurnRecord]:
            read_session(db, session_id)
            return [turn_record(row) for row in db.execute(q.TREE, {"b_session_id": session_id})]

        return self._reading(read)

    # ------------------------------------------------------------------ turns

    def turn_and_tenant(self, turn_id: str) -> tuple[TurnRecord, str | None]:
        """One turn and its session's tenant; :class:`TurnNotFound` if unknown."""
        row = self._reading(
            lambda db: db.execute(q.TURN_AND_TENANT, {"b_turn_id": turn_id}).one_or_none()
        )
        if row is None:
            raise TurnNotFound(f"no turn {turn_id!r}")
        return turn_record(row), row.tenant

    def get_turn(self, turn_id: str) -> TurnRecord:
        """One turn; :class:`TurnNotFound` if unknown."""
        return self._reading(lambda db: read_turn(db, turn_id))

    def submit_turn(
        self,
        *,
        session_id: str,
        prompt: str,
        request_id: str | None,
        contract: TaskContract | None,
        if_busy: IfBusy,
        host_context: dict[str, Any] | None = None,
    ) -> SubmitReceipt:
        """Insert a queued turn and its run, idempotently on ``request_id``.

        The transaction holds the session row, which every driver's commit updates: it
        makes no call to anything but the database, so a slow producer (or a slow Redis
        or broker behind it) cannot hold up a running turn.  The caller publishes the
        receipt's ``queued`` event and kicks after the commit."""
        try:
            return self._submit(session_id, prompt, request_id, contract, if_busy, host_context)
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
        host_context: dict[str, Any] | None,
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
            title = title_of_prompt(prompt) if ordinal == 1 else None
            if title is not None:
                db.execute(q.SET_TITLE_IF_NONE, {"b_session_id": session_id, "b_title": title})
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
            denied: list[Answered] = []
            if if_busy is IfBusy.INTERRUPT:
                for run in active:
                    if run.status not in (q.RUNNING, q.WAITING):
                        continue
                    try:
                        steer = self._add_steer(db, run.id, SteerKind.INTERRUPT, "", now)
                    except TurnEnded:
                        continue  # its inbox closed: it is committing its end already
                    interrupted.append((run.turn_id, steer))
                    if run.status == q.WAITING:
                        answered = self.deny_pending(db, run.id, INTERRUPTED)
                        if answered is not None:
                            denied.append(answered)
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
                "b_host_context": host_context,
                "b_data": queued.data,
                "b_now": now,
            }
            if self._q.insert_submission is not None:
                db.execute(self._q.insert_submission, rows)
            else:
                for statement in (q.INSERT_TURN, q.INSERT_RUN, q.INSERT_QUEUED):
                    db.execute(statement, rows)
        return SubmitReceipt(
            turn=record,
            created=True,
            interrupted=tuple(interrupted),
            queued=queued,
            denied=tuple(denied),
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
            if run.status in q.UNFINISHED:
                record = read_turn(db, turn_id)
                db.rollback()  # nothing to change: it only needs a driver (or answers)
                return record, None
            if run.status not in q.RESUMABLE:
                raise Conflict(
                    f"turn {turn_id!r} ended {run.status}; only a cancelled or failed turn "
                    "can be resumed (branch from it to go on)"
                )
            following = _following(db, session_id, read_turn(db, turn_id))
            if following is not None:
                raise Conflict(
                    f"turn {turn_id!r} cannot be resumed while later turns follow it "
                    f"({following}): its end would move the head back to it.  To go on "
                    f"from it, branch_from({turn_id!r}) and submit a new turn"
                )
            seq = max(run.last_seq, seq_floor) + 1
            db.execute(
                q.RESUME_RUN,
                {"b_run_id": run.id, "b_now": now, "b_seq": seq, "b_position": position},
            )
            queued = Event.of(turn_id, seq, Queued(run_id=run.id, resume=True))
            write_events(db, self._q, [queued], now)
            return read_turn(db, turn_id), queued

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
            approvals=self.approvals(turn_id) if state.approval_count else (),
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
            return read_steps(db, [run_id]).get(run_id, [])

        return self._reading(read)

    # ------------------------------------------------------------------ steering

    def add_steer(self, turn_id: str, kind: SteerKind, text: str) -> Steer:
        """Accept a steer into a turn's inbox (see :meth:`accept_steer`)."""
        return self.accept_steer(turn_id, kind, text).steer

    def accept_steer(self, turn_id: str, kind: SteerKind, text: str) -> SteerReceipt:
        """Accept a steer into a turn's inbox; :class:`TurnEnded` once the turn ended.  An
        interrupt of a turn that waits for answers also denies its pending calls."""
        with self._tx() as db:
            run_id = db.execute(q.RUN_ID_OF_TURN, {"b_turn_id": turn_id}).scalar_one_or_none()
            if run_id is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            steer = self._add_steer(db, run_id, kind, text, _now())
            denied = None
            if kind is SteerKind.INTERRUPT:
                denied = self.deny_pending(db, run_id, INTERRUPTED)
            return SteerReceipt(steer=steer, denied=denied)

    def _add_steer(
        self, db: StoreConnection, run_id: str, kind: SteerKind, text: str, now: datetime
    ) -> Steer:
        position = db.execute(q.COUNT_STEER, {"b_run_id": run_id}).scalar_one_or_none()
        if position is None:
            status = db.execute(q.RUN_STATUS, {"b_run_id": run_id}).scalar_one_or_none()
            if status is None:  # its session was pruned since the turn was read
                raise TurnNotFound(f"no run {run_id!r}")
            what = (
                "interrupt has nothing to stop"
                if kind is SteerKind.INTERRUPT
                else ("message was not delivered")
            )
            raise TurnEnded(f"the turn has ended ({status}); the {what}")
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
        return self._reading(lambda db: read_pending(db, run_id, cursor))

    # ------------------------------------------------------------------ events

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

    def ping(self) -> bool:
        """Whether the database answers now (readiness checks)."""
        try:
            self._reading(lambda db: db.execute(select(1)).scalar_one())
        except StoreError:
            return False
        return True

    # ------------------------------------------------------------------ sizes

    def table_counts(self) -> dict[str, int]:
        """Row counts per table (for benchmarks and storage checks)."""
        with self._tx() as db:
            return {
                table.name: int(db.execute(select(func.count()).select_from(table)).scalar_one())
                for table in t.metadata.sorted_tables
            }


def _existing(turn: TurnRecord, prompt: str) -> SubmitReceipt:
    if turn.prompt != prompt:
        raise Conflict(
            f"request_id {turn.request_id!r} was already used for another prompt "
            f"(turn {turn.turn_id})"
        )
    return SubmitReceipt(turn=turn, created=False, interrupted=())


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
