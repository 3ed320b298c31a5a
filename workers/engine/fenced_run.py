"""The fenced identity of one attempt at a turn, and the store as that attempt writes it.

Every write an attempt makes is fenced: the store refuses it (:class:`Fenced`) once
another driver took the session over.  The run, its session and the fence travel
together, as one :class:`FencedRun`; :class:`FencedStore` hands them to each of the
store's methods, so no call site can pair a run with another session's fence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from schemas.events import Event
from schemas.records import Approval, Steer
from workers.ports.backend import CommittedStep, FinishReceipt, StepReceipt, Store, TurnEnd


@dataclass(frozen=True, kw_only=True)
class FencedRun:
    """Who writes: the run (one attempt's row), its session, and the fencing token the
    attempt's claim took."""

    run_id: str
    session_id: str
    fence: int


class FencedStore:
    """The store's methods about one run, each called with that run's identity."""

    def __init__(self, store: Store, run: FencedRun) -> None:
        self._store = store
        self.run = run

    def commit_step(
        self,
        *,
        step: CommittedStep,
        steer_cursor: int,
        events: Sequence[Event],
        close_inbox_if_idle: bool,
        end: TurnEnd | None = None,
    ) -> StepReceipt:
        """Commit ``step`` whole (see :meth:`Store.commit_step`)."""
        run = self.run
        return self._store.commit_step(
            run_id=run.run_id,
            session_id=run.session_id,
            fence=run.fence,
            step=step,
            steer_cursor=steer_cursor,
            events=events,
            close_inbox_if_idle=close_inbox_if_idle,
            end=end,
        )

    def close_inbox(self, cursor: int) -> tuple[Steer, ...]:
        """Close the turn's inbox unless steers are pending past ``cursor`` (returned)."""
        run = self.run
        return self._store.close_inbox(
            run_id=run.run_id, session_id=run.session_id, fence=run.fence, cursor=cursor
        )

    def finish_turn(self, *, cursor: int, events: Sequence[Event], end: TurnEnd) -> FinishReceipt:
        """Commit the turn's end (see :meth:`Store.finish_turn`)."""
        run = self.run
        return self._store.finish_turn(
            run_id=run.run_id,
            session_id=run.session_id,
            fence=run.fence,
            cursor=cursor,
            events=events,
            end=end,
        )

    def hold_step(
        self, *, held_step: dict[str, Any], approvals: Sequence[Approval], events: Sequence[Event]
    ) -> None:
        """Keep a step that waits for answers (see :meth:`Store.hold_step`)."""
        run = self.run
        self._store.hold_step(
            run_id=run.run_id,
            session_id=run.session_id,
            fence=run.fence,
            held_step=held_step,
            approvals=approvals,
            events=events,
        )

    def defer_run(self, *, not_before: datetime, events: Sequence[Event]) -> None:
        """Let the session go until ``not_before`` (see :meth:`Store.defer_run`)."""
        run = self.run
        self._store.defer_run(
            run_id=run.run_id,
            session_id=run.session_id,
            fence=run.fence,
            not_before=not_before,
            events=events,
        )

    def consume_approval(self, approval_id: str) -> bool:
        """Mark an approved call as started, once (see :meth:`Store.consume_approval`)."""
        run = self.run
        return self._store.consume_approval(
            approval_id=approval_id, session_id=run.session_id, fence=run.fence
        )

    def pending_steers(self, cursor: int) -> tuple[Steer, ...]:
        """The run's accepted steers past ``cursor`` (a read: not fenced)."""
        return self._store.pending_steers(self.run.run_id, cursor)

    def approvals_of_run(self) -> dict[str, Approval]:
        """The run's approvals by id, in step and call order (a read: not fenced)."""
        return self._store.approvals_of_run(self.run.run_id)
