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
from typing import Any, TypedDict

from parley.ports.backend import (
    ChildEnd,
    ChildTurn,
    CommittedStep,
    EventHold,
    EventWait,
    FinishReceipt,
    Spawned,
    StepReceipt,
    Store,
    TurnEnd,
)
from parley.schemas.compactions import CompactionDraft, CompactionRecord
from parley.schemas.events import Event
from parley.schemas.records import Approval, Steer, TurnRecord


@dataclass(frozen=True, kw_only=True)
class FencedRun:
    """Who writes: the run (one attempt's row), its session, and the fencing token the
    attempt's claim took."""

    run_id: str
    session_id: str
    fence: int


class _Fenced(TypedDict):
    """The keyword arguments every fenced write of the store takes."""

    run_id: str
    session_id: str
    fence: int


class FencedStore:
    """The store's methods about one run, each called with that run's identity."""

    def __init__(self, store: Store, run: FencedRun) -> None:
        self._store = store
        self.run = run

    def _fenced(self) -> _Fenced:
        """The run's identity as a fenced write's keyword arguments."""
        run = self.run
        return {"run_id": run.run_id, "session_id": run.session_id, "fence": run.fence}

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
        return self._store.commit_step(
            **self._fenced(),
            step=step,
            steer_cursor=steer_cursor,
            events=events,
            close_inbox_if_idle=close_inbox_if_idle,
            end=end,
        )

    def close_inbox(self, cursor: int) -> tuple[Steer, ...]:
        """Close the turn's inbox unless steers are pending past ``cursor`` (returned)."""
        return self._store.close_inbox(**self._fenced(), cursor=cursor)

    def finish_turn(self, *, cursor: int, events: Sequence[Event], end: TurnEnd) -> FinishReceipt:
        """Commit the turn's end (see :meth:`Store.finish_turn`)."""
        return self._store.finish_turn(
            **self._fenced(),
            cursor=cursor,
            events=events,
            end=end,
        )

    def hold_step(
        self, *, held_step: dict[str, Any], approvals: Sequence[Approval], events: Sequence[Event]
    ) -> None:
        """Keep a step that waits for answers (see :meth:`Store.hold_step`)."""
        self._store.hold_step(
            **self._fenced(),
            held_step=held_step,
            approvals=approvals,
            events=events,
        )

    def hold_for_agents(
        self,
        *,
        held_step: dict[str, Any],
        children: Sequence[ChildTurn],
        events: Sequence[Event],
        parallel: int,
    ) -> Spawned:
        """Keep a step that waits for its child turns, opening them (see
        :meth:`Store.hold_for_agents`)."""
        return self._store.hold_for_agents(
            **self._fenced(),
            held_step=held_step,
            children=children,
            events=events,
            parallel=parallel,
        )

    def hold_for_event(self, *, hold: EventHold, events: Sequence[Event]) -> bool:
        """Keep a step whose calls wait for events (see :meth:`Store.hold_for_event`):
        True when every wait ended at once (signals kept for them, or an interrupt)."""
        return self._store.hold_for_event(**self._fenced(), hold=hold, events=events)

    def waits_of_step(self, step: int) -> dict[str, EventWait]:
        """The waits of the run's step ``step`` by call id (a read: not fenced)."""
        return self._store.waits_of_step(self.run.run_id, step)

    def children_of_step(self, step: int) -> dict[str, ChildEnd]:
        """The child turns of the run's step ``step`` by call id (a read: not fenced)."""
        return self._store.children_of_step(self.run.run_id, step)

    def resumable_children(self, step: int) -> list[ChildEnd]:
        """The children of the run's step ``step`` an interrupt cancelled that may be
        resumed (a read: not fenced)."""
        return self._store.resumable_children(self.run.run_id, step)

    def resume_for_agents(
        self,
        *,
        held_step: dict[str, Any],
        children: Sequence[ChildEnd],
        events: Sequence[Event],
        parallel: int,
    ) -> Spawned:
        """Wait again for the resumed ``children`` (see :meth:`Store.resume_for_agents`)."""
        return self._store.resume_for_agents(
            **self._fenced(),
            held_step=held_step,
            children=children,
            events=events,
            parallel=parallel,
        )

    def defer_run(self, *, not_before: datetime, events: Sequence[Event]) -> None:
        """Let the session go until ``not_before`` (see :meth:`Store.defer_run`)."""
        self._store.defer_run(
            **self._fenced(),
            not_before=not_before,
            events=events,
        )

    def compact(
        self, *, draft: CompactionDraft, seq: int, events: Sequence[Event]
    ) -> tuple[CompactionRecord, Event]:
        """Store a compaction the run made (see :meth:`Store.compact_for_run`)."""
        return self._store.compact_for_run(
            **self._fenced(),
            draft=draft,
            seq=seq,
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

    def path(self, head: str | None) -> list[TurnRecord]:
        """The turns from the root to ``head`` (see :meth:`Store.path`): a read the
        fence does not guard (settled turns and their parent links never change)."""
        return self._store.path(head)

    def approvals_of_run(self) -> dict[str, Approval]:
        """The run's approvals by id, in step and call order (a read: not fenced)."""
        return self._store.approvals_of_run(self.run.run_id)
