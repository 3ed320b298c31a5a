"""A step boundary learns of steers from the turn's steer list (Redis, or in process),
and reads the store's inbox only when the list cannot be trusted: missing steers the
store counted (a push that never happened, a list Redis lost).  Run on both coordinators
with the same test bodies (the ``coordinator`` fixture of the integration tests)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import parley
from parley.coordination.redis_coordinator import RedisCoordinator
from parley.engine.turn_engine import TurnEngine
from parley.ports.backend import Coordinator
from parley.ports.host import DeltaSink, ModelReply, ModelRequest
from parley.runtime.session_drainer import SessionDrainer
from parley.schemas.messages import ToolCall, UserMessage
from parley.schemas.records import SteerKind, TurnStatus
from parley.store.sql_store import SqlStore
from tests.integration.drive import StatementLog, new_session, submit
from tests.support.fleet import REDIS_TEST_URL, flush_redis


class SteeredModel:
    """Calls ``during_first`` inside its first call (a steer sent while it works), asks
    for one tool call, then answers with the steers it was sent."""

    name = "steered"

    def __init__(self, during_first: Callable[[str], None]) -> None:
        self.during_first = during_first
        self.requests: list[ModelRequest] = []

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        self.requests.append(request)
        if len(self.requests) == 1:
            assert request.context is not None
            self.during_first(request.context.turn_id)
            return ModelReply(
                text="", tool_calls=(ToolCall(id="c", name="list_files", arguments="{}"),)
            )
        steers = [
            m.text for m in request.messages if isinstance(m, UserMessage) and m.origin == "steer"
        ]
        return ModelReply(text="heard: " + ", ".join(steers))


def run_turn(
    store: SqlStore, coordinator: Coordinator, root: Path, during_first: Callable[[str], None]
) -> tuple[str, int]:
    """Drive one turn; returns its reply and how often the store's inbox was read."""
    log = StatementLog(store)
    host = parley.Host(model=SteeredModel(during_first), tools=parley.tools.WORKSPACE_TOOLS)
    session_id = new_session(store, root=str(root))
    turn_id, _run_id = submit(store, session_id, "go")
    SessionDrainer(TurnEngine(store=store, coordinator=coordinator, host=host)).drive(session_id)
    state = store.run_state(turn_id)
    assert state.status is TurnStatus.FINISHED
    assert state.reply is not None
    return state.reply, log.count("FROM steers")


def test_a_listed_steer_reaches_the_next_boundary_without_a_read_of_the_store(
    sqlite_store: SqlStore, coordinator: Coordinator, tmp_path: Path
) -> None:
    def say(turn_id: str) -> None:
        coordinator.push_steer(turn_id, sqlite_store.add_steer(turn_id, SteerKind.SAY, "one"))
        coordinator.push_steer(turn_id, sqlite_store.add_steer(turn_id, SteerKind.SAY, "two"))

    reply, reads = run_turn(sqlite_store, coordinator, tmp_path, say)
    assert reply == "heard: one, two"
    assert reads == 0  # the commit counted them; the boundary read the list


def test_a_steer_the_list_lacks_is_read_from_the_store_at_the_next_boundary(
    sqlite_store: SqlStore, coordinator: Coordinator, tmp_path: Path
) -> None:
    def say_without_listing(turn_id: str) -> None:
        # The sender died between its commit and its push: the step's commit counts it.
        coordinator.push_steer(turn_id, sqlite_store.add_steer(turn_id, SteerKind.SAY, "one"))
        sqlite_store.add_steer(turn_id, SteerKind.SAY, "two")

    reply, reads = run_turn(sqlite_store, coordinator, tmp_path, say_without_listing)
    assert reply == "heard: one, two"
    assert reads == 1  # once, at the boundary after the step that counted them


def test_a_steer_list_redis_lost_is_read_from_the_store(
    sqlite_store: SqlStore, tmp_path: Path
) -> None:
    flush_redis(REDIS_TEST_URL)
    coordinator = RedisCoordinator(REDIS_TEST_URL)

    def say_then_lose_redis(turn_id: str) -> None:
        coordinator.push_steer(turn_id, sqlite_store.add_steer(turn_id, SteerKind.SAY, "kept"))
        flush_redis(REDIS_TEST_URL)

    try:
        reply, reads = run_turn(sqlite_store, coordinator, tmp_path, say_then_lose_redis)
    finally:
        coordinator.close()
    assert reply == "heard: kept"
    assert reads == 1
