"""The fleet's broker restarted under it, with real processes: a `redis-server` of the
test's own on a free port is shut down (nothing saved) while workers drive turns, and
started again five seconds later; the same with a RabbitMQ node of the test's own, whose
quorum queues keep every kick across the restart: those waiting, the one a consumer held
unacknowledged, and one still counting down in the delay queues.  And a worker that
cannot go on exits non-zero, so that its supervisor restarts it rather than taking it for
one that was told to stop.  On prefork and on the Procfile's worker line
(``tests.support.chaos``)."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

import parley
from parley.fleet.app import create_app, kick_queue, send_kick
from parley.fleet.settings import FleetSettings
from tests.support.chaos import CHAOS_REDIS_URL, Chaos, deployment_options
from tests.support.databases import fresh_postgres_database
from tests.support.deployments import on_fleet_deployments
from tests.support.fleet import Fleet, flush_redis
from tests.support.fleet_scenarios import assert_completed_once_in_order
from tests.support.rabbitmq import RabbitServer, connect, ready
from tests.support.redis_server import RedisServer, running_redis
from tests.support.waiting import wait_until

pytestmark = [on_fleet_deployments(), pytest.mark.postgres, pytest.mark.slow]


STEP: dict[str, Any] = {"chunk_chars": 2, "delay_ms": 20}
RESTART_RULES: list[dict[str, Any]] = [
    {
        "when": "^gated",
        "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "done: {prompt}"}],
    },
    {
        "when": "^load",
        "steps": [
            {"text": "working ", **STEP, "tool_calls": [{"name": "list_files"}]},
            {"text": "done: {prompt}", **STEP},
        ],
    },
]
"""The restart tests' load: turns that wait at the gate through the outage, and turns
that stream and call a tool, so the outage falls inside steps."""


def assert_the_fleet_went_on(chaos: Chaos, load: list[list[parley.TurnHandle]]) -> None:
    """Every turn of ``load`` completed once and in order, a turn submitted after the
    restart runs, and no worker exited."""
    assert_completed_once_in_order(chaos, load)
    after = chaos.client.open_session(chaos.workspace).submit("load after the restart")
    result = after.wait(60)
    assert result.outcome is parley.TurnStatus.FINISHED
    assert result.reply == "done: load after the restart"
    assert [w.poll() for w in chaos.workers] == [None, None], "a worker exited"


class Broker(Protocol):
    """A broker server of the test's own that it stops and starts again."""

    url: str

    def shutdown(self) -> None: ...
    def start(self) -> None: ...


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path) as server:
        yield server


@pytest.fixture
def rabbitmq(tmp_path: Path) -> Iterator[RabbitServer]:
    server = RabbitServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def restart_options(deployment: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """The deployment's fleet, with at least three slots a worker: kicks in flight and a
    free slot, whose BRPOP is pending when the broker goes (what kombu trips over)."""
    options = deployment_options(deployment, request)
    options["concurrency"] = max(3, options.get("concurrency", 1))
    return options


def test_workers_ride_through_a_broker_restart_under_load(
    deployment: str, broker: RedisServer, workspace: Path, request: pytest.FixtureRequest
) -> None:
    with fresh_postgres_database("restart") as url:
        # The broker's Redis is the coordination store too, as by default.
        options = restart_options(deployment, request)
        chaos = Chaos(url, workspace, redis_url=broker.url, **options)
        try:
            _restart_under_load(chaos, broker)
        finally:
            chaos.close()


@pytest.mark.amqp
def test_workers_ride_through_a_rabbitmq_restart_under_load(
    rabbitmq: RabbitServer, workspace: Path, request: pytest.FixtureRequest
) -> None:
    flush_redis(CHAOS_REDIS_URL)  # the coordination store, which stays up
    with fresh_postgres_database("restart") as url:
        options = restart_options("shipped", request)
        chaos = Chaos(url, workspace, broker_url=rabbitmq.url, **options)
        try:
            _restart_under_load(chaos, rabbitmq)
        finally:
            chaos.close()


@pytest.mark.amqp
def test_a_rabbitmq_restart_keeps_every_kick_on_its_quorum_queues(
    rabbitmq: RabbitServer,
) -> None:
    flush_redis(CHAOS_REDIS_URL)
    with fresh_postgres_database("restart") as url:
        fleet = Fleet(database_url=url, redis_url=CHAOS_REDIS_URL, broker_url=rabbitmq.url)
        try:
            _restart_with_kicks_on_the_queues(fleet, rabbitmq)
        finally:
            fleet.stop()


def _restart_with_kicks_on_the_queues(fleet: Fleet, rabbitmq: RabbitServer) -> None:
    # A worker declares the quorum queues and the delay queues, as in production, and
    # stops: the kicks stay on the broker.
    worker = fleet.start_worker(pool="threads")
    fleet.wait_ready()
    os.killpg(worker.pid, signal.SIGTERM)
    assert worker.wait(60) == 0
    settings = FleetSettings(
        database_url=fleet.database_url,
        redis_url=fleet.redis_url,
        broker_url=rabbitmq.url,
        host=None,
        queue=fleet.queue,
    )
    batch_queue = settings.batch_queue
    kicks = {fleet.queue: [str(uuid.uuid4()) for _ in range(3)], batch_queue: []}
    app = create_app(settings, name="parley-test")
    try:
        for session_id in kicks[fleet.queue]:
            send_kick(app, settings, session_id)
        kicks[batch_queue] = [str(uuid.uuid4()) for _ in range(3)]
        for session_id in kicks[batch_queue][:2]:
            send_kick(app, settings, session_id, priority="batch")
        # (Its countdown runs out while the broker is down: it waits in a delay queue
        # through the restart.)
        send_kick(app, settings, kicks[batch_queue][2], priority="batch", countdown=3.0)
    finally:
        app.close()
    held = connect(rabbitmq.url)  # a consumer that holds a kick, unacknowledged
    taken = held.channel().basic_get(fleet.queue, no_ack=False)
    assert taken is not None

    rabbitmq.shutdown()
    held.close()
    time.sleep(5)
    rabbitmq.start()

    # Each kick on its lane's queue, once: the held one back on it, the delayed one
    # delivered from its delay queue, its routing key telling its queue.  (That it comes
    # no sooner than its countdown: test_rabbitmq_queues.py.)
    wait_until(lambda: ready(rabbitmq.url, fleet.queue) == 3, 30, what="the interactive kicks")
    wait_until(lambda: ready(rabbitmq.url, batch_queue) == 3, 30, what="the batch kicks")
    with connect(rabbitmq.url) as connection:
        channel = connection.channel()
        for queue, sessions in kicks.items():
            found = []
            while (message := channel.basic_get(queue, no_ack=True)) is not None:
                assert kick_queue(message.delivery_info["routing_key"]) == queue
                found.append(json.loads(message.body)[0][0])
            assert sorted(found) == sorted(sessions), queue
        channel.close()


def _restart_under_load(chaos: Chaos, broker: Broker) -> None:
    chaos.control.script(RESTART_RULES)
    # Two sessions whose driver waits at the gate with turns queued behind it, two that
    # stream turn after turn.
    gated = [chaos.client.open_session(chaos.workspace) for _ in range(2)]
    streaming = [chaos.client.open_session(chaos.workspace) for _ in range(2)]
    load = [
        [s.submit(f"gated 0 of {s.id[:8]}"), *(s.submit(f"load {n} of {s.id[:8]}") for n in (1, 2))]
        for s in gated
    ] + [[s.submit(f"load {n} of {s.id[:8]}") for n in range(3)] for s in streaming]
    deadline = time.monotonic() + 30
    while chaos.control.gate_calls < 2:  # both gated drivers hold their kicks
        assert time.monotonic() < deadline, "the gated turns never reached the gate"
        time.sleep(0.01)
    broker.shutdown()
    time.sleep(5)
    broker.start()
    chaos.control.open_gate()

    assert_the_fleet_went_on(chaos, load)
    for worker in chaos.workers:
        assert b"Unrecoverable error" not in chaos.fleet.log_of(worker).read_bytes()


def test_a_worker_that_cannot_go_on_exits_non_zero(
    deployment: str, broker: RedisServer, request: pytest.FixtureRequest
) -> None:
    # A broker whose access list lets the worker connect but refuses it BRPOP: no
    # reconnect mends that, so Celery gives up ("Unrecoverable error").
    admin = broker.client()
    admin.acl_setuser(
        "parley",
        enabled=True,
        nopass=True,
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-brpop"],
    )
    admin.close()
    with fresh_postgres_database("refused") as url:
        fleet = Fleet(database_url=url, redis_url=f"redis://parley:any@127.0.0.1:{broker.port}/0")
        worker = fleet.start_worker(pool=deployment_options(deployment, request)["pool"])
        try:
            status = worker.wait(60)
        finally:
            fleet.stop()
        log = fleet.log_of(worker).read_text()
    assert "Unrecoverable error" in log and "NoPermissionError" in log
    assert status == 1
