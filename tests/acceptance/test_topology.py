"""The topology an operator scales to, all at once (docs/scaling.md): PostgreSQL behind
PgBouncer in transaction mode, the coordination on a Redis Cluster of three primaries
with a replica each, the kicks on RabbitMQ's quorum queues; two workers on the
Procfile's line, the sweeper and a client, every one of them on all three.

The fleet's scenarios hold there as on one server of each: order per session, steers,
readers that drop their stream and come back, a worker SIGKILLed mid-turn; and the
server sees no more connections than the pooler's pool."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.chaos import Chaos
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import procfile_worker
from tests.support.fleet_scenarios import killed_during_a_tool_call, steers_and_rejoining_readers
from tests.support.pgbouncer import peak_server_connections, pgbouncer
from tests.support.rabbitmq import consumers
from tests.support.redis_cluster import redis_cluster

pytestmark = [pytest.mark.postgres, pytest.mark.amqp, pytest.mark.slow]

POOL_SIZE = 8


@pytest.fixture
def scaled_out(workspace: Path, amqp_url: str) -> Iterator[Chaos]:
    pool, concurrency = procfile_worker()
    with (
        pgbouncer(pool_size=POOL_SIZE) as bouncer,
        redis_cluster() as nodes,
        fresh_postgres_database("topology") as url,
    ):
        harness = Chaos(
            bouncer.url_of(url),
            workspace,
            pool=pool,
            concurrency=concurrency,
            redis_url=nodes.url,
            broker_url=amqp_url,
        )
        try:
            yield harness
        finally:
            harness.close()


def test_the_fleet_on_pgbouncer_a_redis_cluster_and_quorum_queues(scaled_out: Chaos) -> None:
    assert consumers(scaled_out.fleet.broker, scaled_out.fleet.queue) == 2  # the two workers
    with peak_server_connections(scaled_out.database_url) as peak:
        steers_and_rejoining_readers(scaled_out, sessions=8)
        killed_during_a_tool_call(scaled_out)
    assert 0 < peak[0] <= POOL_SIZE, peak[0]
