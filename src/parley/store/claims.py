"""The store's side of a claim: a driver takes a session (a new fencing token) and claims
its next runnable turn, given everything the turn needs to run: the session, the path
(from the root, or from the compaction that applies) with the steps of each turn the
driver does not know, the prefix in force,
its own committed steps and the steers the run counted.

A claim either makes its writes here (the turn hung under the head, the run counted
running, its ``started`` event stored: :meth:`Claims._claim`) or finds them made by the
PostgreSQL statement that read the run (:meth:`Claims._take_written_claim`); both hand
back the same claim."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Literal

from parley.coordination import constants as c
from parley.ports.backend import Claim, ClaimedTurn, KnownTurns, PathTurn, SeqFloor
from parley.schemas.compactions import CompactionRecord
from parley.schemas.errors import Fenced, SessionNotFound
from parley.schemas.events import Event, Started
from parley.schemas.messages import Prefix
from parley.schemas.records import SessionRecord, Steer, TurnRecord
from parley.store import statements as q
from parley.store.clock import utc_now
from parley.store.compactions import known_compacted_path, read_compacted_path
from parley.store.connection import StoreConnection, Transactions
from parley.store.rows import (
    SessionRow,
    aware,
    read_pending,
    read_steps,
    run_state_of,
    session_record,
    turn_of_next_run,
    write_events,
)
from parley.store.statements import window as wq

NO_SESSION = "00000000-0000-0000-0000-000000000000"
"""An id no session has (ids are uuid4s): what ``warm_claims`` claims."""


@dataclass(frozen=True, kw_only=True)
class KnownHead:
    """The session as a turn's final transaction leaves it, for the claim of the next
    turn in the same transaction.  The session row was read before this transaction
    froze a first prefix, so the generation in force is carried here; and what the
    ending turn knows spares reading it back: the prefix of that generation and the
    path to ``turn_id`` (each None when not known): the turns after ``compaction``, the
    compaction that applied to the ending turn (None: the path from the root)."""

    turn_id: str | None
    generation: int
    prefix: Prefix | None
    path: tuple[TurnRecord, ...] | None
    compaction: CompactionRecord | None = None


@dataclass(frozen=True, kw_only=True)
class Claimant:
    """Who claims a run and what it knows: its ``worker`` name, the history turns it
    ``known`` (their steps are not loaded), the session as a turn's end earlier in the
    same transaction left it (``head``), and the claim's time."""

    worker: str
    known: KnownTurns | None
    head: KnownHead | None
    now: datetime


class Claims:
    """Taking a session and claiming its next runnable turn (see the module docstring)."""

    def __init__(self, db: Transactions) -> None:
        self._db = db

    def check_fence(self, db: StoreConnection, session_id: str, fence: int) -> SessionRow:
        """Lock the session row and return it if ``fence`` still holds; else Fenced."""
        row = db.execute(q.LOCK_SESSION, {"b_session_id": session_id}).one_or_none()
        if row is None or row.fence != fence:
            raise Fenced(f"fence {fence} is stale (now {row.fence if row else None})")
        return SessionRow.of(row)

    def warm_claims(self) -> None:
        """Compile a claim's statements, and connect, before any driver claims: the
        first claim of each statement compiles it, and a hundred drivers of one process
        taking their first kicks at once compile it a hundred times over, holding the
        interpreter for a second.  It claims a session that does not exist: nothing is
        written."""
        with contextlib.suppress(SessionNotFound):
            self.start_drive(NO_SESSION, worker="warm-up", seq_floor=lambda _turn, _fence: 0)

    def start_drive(
        self,
        session_id: str,
        *,
        worker: str,
        seq_floor: SeqFloor,
        known: KnownTurns | None = None,
        held_back: frozenset[str] = frozenset(),
    ) -> tuple[int, Claim | None]:
        """For a driver that just took the session's lock: a new fencing token and, in the
        same transaction, the claim of the session's next runnable turn (if any).  An
        interactive turn of a ``held_back`` tenant is not claimed: it moves to the batch
        lane (src/parley/runtime/interactive_share.py)."""
        if self._db.q.start_drive is not None:
            fence, claim = self._start_in_one_statement(
                self._db.q.start_drive, session_id, worker, known, held_back
            )
            if claim is not False:
                return fence, claim
            # The run needs its buffer adopted first, or the statement's snapshot missed
            # one, or the run waits for its lane: claim in a transaction that holds the
            # session row, under that fence.
            with self._db.tx() as db:
                locked = self.check_fence(db, session_id, fence)
                return fence, self.claim_next(
                    db,
                    locked,
                    fence=fence,
                    worker=worker,
                    seq_floor=seq_floor,
                    known=known,
                    held_back=held_back,
                )
        with self._db.tx() as db:
            row = db.execute(q.TAKE_FENCE, {"b_session_id": session_id}).one_or_none()
            if row is None:
                raise SessionNotFound(f"no session {session_id!r}")
            session = SessionRow.of(row)
            return session.fence, self.claim_next(
                db,
                session,
                fence=session.fence,
                worker=worker,
                seq_floor=seq_floor,
                known=known,
                held_back=held_back,
            )

    def _start_in_one_statement(
        self,
        statement: Any,
        session_id: str,
        worker: str,
        known: KnownTurns | None,
        held_back: frozenset[str],
    ) -> tuple[int, Claim | Literal[False] | None]:
        """PostgreSQL: take the fence and claim a fresh run in one statement on its own
        (``start_drive`` in DialectStatements).  Returns the fence and the claim, None
        when nothing is runnable, or False when the claim must be made in a transaction:
        a run that started before, or a snapshot that missed a submission."""
        now = utc_now()
        self._db.count_transaction()
        with self._db.autocommit() as db:
            binds = {
                "b_session_id": session_id,
                "b_worker": worker,
                "b_now": now,
                "b_held_back": sorted(held_back),
            }
            row = db.execute(statement, binds).one_or_none()
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

    def claim_next(
        self,
        db: StoreConnection,
        session: SessionRow,
        *,
        fence: int,
        worker: str,
        seq_floor: SeqFloor,
        known: KnownTurns | None,
        head: KnownHead | None = None,
        held_back: frozenset[str] = frozenset(),
    ) -> Claim | None:
        """Claim the next runnable turn of ``session`` (its row as read, updated by what
        ``head`` says when a turn's end in this transaction came after the read), unless
        it waits for its lane (see :meth:`_waits_for_its_lane`)."""
        claimant = Claimant(worker=worker, known=known, head=head, now=utc_now())
        run = self._next_run(db, session, claimant, held_back)
        if run is None or run.status == q.WAITING:
            return None  # a turn that waits for answers holds the session's line
        not_before = getattr(run, "not_before", None)
        if not_before is not None and aware(not_before) > claimant.now:
            return None  # so does one that waits for its time (delayed) or for capacity
        if run.status == q.QUEUED and self._waits_for_its_lane(db, run, held_back):
            return None  # and so does its session's line
        if run.status == q.QUEUED and run.priority == "batch" and run.placed_at is None:
            run = SimpleNamespace(**{**run._mapping, "priority": "interactive"})  # promoted
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

    def _waits_for_its_lane(self, db: StoreConnection, run: Any, held_back: frozenset[str]) -> bool:
        """Whether a queued run is not to start now: a batch run without a place in the
        batch window (unless an interactive turn waits behind it: it is promoted), or a
        fresh interactive run of a ``held_back`` tenant (moved to the batch lane, where
        it waits for a place, its tenant's batch work)."""
        if run.priority == "batch" and run.placed_at is None:
            return run.tenant in held_back or not self._promoted(db, run)
        if run.priority == "interactive" and run.attempts == 0 and run.tenant in held_back:
            db.execute(wq.DEMOTE, {"b_run_id": run.id})
            return True
        return False

    def _promoted(self, db: StoreConnection, run: Any) -> bool:
        """Whether a batch run without a place in the batch window moves to the
        interactive lane: an interactive turn of its session waits behind it (someone
        waits for that turn, and turns start in order).  It is then claimed at once, out
        of the window, and its calls and slot count as its tenant's interactive work,
        shared by weight like any (docs/admission.md#interactive-share)."""
        binds = {"b_session_id": run.session_id, "b_position": run.queue_position}
        if db.execute(wq.INTERACTIVE_AFTER, binds).scalar_one_or_none() is None:
            return False
        db.execute(wq.PROMOTE, {"b_run_id": run.id})
        return True

    def _next_run(
        self,
        db: StoreConnection,
        session: SessionRow,
        claimant: Claimant,
        held_back: frozenset[str],
    ) -> Any:
        """The session's next run, locked (None: nothing to drive); on PostgreSQL a fresh
        one is claimed by the same statement (its ``claimed`` column says so)."""
        if self._db.q.claim_next is None:
            return db.execute(q.NEXT_RUN, {"b_session_id": session.id}).one_or_none()
        binds = {
            "b_session_id": session.id,
            "b_worker": claimant.worker,
            "b_now": claimant.now,
            "b_head": session.head_turn_id,
            "b_held_back": sorted(held_back),
        }
        return db.execute(self._db.q.claim_next, binds).one_or_none()

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
        write_events(db, self._db.q, [started], claimant.now)
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
        compaction, path = _compacted_path(db, head, turn, compacted=bool(row.compacted))
        known = claimant.known
        # The model sees the compaction instead of the turns above ``path``: they are
        # not read at all, and the steps of those the claimant holds are not loaded.
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
            compaction=compaction,
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
        return self.prefix_of(db, session.session_id, generation)

    def prefix_of(self, db: StoreConnection, session_id: str, generation: int) -> Prefix | None:
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


def _compacted_path(
    db: StoreConnection, head: KnownHead | None, turn: TurnRecord, *, compacted: bool
) -> tuple[CompactionRecord | None, list[TurnRecord]]:
    """The compaction that applies to ``turn`` and the path after it to ``turn``'s
    parent: from what the turn's end before it knew when it can, else read.  On a
    session that never had a compaction (``compacted`` False, read under its row's
    lock) none applies, and nothing is asked about compactions."""
    if head is not None and head.path is not None and turn.parent_id == head.turn_id:
        if not compacted and head.compaction is None:
            return None, list(head.path)
        found = known_compacted_path(db, head.compaction, head.path)
        if found is not None:
            return found
    return read_compacted_path(db, turn.parent_id, compacted=compacted)


def _counted_pending(db: StoreConnection, run: Any) -> tuple[Steer, ...]:
    """The steers the run row counted: a claim made in a statement of its own no longer
    holds the row, and a later steer reaches the first boundary anyway."""
    if run.steer_count <= run.steer_cursor:
        return ()
    pending = read_pending(db, run.id, run.steer_cursor)
    return tuple(s for s in pending if s.position <= run.steer_count)
