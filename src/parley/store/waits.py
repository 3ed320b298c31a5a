"""The store's side of waiting for an event (docs/time.md#waiting-for-an-event): a held
step's waits, signals sent to a turn, and the deadlines that come.

Every change to a wait or a signal is made in a transaction that holds the run row
(locked first, as every writer of a run locks it): a signal is inserted and, if a call
of the turn waits for its name, delivered to the first one in the same transaction, or
kept; a new wait takes the oldest signal kept for its name.  Each wait ends once, from
``waiting`` (signalled, timed out or cancelled), and each signal is delivered once (its
``wait_id`` set from NULL), so a signal wakes one call exactly once whatever crashes and
retries happen around it.  When a run's last wait ended, the run is queued again in its
place in the session's line and the caller kicks its session; what woke it is durable
before anything is signalled.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from parley.ports.admission import Priority
from parley.ports.backend import EventHold, EventWait
from parley.schemas.errors import Fenced, TurnEnded, TurnNotFound
from parley.schemas.events import Event
from parley.schemas.records import SteerKind
from parley.store import statements as q
from parley.store.approvals import Answered
from parley.store.claims import Claims
from parley.store.clock import utc_now
from parley.store.connection import StoreConnection, Transactions
from parley.store.rows import aware, read_pending, write_events
from parley.store.statements import waits as wq

UNFINISHED = (q.QUEUED, q.RUNNING, q.WAITING)


@dataclass(frozen=True, kw_only=True)
class Signalled:
    """What sending a signal committed: its id, whether it woke a waiting call
    (``delivered``; else it is kept for a later wait), and, as for an answer, whether
    the turn is runnable again (``answered.runnable``: its session needs a kick)."""

    signal_id: str
    delivered: bool
    answered: Answered


class WaitStore:
    """Waits and signals (see the module docstring)."""

    def __init__(self, db: Transactions, claims: Claims) -> None:
        self._db = db
        self._claims = claims

    def hold_for_event(
        self, *, run_id: str, session_id: str, fence: int, hold: EventHold, events: Sequence[Event]
    ) -> bool:
        """Hold a step whose calls wait (see :meth:`parley.ports.backend.Store.hold_for_event`)."""
        now = utc_now()
        with self._db.tx() as db:
            self._claims.check_fence(db, session_id, fence)
            db.execute(q.LOCK_RUN, {"b_run_id": run_id}).one()
            for wait in hold.waits:
                wait_id = str(uuid.uuid4())
                db.execute(
                    wq.INSERT_WAIT,
                    {
                        "id": wait_id,
                        "run_id": run_id,
                        "turn_id": hold.turn_id,
                        "step_index": hold.step,
                        "position": wait.position,
                        "call_id": wait.call_id,
                        "event": wait.event,
                        "until": wait.until,
                        "state": wq.WAIT_WAITING,
                        "created_at": now,
                    },
                )
                if wait.event is not None:
                    kept = db.execute(
                        wq.KEPT_SIGNAL, {"b_run_id": run_id, "b_name": wait.event}
                    ).scalar_one_or_none()
                    if kept is not None:
                        _deliver(db, kept, wait_id, now)
            # An interrupt accepted before the hold (it found no wait to end) ends these:
            # the turn goes on at once to commit the step and stop at its boundary.
            if any(s.kind is SteerKind.INTERRUPT for s in read_pending(db, run_id, hold.cursor)):
                db.execute(wq.CANCEL_WAITS, {"b_run_id": run_id, "b_now": now})
            still = db.execute(wq.STILL_WAITING, {"b_run_id": run_id}).one()
            binds = {
                "b_run_id": run_id,
                "b_held_step": hold.held_step,
                "b_now": now,
                "b_last_seq": max((e.seq for e in events), default=0),
                "b_not_before": still.until,
                "b_waiting_event": still.event,
            }
            met = not still.left
            statement = wq.KEEP_HELD_STEP if met else wq.HOLD_FOR_EVENT
            if db.execute(statement, binds).rowcount != 1:
                raise Fenced(f"run {run_id} moved on; its step was not held")
            write_events(db, self._db.q, events, now)
        return met

    def waits_of_step(self, run_id: str, step: int) -> dict[str, EventWait]:
        """The waits of a run's step by call id, each with the payload that woke it."""
        rows = self._db.reading(
            lambda db: db.execute(wq.WAITS_OF_STEP, {"b_run_id": run_id, "b_step": step}).all()
        )
        return {
            row.call_id: EventWait(
                call_id=row.call_id,
                position=row.position,
                event=row.event,
                until=None if row.until is None else aware(row.until),
                state=row.state,
                payload=row.payload,
            )
            for row in rows
        }

    def signal_turn(self, turn_id: str, name: str, payload: Any) -> Signalled:
        """Send signal ``name`` with ``payload`` to a turn: delivered to its first call
        waiting for ``name``, else kept for the next one.  :class:`TurnNotFound` for no
        such turn, :class:`TurnEnded` once it has ended (nothing is kept)."""
        now = utc_now()
        with self._db.tx() as db:
            run_id = db.execute(q.RUN_ID_OF_TURN, {"b_turn_id": turn_id}).scalar_one_or_none()
            if run_id is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            db.execute(q.LOCK_RUN, {"b_run_id": run_id}).one()
            run = db.execute(q.RUN_BY_ID, {"b_run_id": run_id}).one()
            if run.status not in UNFINISHED:
                raise TurnEnded(
                    f"the turn has ended ({run.status}); the signal {name!r} was not kept"
                )
            signal_id = str(uuid.uuid4())
            db.execute(
                wq.INSERT_SIGNAL,
                {
                    "id": signal_id,
                    "run_id": run_id,
                    "turn_id": turn_id,
                    "name": name,
                    "payload": payload,
                    "sent_at": now,
                },
            )
            wait_id = db.execute(
                wq.FIRST_WAITING, {"b_run_id": run_id, "b_name": name}
            ).scalar_one_or_none()
            runnable = False
            if wait_id is not None:
                _deliver(db, signal_id, wait_id, now)
                runnable = self._requeue_if_done(db, run_id) is not None
        answered = Answered(
            session_id=run.session_id, turn_id=turn_id, approvals=(), events=(), runnable=runnable
        )
        return Signalled(signal_id=signal_id, delivered=wait_id is not None, answered=answered)

    def cancel_waits(self, db: StoreConnection, run_id: str) -> str | None:
        """In the caller's transaction (which holds the run row): cancel every wait of
        the run still waiting (an interrupt); the run's session, if that made it
        runnable (it needs a kick)."""
        if not db.execute(wq.CANCEL_WAITS, {"b_run_id": run_id, "b_now": utc_now()}).rowcount:
            return None
        requeued = self._requeue_if_done(db, run_id)
        return None if requeued is None else requeued[0]

    def release_due_waits(
        self, limit: int = 1000, now: datetime | None = None
    ) -> list[tuple[str, Priority]]:
        """Time out the waits whose deadline has come, up to ``limit`` runs of them, soonest
        first, read from the index of runs waiting with a deadline (so it costs what is
        due): each run in a transaction of its own; those made runnable are returned,
        each with its lane, for the caller to kick."""
        now = now or utc_now()
        due = self._db.reading(
            lambda db: list(db.execute(wq.DUE_WAITS, {"b_now": now, "b_limit": limit}).scalars())
        )
        released: list[tuple[str, Priority]] = []
        for run_id in due:
            with self._db.tx() as db:
                db.execute(q.LOCK_RUN, {"b_run_id": run_id}).one()
                db.execute(wq.TIME_OUT_WAITS, {"b_run_id": run_id, "b_now": now})
                requeued = self._requeue_if_done(db, run_id)
            if requeued is not None:
                released.append(requeued)
        return released

    def waiting_for_events(self) -> dict[str, tuple[int, datetime | None]]:
        """Turns waiting for an event per tenant, with the soonest deadline among them."""
        rows = self._db.reading(lambda db: db.execute(wq.WAITING_FOR_EVENTS).all())
        return {
            row.tenant: (int(row.waiting), None if row.until is None else aware(row.until))
            for row in rows
        }

    def _requeue_if_done(self, db: StoreConnection, run_id: str) -> tuple[str, Priority] | None:
        """The run's waits changed: queue it again if none still waits (its session and
        lane), else move its deadline to the soonest of those left."""
        still = db.execute(wq.STILL_WAITING, {"b_run_id": run_id}).one()
        if still.left:
            db.execute(
                wq.MOVE_DEADLINE,
                {"b_run_id": run_id, "b_not_before": still.until, "b_waiting_event": still.event},
            )
            return None
        row = db.execute(wq.REQUEUE_WAITED, {"b_run_id": run_id}).one_or_none()
        return None if row is None else (row.session_id, row.priority)


def _deliver(db: StoreConnection, signal_id: str, wait_id: str, now: datetime) -> None:
    """Deliver a signal to a wait, both taken from their open state in the caller's
    transaction (which holds the run row)."""
    binds = {"b_signal_id": signal_id, "b_wait_id": wait_id, "b_now": now}
    delivered = db.execute(wq.DELIVER_SIGNAL, binds).rowcount
    woken = db.execute(wq.SIGNAL_WAIT, binds).rowcount
    if delivered != 1 or woken != 1:  # the run row's lock makes this impossible
        raise Fenced(f"signal {signal_id} or wait {wait_id} changed under the run's lock")
