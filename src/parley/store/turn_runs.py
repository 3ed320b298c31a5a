"""The store's side a driver uses: take a session (a new fence) and claim its next
runnable turn (:mod:`parley.store.claims`), commit each step whole, hold a step that
waits for answers, close the inbox, and commit a turn's end with the claim of the next
one (:mod:`parley.store.turn_ends`).  Every write is fenced: it updates the session row
``WHERE fence = :fence``, so a driver whose token is stale changes nothing
(:class:`Fenced`).  Step inserts are ``ON CONFLICT DO NOTHING`` and guarded by
``runs.steps = :index``, so a commit retried after a cold shutdown can never write a step
twice."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from parley.ports.admission import Priority
from parley.ports.backend import CommittedStep, FinishReceipt, StepReceipt, TurnEnd
from parley.schemas.compactions import CompactionDraft, CompactionRecord
from parley.schemas.errors import Fenced
from parley.schemas.events import Event
from parley.schemas.messages import StepPayload
from parley.schemas.records import Approval, Steer
from parley.store import statements as q
from parley.store.claims import Claims
from parley.store.clock import utc_now
from parley.store.compactions import compacted_payload, insert_compaction
from parley.store.connection import Transactions
from parley.store.rows import approval_of, insert_step, read_pending, write_events
from parley.store.turn_ends import RunCommit, StepNotFinal, TurnEnds


class TurnRunStore:
    """The driver's protocol (see the module docstring); one transaction per method."""

    def __init__(self, db: Transactions, claims: Claims, ends: TurnEnds) -> None:
        self._db = db
        self._claims = claims
        self._ends = ends

    def sessions_with_work(self) -> list[str]:
        """Sessions that have a queued or running turn (for sweepers and startup)."""
        return [session_id for session_id, _lane in self.sessions_with_work_lanes()]

    def sessions_with_work_lanes(self) -> list[tuple[str, Priority]]:
        """Sessions that have a queued or running turn (none waiting for answers or for
        capacity still to come), each with its most urgent lane."""
        rows = self._db.reading(
            lambda db: db.execute(q.SESSIONS_WITH_WORK, {"b_now": utc_now()}).all()
        )
        return [(row.session_id, row.priority) for row in rows]

    def release_due_runs(self, limit: int = 1000) -> list[tuple[str, Priority]]:
        """The queued runs whose time has come (a delayed turn's, or the capacity a
        deferred one waited for), up to ``limit`` of them, oldest first, made runnable:
        their sessions, each with its run's lane, for the caller to kick.  It reads only
        the runs waiting for a time, from the index that holds them, so it costs what
        is due, not what waits (docs/time.md#delayed-turns)."""
        with self._db.tx() as db:
            rows = db.execute(q.RELEASE_DUE, {"b_now": utc_now(), "b_limit": limit}).all()
        return [(row.session_id, row.priority) for row in rows]

    def defer_run(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        not_before: datetime,
        events: Sequence[Event],
    ) -> None:
        """The turn waits for provider capacity (docs/admission.md): its run is queued
        again in its place in the session's line, not to be claimed before
        ``not_before``, and ``events`` (its ``throttled``) are stored, in one transaction
        under the session's fence.  The driver then lets the session go."""
        with self._db.tx() as db:
            self._claims.check_fence(db, session_id, fence)
            deferred = db.execute(
                q.DEFER_RUN,
                {
                    "b_run_id": run_id,
                    "b_not_before": not_before,
                    "b_now": utc_now(),
                    "b_last_seq": max((e.seq for e in events), default=0),
                },
            ).rowcount
            if deferred != 1:
                raise Fenced(f"run {run_id} moved on; it was not deferred")
            write_events(db, self._db.q, events, utc_now())

    def compact_for_run(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        draft: CompactionDraft,
        seq: int,
        events: Sequence[Event],
    ) -> tuple[CompactionRecord, Event]:
        """Store a compaction the run made before its first model call, in one
        transaction under the session's fence: the record, ``events`` and its
        ``compacted`` event (numbered ``seq``), and what making it cost, charged to the
        run and the session (docs/compaction.md#when)."""
        with self._db.tx() as db:
            self._claims.check_fence(db, session_id, fence)
            record = insert_compaction(db, draft)
            event = Event.of(draft.made_by_turn_id or "", seq, compacted_payload(record))
            write_events(db, self._db.q, [*events, event], record.created_at)
            db.execute(q.NOTE_EVENT_ON_RUN, {"b_run_id": run_id, "b_seq": seq})
            usage = draft.usage
            if usage is not None and usage.total:
                db.execute(
                    q.CHARGE_RUN,
                    {
                        "b_run_id": run_id,
                        "b_input_tokens": usage.input_tokens,
                        "b_output_tokens": usage.output_tokens,
                        "b_cached_tokens": usage.cached_tokens,
                    },
                )
                binds = {"b_session_id": session_id, "b_fence": fence, "b_tokens": usage.total}
                db.execute(q.CHARGE_SESSION, binds)
            return record, event

    def set_trace_context(self, run_id: str, trace_context: dict[str, str]) -> None:
        """Give a run submitted without a trace context this one (its first traced
        attempt's); one it has already is kept (docs/operations.md#traces)."""
        with self._db.tx() as db:
            db.execute(q.SET_TRACE_CONTEXT, {"b_run_id": run_id, "b_trace_context": trace_context})

    def commit_step(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        step: CommittedStep,
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
        commit = RunCommit(
            run_id=run_id,
            session_id=session_id,
            fence=fence,
            cursor=steer_cursor,
            events=events,
            now=utc_now(),
        )
        if end is not None:
            try:
                with self._db.tx() as db:
                    finished = self._ends.end_turn(db, commit, end, step=(step.index, step.payload))
                return StepReceipt(finished=finished)
            except StepNotFinal:
                pass  # a steer arrived meanwhile, or the run moved on: the step alone, below
        return self._commit_step_alone(
            commit, step.index, step.payload, close_inbox_if_idle or end is not None
        )

    def _commit_step_alone(
        self, commit: RunCommit, index: int, payload: StepPayload, close: bool
    ) -> StepReceipt:
        usage = payload.usage
        with self._db.tx() as db:
            charged = db.execute(
                q.CHARGE_SESSION,
                {
                    "b_session_id": commit.session_id,
                    "b_fence": commit.fence,
                    "b_tokens": usage.total,
                },
            ).rowcount
            if charged != 1:
                raise Fenced(f"fence {commit.fence} is stale; step {index} not committed")
            steer_count = db.execute(
                q.ADVANCE_RUN,
                {
                    "b_run_id": commit.run_id,
                    "b_index": index,
                    "b_input_tokens": usage.input_tokens,
                    "b_output_tokens": usage.output_tokens,
                    "b_cached_tokens": usage.cached_tokens,
                    "b_cursor": commit.cursor,
                    "b_last_seq": max((e.seq for e in commit.events), default=0),
                    "b_close": close,
                },
            ).scalar_one_or_none()
            if steer_count is None:
                raise Fenced(f"run {commit.run_id} moved on; step {index} not committed")
            insert_step(db, self._db.q, commit.run_id, index, payload, commit.now)
            write_events(db, self._db.q, commit.events, commit.now)
            # Nothing pending: if asked, the inbox is closed.  Pending steers are read at
            # the next boundary, from the turn's steer list where it has them all.
            return StepReceipt(steer_count=int(steer_count))

    def hold_step(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        held_step: dict[str, Any],
        approvals: Sequence[Approval],
        events: Sequence[Event],
    ) -> None:
        """The step waits for answers: the run becomes ``waiting`` holding ``held_step``,
        each asked call gets its approval row, and ``events`` are stored, in one
        transaction under the session's fence.  The driver then lets the session go."""
        now = utc_now()
        with self._db.tx() as db:
            self._claims.check_fence(db, session_id, fence)
            held = db.execute(
                q.HOLD_RUN,
                {
                    "b_run_id": run_id,
                    "b_held_step": held_step,
                    "b_now": now,
                    "b_asked": len(approvals),
                    "b_last_seq": max((e.seq for e in events), default=0),
                },
            ).rowcount
            if held != 1:
                raise Fenced(f"run {run_id} moved on; its step was not held")
            for position, approval in enumerate(approvals):
                db.execute(q.INSERT_APPROVAL, _approval_row(approval, run_id, position))
            write_events(db, self._db.q, events, now)

    def approvals_of_run(self, run_id: str) -> dict[str, Approval]:
        """A run's approvals by id, in step and call order."""
        rows = self._db.reading(
            lambda db: db.execute(q.APPROVALS_OF_RUN, {"b_run_id": run_id}).all()
        )
        return {row.id: approval_of(row) for row in rows}

    def consume_approval(self, *, approval_id: str, session_id: str, fence: int) -> bool:
        """Mark an approved call as started, once, under the session's fence: True the
        first time (run it now), False if an earlier attempt marked it (it may have run)."""
        with self._db.tx() as db:
            self._claims.check_fence(db, session_id, fence)
            marked = db.execute(
                q.CONSUME_APPROVAL, {"b_approval_id": approval_id, "b_now": utc_now()}
            ).rowcount
        return bool(marked)

    def close_inbox(
        self, *, run_id: str, session_id: str, fence: int, cursor: int
    ) -> tuple[Steer, ...]:
        """Close the inbox unless steers are pending; returns the pending ones."""
        with self._db.tx() as db:
            self._claims.check_fence(db, session_id, fence)
            db.execute(q.LOCK_RUN, {"b_run_id": run_id}).one()
            pending = read_pending(db, run_id, cursor)
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
        commit = RunCommit(
            run_id=run_id,
            session_id=session_id,
            fence=fence,
            cursor=cursor,
            events=events,
            now=utc_now(),
        )
        with self._db.tx() as db:
            return self._ends.end_turn(db, commit, end)


def _approval_row(approval: Approval, run_id: str, position: int) -> dict[str, Any]:
    """The ``approvals`` row of an asked call, undecided."""
    return {
        "id": approval.approval_id,
        "run_id": run_id,
        "turn_id": approval.turn_id,
        "step_index": approval.step,
        "position": position,
        "call_id": approval.call_id,
        "tool": approval.tool,
        "arguments": approval.arguments,
        "accesses": [dict(a) for a in approval.accesses],
        "requested_at": approval.requested_at,
        "expires_at": approval.expires_at,
        "decision": None,
        "reason": None,
        "decided_at": None,
        "consumed_at": None,
    }
