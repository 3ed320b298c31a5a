"""What steering costs a driver, per step: PostgreSQL statements and Redis round trips
of a 20-step turn with no steers, beside the same turn with a `say` sent during every
step (each boundary has one to deliver).  Run by hand (PostgreSQL and Redis as for the
tests; Redis database 15 is emptied first):

    .venv/bin/python -m tests.bench.steering

The driver runs in this process on the fleet's store and Redis coordinator; the steers
come from a fleet client, as from another process.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import redis

import parley
from parley.coordination.redis_coordinator import RedisCoordinator
from parley.engine.turn_engine import TurnEngine
from parley.ports.host import DeltaSink, ModelReply, ModelRequest
from parley.runtime.session_drainer import SessionDrainer
from parley.schemas.messages import ToolCall
from parley.store import connection as store_connection
from parley.store.sql_store import SqlStore
from tests.support.databases import fresh_postgres_database

REDIS_URL = os.environ.get("PARLEY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")
STEPS = 20


class SteppingModel:
    """A tool call per step for STEPS steps, then an answer; ``during`` runs inside each
    call but the last (a steer sent while the model works)."""

    name = "stepping"

    def __init__(self, during: Callable[[str, int], None]) -> None:
        self.during = during
        self.calls = 0

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        self.calls += 1
        assert request.context is not None
        on_delta("working ")
        if self.calls == STEPS:
            return ModelReply(text="working done")
        self.during(request.context.turn_id, self.calls)
        call = ToolCall(id=f"c{self.calls}", name="list_files", arguments="{}")
        return ModelReply(text="working ", tool_calls=(call,))


class Counts:
    """Statements the driver's thread runs, and round trips its Redis clients make."""

    def __init__(self, coordinator: RedisCoordinator) -> None:
        self.statements = 0
        self.round_trips = 0
        self.driver = threading.current_thread()
        pools = {coordinator.redis.connection_pool, coordinator._blocking.connection_pool}
        execute: Any = store_connection.StoreConnection.execute
        command: Any = redis.Redis.execute_command
        pipeline_execute: Any = redis.client.Pipeline.execute
        counts = self

        def counted_execute(connection: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is counts.driver:
                counts.statements += 1
            return execute(connection, *args, **kwargs)

        def counted_command(client: Any, *args: Any, **kwargs: Any) -> Any:
            if client.connection_pool in pools:
                counts.round_trips += 1
            return command(client, *args, **kwargs)

        def counted_pipeline(pipe: Any, *args: Any, **kwargs: Any) -> Any:
            if pipe.connection_pool in pools:
                counts.round_trips += 1
            return pipeline_execute(pipe, *args, **kwargs)

        self._patch(counted_execute, counted_command, counted_pipeline)
        self._restore = (execute, command, pipeline_execute)

    @staticmethod
    def _patch(execute: Any, command: Any, pipeline_execute: Any) -> None:
        connection: Any = store_connection.StoreConnection
        client: Any = redis.Redis
        pipeline: Any = redis.client.Pipeline
        connection.execute, client.execute_command, pipeline.execute = (
            execute,
            command,
            pipeline_execute,
        )

    def close(self) -> None:
        self._patch(*self._restore)


def measure(url: str, root: str, *, steering: bool) -> tuple[float, float]:
    """Statements and round trips per step of one turn."""
    client = parley.connect(url, redis_url=REDIS_URL, queue="parley.bench.steering")
    store = SqlStore.from_url(url)
    coordinator = RedisCoordinator(REDIS_URL)

    def say(turn_id: str, step: int) -> None:
        if steering:  # from another thread: its statements are not the driver's
            sender = threading.Thread(target=lambda: client.attach(turn_id).say(f"steer {step}"))
            sender.start()
            sender.join()

    model = SteppingModel(say)
    engine = TurnEngine(
        store=store,
        coordinator=coordinator,
        host=parley.Host(model=model, tools=parley.tools.WORKSPACE_TOOLS),
    )
    session = client.open_session(root)
    handle = session.submit("go")
    counts = Counts(coordinator)
    try:
        SessionDrainer(engine).drive(session.id)
        coordinator.flush()
    finally:
        counts.close()
    result = handle.wait(10)
    assert result.steps == STEPS, result
    if steering:
        assert result.undelivered == ()
    client.close()
    coordinator.close()
    store.close()
    return counts.statements / STEPS, counts.round_trips / STEPS


def main() -> None:
    redis.Redis.from_url(REDIS_URL).flushdb()
    with fresh_postgres_database("bench_steering") as url, tempfile.TemporaryDirectory() as root:
        measure(url, root, steering=False)  # warm up: imports, compiled statements
        quiet = [measure(url, root, steering=False) for _ in range(3)]
        steered = [measure(url, root, steering=True) for _ in range(3)]
    for name, runs in (("no steers", quiet), ("a say every step", steered)):
        statements = sorted(r[0] for r in runs)[1]
        trips = sorted(r[1] for r in runs)[1]
        print(
            f"{name:18} PostgreSQL statements/step {statements:5.2f}   "
            f"Redis round trips/step {trips:5.2f}   (median of 3 turns of {STEPS} steps)"
        )


if __name__ == "__main__":
    main()
