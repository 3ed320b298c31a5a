"""RabbitMQ's quorum queues under a real fleet, on the machine's RabbitMQ (a virtual host
of the run's own): a kick with a countdown waits on the broker, in the delay queues, and
reaches a worker no sooner than its countdown rounded up to whole seconds (a second's
fraction too, which Celery alone refuses there); a worker takes no more kicks than its
slots from each lane, with no global prefetch; and a classic queue of the fleet's name
stops the worker and the sweeper on one line naming it and the two ways out, which both
work.

The fleet's kick queues are quorum queues everywhere a fleet runs on RabbitMQ (checked as
each fleet becomes ready, ``tests.support.fleet``); the broker's restart with them is in
``test_broker_restart.py``."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.fleet.app import create_app, declare_kick_queues, send_kick
from parley.fleet.settings import FleetSettings
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import Fleet, flush_redis
from tests.support.helpers import Control
from tests.support.rabbitmq import connect, ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.amqp, pytest.mark.postgres, pytest.mark.slow]

GATED: list[dict[str, Any]] = [
    {"when": "^gated", "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "done"}]},
    {"when": "", "steps": [{"text": "done"}]},
]
"""Turns that wait at the gate (holding their worker's slot), and turns that just end."""


@pytest.fixture
def fleet(amqp_url: str, workspace: Path) -> Iterator[Fleet]:
    """A fleet on RabbitMQ with a database of its own and no worker yet (each test starts
    its own), and no sweeper: no kick here is the sweeper's."""
    flush_redis()
    Control(workspace).script(GATED)
    with fresh_postgres_database("rabbitmq") as url:
        fleet = Fleet(database_url=url, broker_url=amqp_url)
        try:
            yield fleet
        finally:
            fleet.stop()


def producer(fleet: Fleet) -> tuple[Any, FleetSettings]:
    """A Celery app of ``fleet``'s, to send kicks as its workers do, and its settings."""
    settings = FleetSettings(
        database_url=fleet.database_url,
        redis_url=fleet.redis_url,
        broker_url=fleet.broker,
        host=None,
        queue=fleet.queue,
    )
    return create_app(settings, name="parley-test"), settings


def delayed(url: str) -> int:
    """How many messages wait in Celery's delay queues (``celery_delayed_0`` to ``_27``,
    which a worker declares as it starts)."""
    return sum(ready(url, f"celery_delayed_{level}") for level in range(28))


def purge(fleet: Fleet) -> None:
    """Empty both lanes' queues (the kicks the submissions sent)."""
    with connect(fleet.broker) as connection:
        channel = connection.channel()
        for queue in (fleet.queue, fleet.queue + ".batch"):
            channel.queue_purge(queue)
        channel.close()


def test_a_countdown_kick_waits_on_the_broker_and_arrives_no_sooner(
    fleet: Fleet, workspace: Path
) -> None:
    control = Control(workspace)
    client = fleet.client()
    try:
        # Two turns whose kicks are gone: each runs when a countdown kick comes.
        first = client.open_session(str(workspace)).submit("gated 1")
        second = client.open_session(str(workspace)).submit("gated 2", priority="batch")
        purge(fleet)
        fleet.start_worker(concurrency=2, pool="threads")
        fleet.wait_ready()  # (its delay queues are declared by now)
        app, settings = producer(fleet)
        try:
            # (Celery alone refuses a countdown under a second on a quorum queue: it is
            # rounded up to whole seconds, never down.)
            sent = time.monotonic()
            send_kick(app, settings, first.session_id, countdown=0.4)
            wait_until(lambda: control.gate_calls == 1, 30, what="the first turn")
            assert time.monotonic() - sent >= 1.0
            sent = time.monotonic()
            send_kick(app, settings, second.session_id, priority="batch", countdown=2.5)
            # In the delay queues, not in a worker (whose slot it would hold), until
            # its countdown is over (RabbitMQ's expiry may be late, never early).
            wait_until(lambda: delayed(fleet.broker) == 1, 2, what="the kick on the broker")
            wait_until(lambda: control.gate_calls == 2, 30, what="the second turn")
            assert time.monotonic() - sent >= 3.0  # (2.5, rounded up)
            assert delayed(fleet.broker) == 0
        finally:
            app.close()
        control.open_gate()
        for handle in (first, second):
            assert handle.wait(30).outcome is parley.TurnStatus.FINISHED
    finally:
        client.close(timeout=10)


def test_a_busy_worker_takes_no_more_kicks_than_its_slots_from_each_lane(
    fleet: Fleet, workspace: Path
) -> None:
    # RabbitMQ refuses a global prefetch on a quorum queue (540 NOT_IMPLEMENTED), so the
    # worker's limit is each lane's consumer's own: one slot, one kick from each lane.
    control = Control(workspace)
    fleet.start_worker(concurrency=1, pool="threads")
    fleet.wait_ready()
    client = fleet.client()
    try:
        gated = client.open_session(str(workspace)).submit("gated")
        control.wait_entered()  # (its kick, unacknowledged, holds the one slot)
        waiting = [client.open_session(str(workspace)).submit(f"turn {n}") for n in (1, 2)]
        time.sleep(1.5)  # (time for a worker that would take them to have taken them)
        assert ready(fleet.broker, fleet.queue) == 2, "the busy worker took an interactive kick"
        batch = client.open_session(str(workspace)).submit("batch turn", priority="batch")
        wait_until(lambda: ready(fleet.broker, fleet.queue + ".batch") == 0, 10, what="a take")
        assert ready(fleet.broker, fleet.queue) == 2  # (the batch lane's consumer took it)
        control.open_gate()
        for handle in (gated, *waiting, batch):
            assert handle.wait(30).outcome is parley.TurnStatus.FINISHED
    finally:
        client.close(timeout=10)


def test_a_classic_queue_of_the_fleets_name_stops_it_saying_so(
    fleet: Fleet, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app, settings = producer(fleet)  # (the queues a fleet made before quorum queues)
    declare_kick_queues(app, dataclasses.replace(settings, queue_type="classic"))
    app.close()
    vhost = fleet.broker.rsplit("/", 1)[1]
    for process in (fleet.start_worker(), fleet.start_beat()):
        assert process.wait(60) == 2
        output = fleet.log_of(process).read_text()
        assert "Traceback" not in output
        (line,) = [line for line in output.splitlines() if "QueueTypeMismatch" in line]
        assert f"a queue {fleet.queue!r} that is not the quorum queue" in line
        assert "PRECONDITION_FAILED" in line
        assert f"`rabbitmqctl delete_queue -p {vhost} {fleet.queue}`" in line
        assert "or set PARLEY_BROKER_QUEUE_TYPE=classic" in line
    fleet.processes.clear()  # (both exited)

    # A client's kick fails on the same line (the sweeper could not send it either).
    client = fleet.client()
    try:
        with caplog.at_level(logging.ERROR, logger="parley.client"):
            handle = client.open_session(str(workspace)).submit("a turn")
        (record,) = [r for r in caplog.records if "could not kick" in r.getMessage()]
        assert record.levelno == logging.ERROR and record.exc_info is None
        assert f"a queue {fleet.queue!r}" in record.getMessage()
        assert "PARLEY_BROKER_QUEUE_TYPE=classic" in record.getMessage()

        # One way out: the fleet keeps its classic queues.
        fleet.environment["PARLEY_BROKER_QUEUE_TYPE"] = "classic"
        fleet.start_worker()
        fleet.start_beat()  # (it sends the lost kick again)
        fleet.wait_ready()  # (and finds both lanes' queues classic)
        assert handle.wait(30).outcome is parley.TurnStatus.FINISHED

        # The other: with the fleet stopped, the queues deleted as the line says.
        for process in fleet.processes:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(60)
        fleet.processes.clear()
        for queue in (fleet.queue, fleet.queue + ".batch"):
            command = shlex.split(re.findall(r"`(rabbitmqctl [^`]+)`", line)[0])
            command[-1] = queue
            if shutil.which("rabbitmqctl"):
                subprocess.run(command, check=True, capture_output=True, timeout=60)
            else:  # (a server out of this machine's reach: over AMQP)
                with connect(fleet.broker) as connection:
                    connection.channel().queue_delete(queue)
        del fleet.environment["PARLEY_BROKER_QUEUE_TYPE"]
        fleet.start_worker()
        fleet.start_beat()
        fleet.wait_ready()  # (both lanes' queues quorum again)
        again = client.open_session(str(workspace)).submit("another turn")
        assert again.wait(30).outcome is parley.TurnStatus.FINISHED
    finally:
        client.close(timeout=10)
