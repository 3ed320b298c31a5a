"""The store's side of approvals (docs/approvals.md) for those who answer: list a turn's asked
calls, answer one exactly once, deny every pending one of an interrupted turn, and deny
those whose time is up.

Each answer commits in one transaction with its ``approval_answered`` event: the run row
is locked first (as every writer of a run locks it, before its approvals), the answer
is written only over no answer (a second one is :class:`Conflict`, naming the first),
and when it was the step's last the run is ``queued`` again in its place in the
session's line.  The caller then publishes the events and, if the run is runnable, kicks
the session: the answer is durable before anything is signalled.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from parley.schemas.errors import Conflict, InvalidRequest, TurnNotFound
from parley.schemas.events import ApprovalAnswered, Event
from parley.schemas.records import Approval, Decision
from parley.store import statements as q
from parley.store.clock import utc_now
from parley.store.connection import StoreConnection, Transactions
from parley.store.rows import approval_of, read_approvals, write_events

INTERRUPTED = "interrupted"
TIMED_OUT = "timed out"


@dataclass(frozen=True, kw_only=True)
class Answered:
    """What answering committed: the answered calls, their stored events (to publish),
    and whether their turn is runnable again (its session needs a kick)."""

    session_id: str
    turn_id: str
    approvals: tuple[Approval, ...]
    events: tuple[Event, ...]
    runnable: bool


class ApprovalStore:
    """Answers to the calls that wait (see the module docstring)."""

    def __init__(self, db: Transactions) -> None:
        self._db = db

    def approvals(self, turn_id: str) -> tuple[Approval, ...]:
        """Every call of the turn that asked, answered or not, in step and call order."""
        return self._db.reading(lambda db: read_approvals(db, turn_id))

    def answer_approval(
        self, turn_id: str, approval_id: str, decision: Decision, reason: str | None
    ) -> Answered:
        """Answer one call of ``turn_id``: :class:`InvalidRequest` for a call it does not
        have, :class:`Conflict` if it has its answer already."""
        with self._db.tx() as db:
            row = db.execute(q.APPROVAL, {"b_approval_id": approval_id}).one_or_none()
            if row is None or row.turn_id != turn_id:
                run = db.execute(q.RUN_ID_OF_TURN, {"b_turn_id": turn_id}).scalar_one_or_none()
                if run is None:
                    raise TurnNotFound(f"no turn {turn_id!r}")
                raise InvalidRequest(f"turn {turn_id!r} has no call {approval_id!r} to answer")
            db.execute(q.LOCK_RUN, {"b_run_id": row.run_id})
            return self._answer(db, row.run_id, [approval_id], decision, reason, strict=True)

    def deny_pending(self, db: StoreConnection, run_id: str, reason: str) -> Answered | None:
        """In the caller's transaction (which holds the run row): deny every unanswered
        call of the run, if it waits (an interrupt: no call may stay without a result)."""
        pending = list(db.execute(q.UNDECIDED_IDS_OF_RUN, {"b_run_id": run_id}).scalars())
        if not pending:
            return None
        return self._answer(db, run_id, pending, Decision.DENIED, reason, strict=False)

    def expire_approvals(self, now: datetime | None = None) -> list[Answered]:
        """Deny, as ``timed out``, every unanswered call whose ``expires_at`` has passed:
        one transaction per call (one answered meanwhile is left as answered)."""
        due = self._db.reading(
            lambda db: db.execute(q.EXPIRED_APPROVALS, {"b_now": now or utc_now()}).all()
        )
        answered = []
        for row in due:
            try:
                answered.append(
                    self.answer_approval(row.turn_id, row.id, Decision.DENIED, TIMED_OUT)
                )
            except Conflict:
                continue  # a person answered first
        return answered

    def _answer(
        self,
        db: StoreConnection,
        run_id: str,
        approval_ids: list[str],
        decision: Decision,
        reason: str | None,
        *,
        strict: bool,
    ) -> Answered:
        now = utc_now()
        decided: list[Approval] = []
        for approval_id in approval_ids:
            changed = db.execute(
                q.DECIDE_APPROVAL,
                {
                    "b_approval_id": approval_id,
                    "b_decision": decision.value,
                    "b_reason": reason,
                    "b_now": now,
                },
            ).rowcount
            row = db.execute(q.APPROVAL, {"b_approval_id": approval_id}).one()
            if not changed:
                if strict:
                    raise _answered_already(approval_of(row))
                continue
            decided.append(approval_of(row))
        run = db.execute(q.RUN_BY_ID, {"b_run_id": run_id}).one()
        events: list[Event] = []
        if decided:
            last = db.execute(
                q.TAKE_SEQS, {"b_run_id": run_id, "b_count": len(decided)}
            ).scalar_one()
            events = [
                Event.of(
                    run.turn_id,
                    last - len(decided) + 1 + n,
                    ApprovalAnswered(
                        approval_id=a.approval_id, decision=decision.value, reason=reason
                    ),
                )
                for n, a in enumerate(decided)
            ]
            write_events(db, self._db.q, events, now)
        undecided = db.execute(q.UNDECIDED_OF_RUN, {"b_run_id": run_id}).scalar_one()
        runnable = False
        if not undecided:
            runnable = db.execute(q.REQUEUE_WAITING, {"b_run_id": run_id}).rowcount == 1
        return Answered(
            session_id=run.session_id,
            turn_id=run.turn_id,
            approvals=tuple(decided),
            events=tuple(events),
            runnable=runnable,
        )


def _answered_already(first: Approval) -> Conflict:
    """The refusal of a second answer to a call, naming the first."""
    return Conflict(
        f"call {first.approval_id!r} was {first.decision} already "
        f"(at {first.decided_at:%Y-%m-%d %H:%M:%S} UTC"
        + (f": {first.reason!r})" if first.reason else ")")
    )
