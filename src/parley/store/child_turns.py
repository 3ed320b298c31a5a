"""The store's side of sub-agents (docs/sub-agents.md): a parent's step held for its
agent calls opens each call's child session and turn in the same fenced transaction,
and a child turn's end, in the transaction that commits it, queues the parent again
when it was the last of its step's children.

A call opens its child exactly once: the hold is one transaction (a driver that dies
before it commits opened nothing, and its step is redone), and a child session is
unique on its parent's run, step and call id.  Two children ending at the same moment
both lock the parent's run before counting the step's unfinished children, so the
second sees the first's end and the parent is queued once (by whichever is last).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from parley.ports.backend import ChildEnd, ChildTurn, Kick, Spawned
from parley.schemas.errors import Fenced
from parley.schemas.events import AgentEnded, Event, Queued
from parley.schemas.records import TurnStatus
from parley.store import statements as q
from parley.store.claims import Claims
from parley.store.clock import utc_now
from parley.store.connection import StoreConnection, Transactions
from parley.store.rows import SessionRow, write_events
from parley.store.session_titles import title_of_prompt
from parley.store.submissions import lock_for_resume, requeue_ended, resumable


class ChildTurnStore:
    """Child turns of held steps (see the module docstring)."""

    def __init__(self, db: Transactions, claims: Claims) -> None:
        self._db = db
        self._claims = claims

    def children_of_step(self, run_id: str, step: int) -> dict[str, ChildEnd]:
        """The child turns of ``run_id``'s step ``step``, by call id."""
        rows = self._db.reading(
            lambda db: db.execute(q.CHILDREN_OF_STEP, {"b_run_id": run_id, "b_step": step}).all()
        )
        return {row.call_id: _child_end(row) for row in rows}

    def unfinished_children(self, turn_id: str) -> list[str]:
        """The child turns of ``turn_id``'s agent calls that have not ended (an
        interrupt of the parent reaches them)."""
        return self._db.reading(
            lambda db: list(db.execute(q.UNFINISHED_CHILD_TURNS, {"b_turn_id": turn_id}).scalars())
        )

    def resumable_children(self, run_id: str, step: int) -> list[ChildEnd]:
        """The children of ``run_id``'s step ``step`` that an interrupt of their parent
        cancelled and that may be resumed (nothing followed them in their session), in
        the model's order of the calls: those a resume of the parent resumes."""

        def read(db: StoreConnection) -> list[ChildEnd]:
            rows = db.execute(
                q.CANCELLED_CHILDREN_OF_STEP, {"b_run_id": run_id, "b_step": step}
            ).all()
            return [
                _child_end(row)
                for row in rows
                if resumable(db, row.session_id, row.turn_id, row.status)
            ]

        return self._db.reading(read)

    def resume_for_agents(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        held_step: dict[str, Any],
        children: Sequence[ChildEnd],
        events: Sequence[Event],
        parallel: int,
    ) -> Spawned:
        """A resumed parent's step waits again, for the ``children`` an interrupt
        cancelled: each is resumed (the first ``parallel`` queued, the others waiting for
        a place), the run waits for agents holding ``held_step``, and ``events`` are
        stored, in one transaction under the session's fence.  :class:`Fenced` if a child
        can no longer be resumed (a turn was submitted to its session meanwhile): the
        next driver looks again."""
        now = utc_now()
        with self._db.tx() as db:
            self._claims.check_fence(db, session_id, fence)
            kicks: list[Kick] = []
            queued: list[Event] = []
            # Each child's session and run before the parent's run: the order a child's
            # end locks them in.
            for place, child in enumerate(children):
                run, position = lock_for_resume(db, child.session_id, child.turn_id)
                if run.status != TurnStatus.CANCELLED.value or not resumable(
                    db, child.session_id, child.turn_id, run.status
                ):
                    raise Fenced(f"child turn {child.turn_id} moved on; not resumed")
                queued.append(requeue_ended(db, self._db.q, run, position, 0, now))
                if place >= parallel:
                    db.execute(q.HOLD_BACK_CHILD, {"b_run_id": run.id})
                    continue
                kicks.append(Kick(session_id=child.session_id, priority=run.priority))
            held = db.execute(
                q.HOLD_FOR_AGENTS,
                {
                    "b_run_id": run_id,
                    "b_held_step": held_step,
                    "b_now": now,
                    "b_last_seq": max((e.seq for e in events), default=0),
                },
            ).rowcount
            if held != 1:
                raise Fenced(f"run {run_id} moved on; its step was not held")
            write_events(db, self._db.q, events, now)
            return Spawned(kicks=tuple(kicks), events=tuple(queued))

    def _open_children(
        self,
        db: StoreConnection,
        parent: SessionRow,
        run_id: str,
        step: int,
        children: Sequence[ChildTurn],
        *,
        now: datetime,
        parallel: int,
    ) -> Spawned:
        """In the hold's transaction: each call's child session, turn and run, in the
        parent's root and tenant and on its lane; the first ``parallel`` queued, the
        others waiting for a place (each child's end gives its place to the next)."""
        run = db.execute(q.RUN_BY_ID, {"b_run_id": run_id}).one()
        kicks: list[Kick] = []
        events: list[Event] = []
        for place, child in enumerate(children):
            session_id, turn_id, child_run = child.session_id, child.turn_id, child.run_id
            db.execute(q.INSERT_SESSION, _child_session(parent, run, step, child, session_id, now))
            ordinal = db.execute(q.BUMP_TURN_COUNT, {"b_session_id": session_id}).scalar_one()
            queued = Event.of(turn_id, 1, Queued(run_id=child_run))
            binds = {
                "b_turn_id": turn_id,
                "b_run_id": child_run,
                "b_session_id": session_id,
                "b_position": ordinal,
                "b_prompt": child.task,
                "b_request_id": None,
                "b_contract": child.contract.to_json() if child.contract else None,
                "b_host_context": None,
                # Under the call's span (docs/operations.md#traces), else in the parent's trace.
                "b_trace_context": child.trace_context or run.trace_context,
                "b_priority": run.priority,
                "b_data": queued.data,
                "b_not_before": None,  # a child runs when its parent's step asks for it
                # Microseconds apart, in the model's order: the order held-back children
                # take their places in.
                "b_now": now + timedelta(microseconds=place),
            }
            for statement in (q.INSERT_TURN, q.INSERT_RUN, q.INSERT_QUEUED):
                db.execute(statement, binds)
            events.append(queued)
            if place >= parallel:
                db.execute(q.HOLD_BACK_CHILD, {"b_run_id": child_run})
                continue
            kicks.append(Kick(session_id=session_id, priority=run.priority))
        return Spawned(kicks=tuple(kicks), events=tuple(events))

    def hold_for_agents(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        held_step: dict[str, Any],
        children: Sequence[ChildTurn],
        events: Sequence[Event],
        parallel: int,
    ) -> Spawned:
        """The step waits for its children: the run becomes ``waiting`` for agents,
        holding ``held_step``, each call's child is opened (``parallel`` of them runnable
        at once), and ``events`` are stored, in one transaction under the session's
        fence.  The driver then lets the session go and kicks the children's sessions."""
        now = utc_now()
        with self._db.tx() as db:
            parent = self._claims.check_fence(db, session_id, fence)
            held = db.execute(
                q.HOLD_FOR_AGENTS,
                {
                    "b_run_id": run_id,
                    "b_held_step": held_step,
                    "b_now": now,
                    "b_last_seq": max((e.seq for e in events), default=0),
                },
            ).rowcount
            if held != 1:
                raise Fenced(f"run {run_id} moved on; its step was not held")
            step = int(held_step["index"])
            spawned = self._open_children(
                db, parent, run_id, step, children, now=now, parallel=parallel
            )
            write_events(db, self._db.q, events, now)
            return spawned

    def wake_parent(
        self, db: StoreConnection, child: SessionRow, turn_id: str, outcome: str, now: datetime
    ) -> tuple[tuple[Kick, ...], tuple[Event, ...]]:
        """In a child session's turn-ending transaction: if the turn is the call's child
        turn (the session's first), store its parent's ``agent_ended`` event, give its
        place to the step's next child waiting for one, and, if it was the last of its
        parent step's children to end, queue the parent again.  Returns the sessions to
        kick after the commit, and the parent's event to publish."""
        if child.parent_run_id is None or child.parent_step is None:
            return (), ()
        if db.execute(q.TURN_ORDINAL, {"b_turn_id": turn_id}).scalar_one() != 1:
            return (), ()  # a later turn of the child session: not the call's
        binds = {"b_run_id": child.parent_run_id, "b_step": child.parent_step}
        # Locked before counting: of two children ending at once, the second to lock
        # sees the first's end, so exactly one of them finds none left (and no place
        # is given twice).
        db.execute(q.LOCK_RUN, binds).one_or_none()
        ended = self._agent_ended(db, child, turn_id, outcome, now)
        waiting = db.execute(q.NEXT_HELD_BACK_CHILD, binds).scalar_one_or_none()
        if waiting is not None:
            placed = db.execute(q.PLACE_CHILD, {"b_run_id": waiting}).one()
            return (Kick(session_id=placed.session_id, priority=placed.priority),), ended
        if db.execute(q.UNFINISHED_CHILDREN, binds).scalar_one():
            return (), ended
        woken = db.execute(q.REQUEUE_PARENT, binds).one_or_none()
        if woken is None:
            return (), ended  # it went on already (an interrupt), or waits for no children
        return (Kick(session_id=woken.session_id, priority=woken.priority),), ended

    def _agent_ended(
        self, db: StoreConnection, child: SessionRow, turn_id: str, outcome: str, now: datetime
    ) -> tuple[Event, ...]:
        """The parent's ``agent_ended`` event, numbered after its last (no driver holds
        the parent while it waits for its children, as while it waits for answers)."""
        parent_run = child.parent_run_id
        seq = db.execute(q.TAKE_SEQS, {"b_run_id": parent_run, "b_count": 1}).scalar_one_or_none()
        if seq is None or child.parent_turn_id is None or child.parent_call_id is None:
            return ()
        event = Event.of(
            child.parent_turn_id,
            int(seq),
            AgentEnded(
                call_id=child.parent_call_id,
                outcome=outcome,
                agent=child.agent or "",
                turn_id=turn_id,
            ),
        )
        write_events(db, self._db.q, [event], now)
        return (event,)


def _child_end(row: Any) -> ChildEnd:
    return ChildEnd(
        call_id=row.call_id,
        agent=row.agent,
        session_id=row.session_id,
        turn_id=row.turn_id,
        status=TurnStatus(row.status),
        reply=row.reply,
        error=row.error,
    )


def _child_session(
    parent: SessionRow, run: Any, step: int, child: ChildTurn, session_id: str, now: datetime
) -> dict[str, Any]:
    """A child session's row: the parent's root, tenant and retention, linked to the
    call that opens it."""
    return {
        "id": session_id,
        "root": parent.root,
        "metadata": {},
        "head_turn_id": None,
        "fence": 0,
        "turn_count": 0,
        "tokens_used": 0,
        "token_ceiling": None,
        "prefix_generation": 0,
        "created_at": now,
        "tenant": parent.tenant,
        "retention_seconds": parent.retention_seconds,
        "webhook_url": None,
        "last_active_at": now,
        "title": title_of_prompt(child.task),
        "batch_id": None,
        "parent_run_id": run.id,
        "parent_step": step,
        "parent_call_id": child.call_id,
        "parent_turn_id": run.turn_id,
        "agent": child.agent,
    }
