"""The fleet's Celery wiring: settings from the environment only, and the at-least-once,
JSON-only configuration every app (producer or worker) gets."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kombu.transport.native_delayed_delivery import calculate_routing_key

from parley.coordination import constants as c
from parley.errors import InvalidRequest
from parley.fleet.app import (
    REDIS_BROKER_CONNECTIONS,
    create_app,
    kick_queue,
    quorum_queues,
    transport_options,
)
from parley.fleet.settings import FleetSettings
from parley.runtime.concurrency import DATABASE_POOL_SIZE

ENV = {
    "PARLEY_DATABASE_URL": "postgresql+psycopg://db/parley",
    "PARLEY_REDIS_URL": "redis://cache:6379/0",
    "PARLEY_HOST": "scripted:script.json",
}


def test_settings_come_from_the_environment_with_the_broker_defaulting_to_redis() -> None:
    settings = FleetSettings.from_env(ENV)
    assert settings.broker_url == "redis://cache:6379/0"
    assert settings.queue == c.TURN_QUEUE
    assert settings.sweep_seconds == c.SWEEP_SECONDS
    assert settings.replay_seconds == c.ENDED_BUFFER_SECONDS
    other = FleetSettings.from_env(
        {
            **ENV,
            "PARLEY_BROKER_URL": "redis://broker/1",
            "PARLEY_QUEUE": "q",
            "PARLEY_SWEEP_SECONDS": "0.5",
            "PARLEY_REPLAY_SECONDS": "600",
        }
    )
    assert (other.broker_url, other.queue, other.sweep_seconds, other.replay_seconds) == (
        "redis://broker/1",
        "q",
        0.5,
        600,
    )


@pytest.mark.parametrize("missing", ["PARLEY_DATABASE_URL", "PARLEY_REDIS_URL"])
def test_missing_settings_are_a_clear_error(missing: str) -> None:
    with pytest.raises(InvalidRequest, match=missing):
        FleetSettings.from_env({k: v for k, v in ENV.items() if k != missing})


@pytest.mark.parametrize("name", ["PARLEY_SWEEP_SECONDS", "PARLEY_REPLAY_SECONDS"])
@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf"])
def test_a_bad_period_is_a_clear_error(name: str, value: str) -> None:
    with pytest.raises(InvalidRequest, match=name):
        FleetSettings.from_env({**ENV, name: value})


@pytest.mark.parametrize("value", ["1.5", "1e16"])
def test_the_replay_period_is_whole_seconds_up_to_a_year(value: str) -> None:
    # (Redis refuses an EXPIRE of 1e16 seconds: every end would fail to publish.)
    with pytest.raises(InvalidRequest, match="whole number"):
        FleetSettings.from_env({**ENV, "PARLEY_REPLAY_SECONDS": value})


@pytest.mark.parametrize("value", ["soon", "-0.01", "1.5", "nan", "inf"])
def test_a_bad_stream_flush_interval_is_a_clear_error(value: str) -> None:
    with pytest.raises(InvalidRequest, match="PARLEY_STREAM_FLUSH_SECONDS"):
        FleetSettings.from_env({**ENV, "PARLEY_STREAM_FLUSH_SECONDS": value})


@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("0.02", 0.02), ("", 0.05)])
def test_the_stream_flush_interval_is_from_zero_to_a_second(value: str, seconds: float) -> None:
    settings = FleetSettings.from_env({**ENV, "PARLEY_STREAM_FLUSH_SECONDS": value})
    assert settings.stream_flush_seconds == seconds


def test_task_events_are_off_unless_asked_for() -> None:
    assert not create_app(FleetSettings.from_env(ENV)).conf.worker_send_task_events
    conf = create_app(FleetSettings.from_env({**ENV, "PARLEY_TASK_EVENTS": "1"})).conf
    assert conf.worker_send_task_events and conf.task_send_sent_event
    with pytest.raises(InvalidRequest, match="PARLEY_TASK_EVENTS must be 1 or 0"):
        FleetSettings.from_env({**ENV, "PARLEY_TASK_EVENTS": "yes"})


def test_an_empty_setting_is_an_unset_one() -> None:
    settings = FleetSettings.from_env(
        {**ENV, "PARLEY_SWEEP_SECONDS": "", "PARLEY_REPLAY_SECONDS": "", "PARLEY_QUEUE": ""}
    )
    assert settings == FleetSettings.from_env(ENV)


def test_every_app_is_json_only_and_at_least_once() -> None:
    app = create_app(FleetSettings.from_env(ENV))
    conf = app.conf
    assert conf.task_serializer == "json" and list(conf.accept_content) == ["json"]
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is False  # kicks go on
    assert conf.task_ignore_result and conf.result_backend is None
    options = conf.broker_transport_options
    assert options["visibility_timeout"] == c.VISIBILITY_TIMEOUT_SECONDS
    # A kick is sent while its submission holds the session's row: never wait forever.
    assert options["socket_timeout"] == options["socket_connect_timeout"] == 5.0
    # Interactive first, then batch: the order a worker asks the broker in, every time
    # (docs/admission.md#priority).
    assert [q.name for q in conf.task_queues] == [c.TURN_QUEUE, c.TURN_QUEUE + ".batch"]
    assert options["queue_order_strategy"] == "priority"
    assert conf.task_routes[c.DRIVE_TASK] == {"queue": c.TURN_QUEUE}
    app.close()


def test_a_rabbitmq_broker_gets_no_redis_transport_options() -> None:
    # kombu hands AMQP transport options to py-amqp's Connection as keywords, which
    # ignores those it does not know: a visibility timeout would do nothing there, and
    # RabbitMQ redelivers a kick only when the channel that took it closes.
    settings = FleetSettings.from_env({**ENV, "PARLEY_BROKER_URL": "amqp://guest@mq:5672/parley"})
    app = create_app(settings)
    assert app.conf.broker_transport_options == {}
    assert app.conf.broker_transport is None  # kombu's AMQP transport, not parley's channel
    assert app.conf.task_acks_late and app.conf.worker_prefetch_multiplier == 1
    app.close()
    for url in ("redis://cache/1", "rediss://cache/1", "redis+socket:///run/redis.sock"):
        assert transport_options(url)["visibility_timeout"] == c.VISIBILITY_TIMEOUT_SECONDS
        assert transport_options(url)["max_connections"] == REDIS_BROKER_CONNECTIONS


AMQP = {**ENV, "PARLEY_BROKER_URL": "amqp://guest@mq:5672/parley"}


def test_a_rabbitmq_brokers_kick_queues_are_quorum_queues_unless_classic() -> None:
    app = create_app(FleetSettings.from_env(AMQP))
    queues = app.conf.task_queues
    assert [q.name for q in queues] == [c.TURN_QUEUE, c.TURN_QUEUE + ".batch"]
    for queue in queues:
        assert queue.queue_arguments == {"x-queue-type": "quorum"} and queue.durable
        # A topic exchange of its own, not named like the queue (a classic queue's
        # direct exchange is): Celery's delayed delivery forwards only to a topic one.
        assert (queue.exchange.name, queue.exchange.type) == (queue.name + ".kicks", "topic")
        assert queue.routing_key == queue.name
    app.close()
    settings = FleetSettings.from_env({**AMQP, "PARLEY_BROKER_QUEUE_TYPE": "classic"})
    assert settings.queue_type == "classic"
    classic = create_app(settings).conf.task_queues
    # (As before quorum queues: Celery binds them to the direct exchange of its default.)
    assert [(q.name, q.queue_arguments, q.exchange.name) for q in classic] == [
        (c.TURN_QUEUE, None, ""),
        (c.TURN_QUEUE + ".batch", None, ""),
    ]


def test_a_redis_broker_ignores_the_queue_type() -> None:
    settings = FleetSettings.from_env({**ENV, "PARLEY_BROKER_QUEUE_TYPE": "quorum"})
    assert settings.queue_type == "quorum" and not quorum_queues(settings)
    assert all(q.queue_arguments is None for q in create_app(settings).conf.task_queues)


@pytest.mark.parametrize("value", ["Quorum", "stream", "classic ", "1"])
def test_a_bad_queue_type_is_a_clear_error(value: str) -> None:
    with pytest.raises(InvalidRequest, match="PARLEY_BROKER_QUEUE_TYPE must be quorum or classic"):
        FleetSettings.from_env({**AMQP, "PARLEY_BROKER_QUEUE_TYPE": value})
    assert FleetSettings.from_env({**AMQP, "PARLEY_BROKER_QUEUE_TYPE": ""}).queue_type == "quorum"


@pytest.mark.parametrize("queue", [c.TURN_QUEUE, c.TURN_QUEUE + ".batch", "q"])
def test_a_delayed_kick_tells_its_queue(queue: str) -> None:
    # (A kick that waited in RabbitMQ's delay queues carries its countdown's bits.)
    assert kick_queue(queue) == queue
    for seconds in (1, 3, 2**28 - 1):
        assert kick_queue(calculate_routing_key(seconds, queue)) == queue


def test_the_database_pool_size_comes_from_the_environment() -> None:
    assert FleetSettings.from_env(ENV).database_pool_size == DATABASE_POOL_SIZE
    settings = FleetSettings.from_env({**ENV, "PARLEY_DATABASE_POOL_SIZE": "25"})
    assert settings.database_pool_size == 25
    assert FleetSettings.from_env(
        {**ENV, "PARLEY_DATABASE_POOL_SIZE": ""}
    ) == FleetSettings.from_env(ENV)


@pytest.mark.parametrize("value", ["many", "0", "-3", "2.5"])
def test_a_bad_database_pool_size_is_a_clear_error(value: str) -> None:
    with pytest.raises(InvalidRequest, match="PARLEY_DATABASE_POOL_SIZE"):
        FleetSettings.from_env({**ENV, "PARLEY_DATABASE_POOL_SIZE": value})


def test_importing_parley_leaves_the_brokers_transport_to_the_first_connection() -> None:
    # The embedded client never talks to a broker: kombu's Redis transport (and parley's
    # channel on it) are imported by kombu when a fleet connects, not by ``import parley``.
    probe = "import sys, parley; print(sorted(m for m in sys.modules if 'transport' in m))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert "kombu.transport.redis" not in loaded
    assert "parley.fleet.transport" not in loaded
