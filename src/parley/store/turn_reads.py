"""The store's reads of a turn for clients: the turn (with its session's tenant), its
execution record and result, its committed steps, and its durable events."""

from __future__ import annotations

from typing import Any

from parley.ports.backend import CommittedStep
from parley.schemas.errors import TurnNotFound
from parley.schemas.events import Event, EventKind
from parley.schemas.records import (
    ChildRecord,
    RunState,
    TurnRecord,
    TurnResult,
    TurnStatus,
    TurnUsage,
    Usage,
)
from parley.store import statements as q
from parley.store.approvals import ApprovalStore
from parley.store.connection import StoreConnection, Transactions
from parley.store.rows import read_steps, read_turn, run_state_of, turn_record


class TurnReads:
    """A turn as clients read it (see the module docstring)."""

    def __init__(self, db: Transactions, approvals: ApprovalStore) -> None:
        self._db = db
        self._approvals = approvals

    def turn_and_tenant(self, turn_id: str) -> tuple[TurnRecord, str | None]:
        """One turn and its session's tenant; :class:`TurnNotFound` if unknown."""
        row = self._db.reading(
            lambda db: db.execute(q.TURN_AND_TENANT, {"b_turn_id": turn_id}).one_or_none()
        )
        if row is None:
            raise TurnNotFound(f"no turn {turn_id!r}")
        return turn_record(row), row.tenant

    def get_turn(self, turn_id: str) -> TurnRecord:
        """One turn; :class:`TurnNotFound` if unknown."""
        return self._db.reading(lambda db: read_turn(db, turn_id))

    def turn_result(self, turn_id: str) -> TurnResult | None:
        """The result of an ended turn (None while it is queued or running): one read
        of its run, and of its children only if it has some."""
        run = self._run_row(q.RUN_WITH_CHILDREN_BY_TURN, turn_id)
        state = run_state_of(run)
        if not state.status.terminal:
            return None
        children = self.children_of_run(state.run_id) if run.has_children else ()
        return TurnResult(
            turn_id=turn_id,
            run_id=state.run_id,
            outcome=state.status,
            reply=state.reply,
            steps=state.steps,
            usage=self.turn_usage(state, bool(children)),
            error=state.error,
            undelivered=state.undelivered,
            partial=state.partial,
            approvals=self._approvals.approvals(turn_id) if state.approval_count else (),
            children=children,
        )

    def turn_usage(self, state: RunState, has_children: bool) -> TurnUsage:
        """The turn's usage with its descendants' (read only when it has children)."""
        own = state.usage
        descendants = self._descendants_usage(state.run_id) if has_children else Usage()
        return TurnUsage(
            input_tokens=own.input_tokens,
            output_tokens=own.output_tokens,
            cached_tokens=own.cached_tokens,
            descendants=descendants,
        )

    def _descendants_usage(self, run_id: str) -> Usage:
        """The tokens of the run's agent calls' child turns and theirs, down the tree."""
        row = self._db.reading(
            lambda db: db.execute(q.DESCENDANTS_USAGE, {"b_run_id": run_id}).one()
        )
        return Usage(
            input_tokens=int(row.input_tokens),
            output_tokens=int(row.output_tokens),
            cached_tokens=int(row.cached_tokens),
        )

    def children_of_run(self, run_id: str) -> tuple[ChildRecord, ...]:
        """Each agent call's child turn of a run, in step and call order."""
        rows = self._db.reading(
            lambda db: db.execute(q.CHILDREN_OF_RUN, {"b_run_id": run_id}).all()
        )
        return tuple(
            ChildRecord(
                step=row.parent_step,
                call_id=row.call_id,
                agent=row.agent,
                turn_id=row.turn_id,
                session_id=row.session_id,
                status=TurnStatus(row.status),
            )
            for row in rows
        )

    def run_state(self, turn_id: str) -> RunState:
        """The execution record of a turn."""
        return run_state_of(self._run_row(q.RUN_BY_TURN, turn_id))

    def _run_row(self, statement: Any, turn_id: str) -> Any:
        """The row ``statement`` reads of the turn's run; :class:`TurnNotFound` if none."""
        run = self._db.reading(
            lambda db: db.execute(statement, {"b_turn_id": turn_id}).one_or_none()
        )
        if run is None:
            raise TurnNotFound(f"no turn {turn_id!r}")
        return run

    def steps_of(self, turn_id: str) -> list[CommittedStep]:
        """The committed steps of a turn, in order."""

        def read(db: StoreConnection) -> list[CommittedStep]:
            run_id = db.execute(q.RUN_ID_OF_TURN, {"b_turn_id": turn_id}).scalar_one_or_none()
            if run_id is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            return read_steps(db, [run_id]).get(run_id, [])

        return self._db.reading(read)

    def events_after(self, turn_id: str, seq: int) -> list[Event]:
        """The durable events of a turn with ``seq`` greater than the one given."""
        rows = self._db.reading(
            lambda db: db.execute(q.EVENTS_AFTER, {"b_turn_id": turn_id, "b_seq": seq}).all()
        )
        return [
            Event(turn_id=turn_id, seq=r.seq, kind=EventKind(r.kind), data=dict(r.data))
            for r in rows
        ]

    def last_event_seq(self, turn_id: str) -> int:
        """The newest durable seq of a turn (0 if it has none)."""
        seq = self._db.reading(
            lambda db: db.execute(q.LAST_EVENT_SEQ, {"b_turn_id": turn_id}).scalar_one()
        )
        return int(seq or 0)
