"""The store's reads of a turn for clients: the turn (with its session's tenant), its
execution record and result, its committed steps, and its durable events."""

from __future__ import annotations

from schemas.errors import TurnNotFound
from schemas.events import Event, EventKind
from schemas.records import RunState, TurnRecord, TurnResult
from workers.ports.backend import CommittedStep
from workers.store import statements as q
from workers.store.approvals import ApprovalStore
from workers.store.connection import StoreConnection
from workers.store.rows import read_steps, read_turn, run_state_of, turn_record


class TurnReads(ApprovalStore):
    """A turn as clients read it (see the module docstring)."""

    def turn_and_tenant(self, turn_id: str) -> tuple[TurnRecord, str | None]:
        """One turn and its session's tenant; :class:`TurnNotFound` if unknown."""
        row = self._reading(
            lambda db: db.execute(q.TURN_AND_TENANT, {"b_turn_id": turn_id}).one_or_none()
        )
        if row is None:
            raise TurnNotFound(f"no turn {turn_id!r}")
        return turn_record(row), row.tenant

    def get_turn(self, turn_id: str) -> TurnRecord:
        """One turn; :class:`TurnNotFound` if unknown."""
        return self._reading(lambda db: read_turn(db, turn_id))

    def turn_result(self, turn_id: str) -> TurnResult | None:
        """The result of an ended turn (None while it is queued or running)."""
        state = self.run_state(turn_id)
        if not state.status.terminal:
            return None
        return TurnResult(
            turn_id=turn_id,
            run_id=state.run_id,
            outcome=state.status,
            reply=state.reply,
            steps=state.steps,
            usage=state.usage,
            error=state.error,
            undelivered=state.undelivered,
            partial=state.partial,
            approvals=self.approvals(turn_id) if state.approval_count else (),
        )

    def run_state(self, turn_id: str) -> RunState:
        """The execution record of a turn."""
        run = self._reading(
            lambda db: db.execute(q.RUN_BY_TURN, {"b_turn_id": turn_id}).one_or_none()
        )
        if run is None:
            raise TurnNotFound(f"no turn {turn_id!r}")
        return run_state_of(run)

    def steps_of(self, turn_id: str) -> list[CommittedStep]:
        """The committed steps of a turn, in order."""

        def read(db: StoreConnection) -> list[CommittedStep]:
            run_id = db.execute(q.RUN_ID_OF_TURN, {"b_turn_id": turn_id}).scalar_one_or_none()
            if run_id is None:
                raise TurnNotFound(f"no turn {turn_id!r}")
            return read_steps(db, [run_id]).get(run_id, [])

        return self._reading(read)

    def events_after(self, turn_id: str, seq: int) -> list[Event]:
        """The durable events of a turn with ``seq`` greater than the one given."""
        rows = self._reading(
            lambda db: db.execute(q.EVENTS_AFTER, {"b_turn_id": turn_id, "b_seq": seq}).all()
        )
        return [
            Event(turn_id=turn_id, seq=r.seq, kind=EventKind(r.kind), data=dict(r.data))
            for r in rows
        ]

    def last_event_seq(self, turn_id: str) -> int:
        """The newest durable seq of a turn (0 if it has none)."""
        seq = self._reading(
            lambda db: db.execute(q.LAST_EVENT_SEQ, {"b_turn_id": turn_id}).scalar_one()
        )
        return int(seq or 0)
