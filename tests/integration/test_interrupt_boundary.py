"""An interrupt that returned before a turn's first boundary stops the turn there (an
interrupt stops a turn at its next step boundary), even on the Redis coordinator, which
answers most flag checks from a recent look: the turn is prepared (hooks, tools) after its
claim read the inbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import parley
from parley.coordination.redis_coordinator import RedisCoordinator
from parley.engine.turn_engine import TurnEngine
from parley.ports.host import DeltaSink, ModelReply, ModelRequest
from parley.runtime.session_drainer import SessionDrainer
from parley.schemas.messages import ToolCall
from parley.schemas.records import SteerKind, TurnStatus
from parley.store.sql_store import SqlStore
from tests.integration.drive import new_session, submit
from tests.support.fleet import REDIS_TEST_URL, flush_redis


class CountingModel:
    """Asks for one tool call, then answers; counts its calls."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        self.calls += 1
        if self.calls == 1:
            call = ToolCall(id="c", name="list_files", arguments="{}")
            return ModelReply(text="", tool_calls=(call,))
        return ModelReply(text="done")


class InterruptWhilePreparing:
    """``before_turn`` interrupts the turn being prepared, as another process would: the
    steer goes to the store, then to the turn's steer list in Redis."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.other = RedisCoordinator(REDIS_TEST_URL)

    def before_turn(self, request: Any, _options: Any, _state: Any) -> None:
        steer = self.store.add_steer(request.turn_id, SteerKind.INTERRUPT, "")
        self.other.push_steer(request.turn_id, steer)


def test_an_interrupt_sent_while_a_turn_is_prepared_stops_it_at_its_first_boundary(
    sqlite_store: SqlStore, tmp_path: Path
) -> None:
    store = sqlite_store
    flush_redis(REDIS_TEST_URL)
    coordinator = RedisCoordinator(REDIS_TEST_URL)
    hooks = InterruptWhilePreparing(store)
    model = CountingModel()
    host = parley.Host(model=model, hooks=hooks)
    try:
        session_id = new_session(store, root=str(tmp_path))
        turn_id, _run_id = submit(store, session_id, "go")
        SessionDrainer(TurnEngine(store=store, coordinator=coordinator, host=host)).drive(
            session_id
        )
        state = store.run_state(turn_id)
        assert state.status is TurnStatus.CANCELLED
        assert state.steps == 0 and model.calls == 0  # stopped before any model call
    finally:
        hooks.other.close()
        coordinator.close()
