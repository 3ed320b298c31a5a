"""The store's side of steering: a steer accepted into a turn's inbox while it is open
(the run row is the inbox's lock: ``say`` and the inbox close both update it first, so a
steer is either seen by the close or refused with :class:`TurnEnded`), and the steers
past a cursor."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from parley.schemas.errors import TurnEnded, TurnNotFound
from parley.schemas.records import Steer, SteerKind
from parley.store import statements as q
from parley.store.approvals import INTERRUPTED, Answered, ApprovalStore
from parley.store.clock import utc_now
from parley.store.connection import StoreConnection, Transactions
from parley.store.rows import read_pending
from parley.store.waits import WaitStore


@dataclass(frozen=True, kw_only=True)
class SteerReceipt:
    """What ``add_steer`` did: the accepted steer, and for an interrupt of a turn that
    waited for answers, the denials it gave its pending calls (publish them; the turn is
    runnable again, to commit its held step with them and stop)."""

    steer: Steer
    denied: Answered | None = None
    woken: str | None = None
    """For an interrupt of a turn that waited for provider capacity or for an event: its
    session, which needs a kick now (the turn is runnable at once, to stop at its
    boundary)."""


class SteerStore:
    """A turn's steer inbox (see the module docstring)."""

    def __init__(self, db: Transactions, approvals: ApprovalStore, waits: WaitStore) -> None:
        self._db = db
        self._approvals = approvals
        self._waits = waits

    def add_steer(self, turn_id: str, kind: SteerKind, text: str) -> Steer:
        """Accept a steer into a turn's inbox (see :meth:`accept_steer`)."""
        return self.accept_steer(turn_id, kind, text).steer

    def accept_steer(self, turn_id: str, kind: SteerKind, text: str) -> SteerReceipt:
        """Accept a steer into a turn's inbox; :class:`TurnEnded` once the turn ended.  An
        interrupt of a turn that waits for answers also denies its pending calls."""
        with self._db.tx() as db:
            run_id = db.execute(q.RUN_ID_OF_TURN, {"b_turn_id": turn_id}).scalar_one_or_none()
            if run_id is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            steer = self.insert_steer(db, run_id, kind, text, utc_now())
            denied = woken = None
            if kind is SteerKind.INTERRUPT:
                denied = self._approvals.deny_pending(db, run_id, INTERRUPTED)
                # A call waiting for an event stops waiting: the turn commits its held
                # step (the call's result says it was interrupted) and stops.
                woken = self._waits.cancel_waits(db, run_id)
                deferred = db.execute(q.WAKE_DEFERRED, {"b_run_id": run_id}).scalar_one_or_none()
                woken = woken or deferred
            return SteerReceipt(steer=steer, denied=denied, woken=woken)

    def stop_waiting(self, db: StoreConnection, run_id: str) -> str | None:
        """In the caller's transaction, an interrupt's end to a run's waits for events
        (see :meth:`WaitStore.cancel_waits`): its session, if that made it runnable."""
        return self._waits.cancel_waits(db, run_id)

    def insert_steer(
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
        return self._db.reading(lambda db: read_pending(db, run_id, cursor))
