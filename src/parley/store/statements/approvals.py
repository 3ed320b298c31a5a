"""Statements on approvals: a step that waits for answers, the answers, and the run's
return to its place in line once every answer is in."""

from __future__ import annotations

from sqlalchemy import func, select, update

from parley.schemas import tables as t
from parley.store.statements.binds import b
from parley.store.statements.run_status import (
    QUEUED,
    WAITING,
    WAITING_FOR_APPROVAL,
    hold_step,
)

# A driver's step waits for answers: the run waits, holding its step (fenced by the
# session row the caller locked, and only while it runs), and gives a place it held in
# the batch window back (answered, it waits for one again).
HOLD_RUN = hold_step(WAITING_FOR_APPROVAL, approval_count=t.runs.c.approval_count + b("asked"))

INSERT_APPROVAL = t.approvals.insert()

APPROVALS_OF_TURN = (
    select(t.approvals)
    .where(t.approvals.c.turn_id == b("turn_id"))
    .order_by(t.approvals.c.step_index, t.approvals.c.position)
)

APPROVALS_OF_RUN = (
    select(t.approvals)
    .where(t.approvals.c.run_id == b("run_id"))
    .order_by(t.approvals.c.step_index, t.approvals.c.position)
)

APPROVAL = select(t.approvals).where(t.approvals.c.id == b("approval_id"))

DECIDE_APPROVAL = (
    update(t.approvals)
    .where(t.approvals.c.id == b("approval_id"), t.approvals.c.decision.is_(None))
    .values(decision=b("decision"), reason=b("reason"), decided_at=b("now"))
)

UNDECIDED_OF_RUN = select(func.count()).where(
    t.approvals.c.run_id == b("run_id"), t.approvals.c.decision.is_(None)
)

UNDECIDED_IDS_OF_RUN = select(t.approvals.c.id).where(
    t.approvals.c.run_id == b("run_id"), t.approvals.c.decision.is_(None)
)

# Every answer is in: the run is runnable again, in its place in the session's line.
REQUEUE_WAITING = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.status == WAITING)
    .values(status=QUEUED)
)

# Seqs for events written while no driver holds the turn (answers to a waiting one).
TAKE_SEQS = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"))
    .values(last_seq=t.runs.c.last_seq + b("count"))
    .returning(t.runs.c.last_seq)
)

# An approved call is about to run: marked once (an attempt that finds it marked does not
# run it again for the same answer).
CONSUME_APPROVAL = (
    update(t.approvals)
    .where(
        t.approvals.c.id == b("approval_id"),
        t.approvals.c.decision == "approved",
        t.approvals.c.consumed_at.is_(None),
    )
    .values(consumed_at=b("now"))
)

EXPIRED_APPROVALS = select(t.approvals.c.id, t.approvals.c.turn_id).where(
    t.approvals.c.decision.is_(None), t.approvals.c.expires_at <= b("now")
)
