"""Redis URLs and keys for a Redis Cluster (src/parley/coordination/redis_clients.py and the
key shapes of src/parley/coordination/constants.py): what names a cluster, what a cluster
URL may say, what a log line shows of one, that a cluster is never the broker, and that
every key a script or a command touches together lands in one hash slot."""

from __future__ import annotations

import uuid

import pytest
import redis
from redis.crc import key_slot

from parley.coordination import constants as c
from parley.coordination.admission_checks import check_model
from parley.coordination.redis_clients import (
    ClusterClient,
    address_of,
    cluster_seeds,
    is_cluster,
    open_client,
)
from parley.fleet.settings import FleetSettings
from parley.schemas.errors import InvalidRequest

ENV = {"PARLEY_DATABASE_URL": "postgresql://db/parley", "PARLEY_REDIS_URL": "redis://r:6379/0"}


def test_a_cluster_is_named_by_its_scheme() -> None:
    assert is_cluster("redis+cluster://10.0.0.1:7000")
    assert is_cluster("rediss+cluster://10.0.0.1:7000")
    assert not is_cluster("redis://10.0.0.1:6379/0")
    assert not is_cluster("unix:///run/redis.sock")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://10.0.0.1", "HOST:PORT"),
        ("redis+cluster://:7000", "HOST:PORT"),
        ("redis+cluster://10.0.0.1:7000,10.0.0.2", "HOST:PORT"),
        ("redis+cluster://10.0.0.1:70000", "HOST:PORT"),
        ("redis+cluster://10.0.0.1:7000/3", "only database 0"),
    ],
)
def test_a_cluster_url_names_one_node_and_database_0(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        cluster_seeds(url)
    with pytest.raises(InvalidRequest, match=says):
        FleetSettings.from_env({**ENV, "PARLEY_REDIS_URL": url, "PARLEY_BROKER_URL": "amqp://x"})


def test_a_cluster_url_may_name_several_nodes_any_of_which_will_do() -> None:
    url = "rediss+cluster://app:s3cret@10.0.0.1:7000,[::1]:7001, node-c:7002/0"
    assert cluster_seeds(url) == [("10.0.0.1", 7000), ("::1", 7001), ("node-c", 7002)]
    assert address_of(url) == "cluster 10.0.0.1:7000,[::1]:7001, node-c:7002"


def test_a_cluster_client_reaches_for_the_cluster_when_first_used_and_fails_as_a_server_does() -> (
    None
):
    # Nothing listens on port 1: making the client asks nothing, using it raises the
    # ConnectionError every caller of one server already handles (redis-py's own cluster
    # errors are no RedisError); its scripts are made without a connection too.
    client = open_client("redis+cluster://127.0.0.1:1", max_connections=2, socket_timeout=0.5)
    assert isinstance(client, ClusterClient)
    script = client.register_script("return 1")
    with pytest.raises(redis.ConnectionError, match="no node of the Redis Cluster answers"):
        client.ping()
    with pytest.raises(redis.ConnectionError):
        script(keys=["k"])
    client.close()


def test_a_cluster_is_never_the_broker() -> None:
    cluster = "redis+cluster://10.0.0.1:7000"
    with pytest.raises(InvalidRequest, match="PARLEY_BROKER_URL"):
        FleetSettings.from_env({**ENV, "PARLEY_REDIS_URL": cluster})  # (the default broker)
    with pytest.raises(InvalidRequest, match="cannot be Celery's broker"):
        FleetSettings.from_env({**ENV, "PARLEY_BROKER_URL": cluster})
    settings = FleetSettings.from_env(
        {**ENV, "PARLEY_REDIS_URL": cluster, "PARLEY_BROKER_URL": "redis://broker:6379/0"}
    )
    assert (settings.redis_url, settings.broker_url) == (cluster, "redis://broker:6379/0")


def test_what_a_log_line_names_of_redis_hides_the_password() -> None:
    assert address_of("redis+cluster://:s3cret@10.0.0.1:7000") == "cluster 10.0.0.1:7000"
    assert address_of("redis://user:s3cret@10.0.0.1:6380/2") == "10.0.0.1:6380/2"
    assert address_of("redis://10.0.0.1") == "10.0.0.1:6379/0"
    assert address_of("unix:///run/redis.sock") == "/run/redis.sock"


def test_each_sessions_keys_share_one_slot_and_each_turns_too() -> None:
    session, turn = str(uuid.uuid4()), str(uuid.uuid4())
    session_keys = [c.lock_key, c.work_key, c.kick_pending_key, c.kicked_key]
    turn_keys = [
        c.events_key,
        c.ends_key,
        c.owner_key,
        c.steers_key,
        c.deltas_channel,
        c.ended_channel,
    ]
    assert len({key_slot(k(session).encode()) for k in session_keys}) == 1
    assert len({key_slot(k(turn).encode()) for k in turn_keys}) == 1
    assert {c.tagged_id(k(session)) for k in session_keys} == {session}
    assert {c.tagged_id(k(turn)) for k in turn_keys} == {turn}
    model = "openai:gpt-4o"
    admission = [
        c.admission_key,
        c.admission_tickets_key,
        c.admission_weights_key,
        c.admission_served_key,
        c.admission_interactive_key,
    ]
    assert len({key_slot(k(model).encode()) for k in admission}) == 1


def test_an_id_with_a_brace_is_tagged_by_its_hash_and_keeps_its_keys_together() -> None:
    chosen = "}team{42"
    keys = [c.lock_key(chosen), c.work_key(chosen), c.kick_pending_key(chosen)]
    assert len({key_slot(k.encode()) for k in keys}) == 1
    assert c.tagged_id(keys[0]).startswith("sha1-")
    assert c.lock_key(chosen) != c.lock_key("}team{43")


def test_a_model_name_with_a_brace_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="no braces"):
        check_model("gpt-{4}")


def test_sessions_spread_over_the_slots() -> None:
    slots = {key_slot(c.lock_key(str(uuid.uuid4())).encode()) for _ in range(1000)}
    thirds = {slot * 3 // 16384 for slot in slots}  # a three-primary cluster's shares
    assert len(slots) > 900 and thirds == {0, 1, 2}
