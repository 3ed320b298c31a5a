"""parley's kombu Redis channel against the machine's Redis: messages still go through
and are acked as with kombu's own channel, but one Redis client serves every publish and
ack of a channel instead of a new one each, and a channel whose pool was dropped builds a
client of its new pool.  A channel its connection has let go of (as Celery's reconnect
does) still restores its unacked messages.  Which apps get the channel is settled by the
broker URL; a ``rediss://`` one gets it with kombu's TLS default (against a TLS
`redis-server` of the test's own)."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Producer, Queue  # type: ignore[attr-defined]

from parley.fleet.app import TLS_TRANSPORT, TRANSPORT, create_app, transport_for
from parley.fleet.settings import FleetSettings
from parley.fleet.transport import Channel, TlsTransport, Transport
from tests.support.fleet import REDIS_TEST_URL, flush_redis
from tests.support.redis_server import RedisServer, running_redis


@pytest.fixture
def connection() -> Iterator[Any]:
    flush_redis(REDIS_TEST_URL)
    with Connection(REDIS_TEST_URL, transport=TRANSPORT) as connection:  # type: ignore[no-untyped-call]
        yield connection


def _count_clients(channel: Any) -> list[Any]:
    """Record every synchronous Redis client the channel builds."""
    built: list[Any] = []
    make = channel.Client

    def client(**kwargs: Any) -> Any:
        built.append(make(**kwargs))
        return built[-1]

    channel.Client = client
    return built


def test_publishes_and_acks_share_one_client_and_still_arrive(connection: Any) -> None:
    assert isinstance(connection.transport, Transport)
    queue = Queue(f"test.channel.{uuid.uuid4().hex[:8]}")  # type: ignore[no-untyped-call]
    channel = connection.default_channel
    built = _count_clients(channel)
    producer = Producer(channel)  # type: ignore[no-untyped-call]
    for n in range(5):
        producer.publish(  # type: ignore[no-untyped-call]
            {"n": n}, routing_key=queue.name, declare=[queue], serializer="json"
        )
    received = []

    def take(body: Any, message: Any) -> None:
        received.append(body)
        message.ack()

    with Consumer(channel, queues=[queue], accept=["json"]) as consumer:  # type: ignore[no-untyped-call]
        consumer.register_callback(take)
        while len(received) < 5:
            connection.drain_events(timeout=5)
    assert [body["n"] for body in received] == list(range(5))
    # kombu's own channel builds one client per publish and two per delivery (its
    # unacked bookkeeping, then the ack): 17 here, with the queue's declaration.
    assert len(built) == 1
    unacked = redis.Redis.from_url(REDIS_TEST_URL).hlen(channel.unacked_key)
    assert unacked == 0


def test_a_channel_whose_pool_was_dropped_builds_a_client_of_the_new_one(connection: Any) -> None:
    channel = connection.default_channel
    before = channel._create_client()
    assert channel._create_client() is before
    channel._disconnect_pools()
    after = channel._create_client()
    assert after is not before
    assert after.connection_pool is channel.pool
    assert after.ping()
    channel.close()
    assert channel._sync_client is None  # nothing of a closed channel is kept


def test_a_channel_its_connection_let_go_of_still_restores_its_unacked_messages(
    connection: Any,
) -> None:
    admin = redis.Redis.from_url(REDIS_TEST_URL)
    _assert_restores_after_its_connection_let_go(connection, admin)
    admin.close()


def _assert_restores_after_its_connection_let_go(connection: Any, admin: redis.Redis) -> None:
    # After a lost broker, Celery calls collect() then close() on its connection.  A
    # channel whose close failed half-way during collect() (a connection error) outlives
    # it, and collect() has cleared the transport's client by the time close() reaches
    # the channel again and restores the kick it still holds: kombu's own channel builds
    # that restore's connection pool from the cleared client (AttributeError: 'NoneType'
    # object has no attribute 'hostname'), which ends Celery's reconnect loop.
    queue = Queue(f"test.channel.{uuid.uuid4().hex[:8]}")  # type: ignore[no-untyped-call]
    assert connection.transport.Channel is Channel  # parley's
    channel = connection.default_channel
    Producer(channel).publish(  # type: ignore[no-untyped-call]
        {"kick": 1}, routing_key=queue.name, declare=[queue], serializer="json"
    )
    held: list[Any] = []
    with Consumer(channel, queues=[queue], accept=["json"]) as consumer:  # type: ignore[no-untyped-call]
        consumer.register_callback(lambda _body, message: held.append(message))
        connection.drain_events(timeout=5)
        assert len(held) == 1  # delivered, not acked
        channel._disconnect_pools()  # (what the half-done close got to)
        connection.transport.client = None  # (what collect() does)
        channel.close()
    assert admin.llen(queue.name) == 1  # back in the queue


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path, tls=True) as server:
        yield server


def test_a_rediss_broker_gets_the_channel_with_kombus_tls_default(
    tls_broker: RedisServer,
) -> None:
    settings = FleetSettings.from_env(
        {
            "PARLEY_DATABASE_URL": "postgresql+psycopg://db/parley",
            "PARLEY_REDIS_URL": tls_broker.url,
        }
    )
    stock = create_app(settings, stock_kombu=True)
    app = create_app(settings)
    with stock.connection_for_write() as kombus, app.connection_for_write() as connection:
        assert not isinstance(kombus.transport, TlsTransport)
        assert isinstance(connection.transport, TlsTransport)
        assert connection.ssl == kombus.ssl == {"ssl_cert_reqs": ssl.CERT_NONE}
        admin = tls_broker.client()
        _assert_restores_after_its_connection_let_go(connection, admin)
        admin.close()
    # Options of the URL's own win, as they do with kombu's transport.
    strict = f"{tls_broker.url}?ssl_cert_reqs=required"
    with (
        stock.connection_for_write(strict) as kombus,
        app.connection_for_write(strict) as connection,
    ):
        assert isinstance(connection.transport, TlsTransport)
        assert connection.ssl == kombus.ssl == {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    app.close()
    stock.close()


@pytest.mark.parametrize(
    ("broker_url", "expected"),
    [
        ("redis://cache:6379/0", TRANSPORT),
        ("rediss://cache:6379/0", TLS_TRANSPORT),
        ("amqp://guest@rabbit//", None),
    ],
)
def test_only_redis_brokers_get_the_channel(broker_url: str, expected: str | None) -> None:
    assert transport_for(broker_url) == expected
    settings = FleetSettings.from_env(
        {
            "PARLEY_DATABASE_URL": "postgresql+psycopg://db/parley",
            "PARLEY_REDIS_URL": "redis://cache:6379/0",
            "PARLEY_BROKER_URL": broker_url,
        }
    )
    app = create_app(settings)
    assert app.conf.broker_transport == expected
    app.close()
    stock = create_app(settings, stock_kombu=True)
    assert stock.conf.broker_transport is None
    stock.close()
