"""The store's side of a claim: a driver takes a session (a new fencing token) and claims
its next runnable turn, given everything the turn needs to run: the session, the path
from the root with the steps of each turn the driver does not know, the prefix in force,
its own committed steps and the steers the run counted.

A claim either makes its writes here (the turn hung under the head, the run counted
running, its ``started`` event stored: :meth:`Claims._claim`) or finds them made by the
PostgreSQL statement that read the run (:meth:`Claims._take_written_claim`); both hand
back the same claim."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Literal

from schemas.errors import Fenced, SessionNotFound
from schemas.events import Event, Started
from schemas.messages import Prefix
from schemas.records import SessionRecord, Steer, TurnRecord
from workers.coordination import constants as c
from workers.ports.backend import Claim, ClaimedTurn, KnownTurns, PathTurn, SeqFloor
from workers.store import statements as q
from workers.store.clock import utc_now
from workers.store.connection import StoreConnection, Transactions
from workers.store.rows import (
    SessionRow,
    aware,
    read_path,
    read_pending,
    read_steps,
    run_state_of,
    session_record,
    turn_of_next_run,
    write_events,
)


@dataclass(frozen=True, kw_only=True)
class KnownHead:
    """The session as a turn's final transaction leaves it, for the claim of the next
    turn in the same transaction.  The session row was read before this transaction
    froze a first prefix, so the generation in force is carried here; and what the
    ending turn knows spares reading it back: the prefix of that generation and the
    path root → ``turn_id`` (each None when not known)."""

    turn_id: str | None
    generation: int
    prefix: Prefix | None
    path: tuple[TurnRecord, ...] | None


@dataclass(frozen=True, kw_only=True)
class Claimant:
    """Who claims a run and what it knows: its ``worker`` name, the history turns it
    ``known`` (their steps are not loaded), the session as a turn's end earlier in the
    same transaction left it (``head``), and the claim's time."""

    worker: str
    known: KnownTurns | None
    head: KnownHead | None
    now: datetime


class Claims(Transactions):
    """Taking a session and claiming its next runnable turn (see the module docstring)."""

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
        now = utc_now()
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
            claimant = Claimant(worker=worker, known=known, head=None, now=now)
            return fence, self._take_written_claim(db, run, session, claimant, seq_floor=0)

    def _claim_next(
        self,
        db: StoreConnection,
        session: SessionRow,
        *,
        fence: int,
        worker: str,
        seq_floor: SeqFloor,
        known: KnownTurns | None,
        head: KnownHead | None = None,
    ) -> Claim | None:
        """Claim the next runnable turn of ``session`` (its row as read, updated by what
        ``head`` says when a turn's end in this transaction came after the read)."""
        claimant = Claimant(worker=worker, known=known, head=head, now=utc_now())
        run = self._next_run(db, session, claimant)
        if run is None or run.status == q.WAITING:
            return None  # a turn that waits for answers holds the session's line
        not_before = getattr(run, "not_before", None)
        if not_before is not None and aware(not_before) > claimant.now:
            return None  # so does one that waits for provider capacity (its kick is due)
        # A first attempt needs no adoption: no driver ever published for it, and the
        # buffer can hold nothing above the stored ``queued`` event.
        floor = seq_floor(run.turn_id, fence) if run.attempts else 0
        if run.status == q.RUNNING:
            # Cut off mid-turn: how far it published past its last commit, readers may
            # know better than a buffer that lost its tail (a flush, a failover).
            floor = max(floor, run.last_seq + c.TAKEOVER_SEQ_GAP)
        if getattr(run, "claimed", False):  # (NEXT_RUN has no such column)
            return self._take_written_claim(db, run, session, claimant, seq_floor=floor)
        return self._claim(db, run, session, claimant, seq_floor=floor)

    def _next_run(self, db: StoreConnection, session: SessionRow, claimant: Claimant) -> Any:
        """The session's next run, locked (None: nothing to drive); on PostgreSQL a fresh
        one is claimed by the same statement (its ``claimed`` column says so)."""
        if self._q.claim_next is None:
            return db.execute(q.NEXT_RUN, {"b_session_id": session.id}).one_or_none()
        binds = {
            "b_session_id": session.id,
            "b_worker": claimant.worker,
            "b_now": claimant.now,
            "b_head": session.head_turn_id,
        }
        return db.execute(self._q.claim_next, binds).one_or_none()

    def _claim(
        self, db: StoreConnection, run: Any, row: SessionRow, claimant: Claimant, *, seq_floor: int
    ) -> Claim:
        """Claim ``run`` (its locked row, as it was before the claim) given its session's
        ``row``: its writes, then what the claimant is handed."""
        stored = turn_of_next_run(run)
        turn = _hung_under_head(stored, run.attempts, row.head_turn_id)
        if turn is not stored:
            db.execute(q.SET_PARENT, {"b_turn_id": run.turn_id, "b_parent_id": turn.parent_id})
        started = _started(run, claimant.worker, seq_floor)
        db.execute(
            q.CLAIM_RUN,
            {
                "b_run_id": run.id,
                "b_worker": claimant.worker,
                "b_now": claimant.now,
                "b_seq": started.seq,
            },
        )
        write_events(db, self._q, [started], claimant.now)
        return self._claimed(db, run, row, turn, started, claimant)

    def _take_written_claim(
        self, db: StoreConnection, run: Any, row: SessionRow, claimant: Claimant, *, seq_floor: int
    ) -> Claim:
        """The claim of ``run`` (its row as it was before the claim) whose writes the
        statement that read it made already."""
        turn = _hung_under_head(turn_of_next_run(run), run.attempts, row.head_turn_id)
        started = _started(run, claimant.worker, seq_floor)
        return self._claimed(db, run, row, turn, started, claimant)

    def _claimed(
        self,
        db: StoreConnection,
        run: Any,
        row: SessionRow,
        turn: TurnRecord,
        started: Event,
        claimant: Claimant,
    ) -> Claim:
        """What the claimant of ``run`` is handed.  The steps of history turns it knows
        are not loaded."""
        session = session_record(row)
        head = claimant.head
        generation = head.generation if head else int(row.prefix_generation)
        path = _known_path(head, turn)
        if path is None:
            path = read_path(db, turn.parent_id)
        known = claimant.known
        skipped = {p.turn_id for p in path if known(p.turn_id)} if known else set()
        run_ids = [p.run_id for p in path if p.turn_id not in skipped]
        steps = read_steps(db, run_ids + ([run.id] if run.steps else []))
        claimed = ClaimedTurn(
            session=session,
            turn=turn,
            run=run_state_of(run),
            prefix=self._prefix_in_force(db, session, head, generation),
            prefix_generation=generation,
            history=tuple(
                PathTurn(
                    turn=p,
                    steps=None if p.turn_id in skipped else tuple(steps.get(p.run_id, ())),
                )
                for p in path
            ),
            steps=tuple(steps.get(run.id, ())),
            pending=_counted_pending(db, run),
            previous_status=run.status,
            next_seq=started.seq + 1,
        )
        return claimed, started

    def _prefix_in_force(
        self,
        db: StoreConnection,
        session: SessionRecord,
        head: KnownHead | None,
        generation: int,
    ) -> Prefix | None:
        if head is not None and head.prefix is not None:
            return head.prefix
        return self._prefix(db, session.session_id, generation)

    def _prefix(self, db: StoreConnection, session_id: str, generation: int) -> Prefix | None:
        if generation == 0:
            return None
        payload = db.execute(
            q.PREFIX, {"b_session_id": session_id, "b_generation": generation}
        ).scalar_one()
        return Prefix.from_json(payload)


def _hung_under_head(turn: TurnRecord, attempts: int, head: str | None) -> TurnRecord:
    """``turn`` as its claim leaves it: a queued turn hangs under the head as it is when
    it starts (a turn is stored without a parent, so only a session's first turn is left
    as it is)."""
    if attempts == 0 and turn.parent_id != head:
        return replace(turn, parent_id=head)
    return turn


def _started(run: Any, worker: str, seq_floor: int) -> Event:
    """The ``started`` event of ``run``'s claim, numbered past ``seq_floor``."""
    seq = max(run.last_seq, seq_floor) + 1
    return Event.of(
        run.turn_id, seq, Started(run_id=run.id, attempt=run.attempts + 1, worker=worker)
    )


def _known_path(head: KnownHead | None, turn: TurnRecord) -> list[TurnRecord] | None:
    """The path root → ``turn``'s parent as the turn's end before it knew it (None: read
    it)."""
    if head is not None and head.path is not None and turn.parent_id == head.turn_id:
        return list(head.path)
    return None


def _counted_pending(db: StoreConnection, run: Any) -> tuple[Steer, ...]:
    """The steers the run row counted: a claim made in a statement of its own no longer
    holds the row, and a later steer reaches the first boundary anyway."""
    if run.steer_count <= run.steer_cursor:
        return ()
    pending = read_pending(db, run.id, run.steer_cursor)
    return tuple(s for s in pending if s.position <= run.steer_count)
