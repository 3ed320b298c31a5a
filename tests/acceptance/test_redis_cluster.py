"""The fleet on a Redis Cluster (docs/scaling.md#redis-cluster): three primaries with a
replica each, started by the test on loopback, hold every lock, buffer, steer list and
work mark (``PARLEY_REDIS_URL=redis+cluster://…``); the broker is a Redis server of its
own, as it must be.  Two workers on the Procfile's line, the sweeper and a client.

What holds there as on one server: order per session, steers, readers that drop their
stream and come back, a worker SIGKILLed mid-turn; every node emptied at once under load
loses no turn; a primary killed under load (its replica promoted, its slots served again)
loses no turn, duplicates no step and cuts off no turn whose session's lock was on another
node; the keys spread over the nodes, each turn's and
each session's in one slot; and gateways stream turns and wait for their ends there, a
reader moving from one gateway to another."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.coordination import constants as c
from tests.support.chaos import CHAOS_REDIS_URL, Chaos
from tests.support.databases import fresh_postgres_database
from tests.support.events import assert_once_in_order
from tests.support.fleet import flush_redis, procfile_worker
from tests.support.fleet_scenarios import (
    assert_completed_once_in_order,
    killed_during_a_tool_call,
    steers_and_rejoining_readers,
    submit_load,
)
from tests.support.gateway import TENANT, Gateway, start_fleet_gateway, wait_ready
from tests.support.helpers import Control
from tests.support.redis_cluster import (
    FAILOVER_NODE_TIMEOUT_MS,
    RedisClusterNodes,
    redis_cluster,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def nodes() -> Iterator[RedisClusterNodes]:
    with redis_cluster(node_timeout_ms=FAILOVER_NODE_TIMEOUT_MS) as started:
        yield started


@pytest.fixture
def clustered(workspace: Path, nodes: RedisClusterNodes) -> Iterator[Chaos]:
    """A fleet whose coordination is the cluster, its kicks on the chaos Redis database."""
    pool, concurrency = procfile_worker()
    with fresh_postgres_database("clustered") as url:
        flush_redis(CHAOS_REDIS_URL)
        harness = Chaos(
            url,
            workspace,
            pool=pool,
            concurrency=concurrency,
            redis_url=nodes.url,
            broker_url=CHAOS_REDIS_URL,
        )
        try:
            yield harness
        finally:
            harness.close()


def _all_keys(nodes: RedisClusterNodes) -> dict[int, list[str]]:
    """Every key of each primary, by its port."""
    found: dict[int, list[str]] = {}
    for port in nodes.primaries():
        client = nodes.node(port)
        try:
            found[port] = [k.decode() for k in client.scan_iter(count=1000)]
        finally:
            client.close()
    return found


def test_the_fleet_on_a_cluster_keeps_order_steers_and_readers_and_spreads_its_keys(
    clustered: Chaos, nodes: RedisClusterNodes
) -> None:
    steers_and_rejoining_readers(clustered, sessions=8)
    by_node = _all_keys(nodes)
    # Sessions and turns spread over every primary...
    assert all(len(keys) > 0 for keys in by_node.values()), {p: len(k) for p, k in by_node.items()}
    # ...each key carrying its session or turn as its hash tag, every key of one session
    # or turn on one node (in one slot: its scripts' keys).
    nodes_of: dict[str, set[int]] = {}
    for port, node_keys in by_node.items():
        for key in node_keys:
            assert key.startswith("parley:") and "{" in key, key
            nodes_of.setdefault(c.tagged_id(key), set()).add(port)
    assert all(len(ports) == 1 for ports in nodes_of.values()), nodes_of
    sessions = {c.tagged_id(k) for keys in by_node.values() for k in keys if "work:" in k}
    assert len(sessions) == 8 and len(nodes_of) > 8  # the sessions' and their turns'


def test_a_worker_killed_mid_turn_on_a_cluster_is_replaced(clustered: Chaos) -> None:
    killed_during_a_tool_call(clustered)


def test_emptying_every_node_under_load_loses_no_turn(
    clustered: Chaos, nodes: RedisClusterNodes
) -> None:
    load = submit_load(clustered, sessions=8, turns=3)
    wait_until(
        lambda: (
            sum(
                clustered.client.store.run_state(h.turn_id).status.terminal for s in load for h in s
            )
            >= 3
        ),
        what="some turns to finish",
    )
    nodes.flushall()  # locks, buffers, steer lists, work marks: all gone, on every node
    assert_completed_once_in_order(clustered, load)


LONG = "".join(f"l{i:03d} " for i in range(80))  # 80 chunks 50 ms apart: 4 s a turn


def test_a_primary_killed_under_load_is_replaced_by_its_replica_and_no_turn_is_lost(
    clustered: Chaos, nodes: RedisClusterNodes
) -> None:
    clustered.control.script(
        [
            {
                "when": "long",
                "steps": [
                    {"tool_calls": [{"name": "list_files"}]},
                    {"text": LONG, "chunk_chars": 5, "delay_ms": 50},
                ],
            }
        ]
    )
    opened = [clustered.client.open_session(clustered.workspace) for _ in range(9)]
    handles = [session.submit("long") for session in opened]
    wait_until(
        lambda: all(
            clustered.client.store.run_state(h.turn_id).status is parley.TurnStatus.RUNNING
            for h in handles
        ),
        what="every turn to run",
    )
    # The primary holding the first session's lock (and whatever else hashed there).
    victim = nodes.holder(c.lock_key(opened[0].id))
    elsewhere = [h for h in handles if nodes.holder(c.lock_key(h.session_id)) != victim]
    assert elsewhere, "every session on one node: nothing to compare"
    nodes.kill(victim)
    for handle in handles:
        result = handle.wait(90)
        assert result.outcome is parley.TurnStatus.FINISHED and result.reply == LONG
        assert [s.index for s in clustered.client.store.steps_of(handle.turn_id)] == [0, 1]
        # A reader from the start sees each event once, in order, whichever node died,
        # and every durable one.  (Tokens the dead primary took and its replica had not
        # yet copied are lost, as after a FLUSHALL: the committed step holds its text.)
        events = list(clustered.client.attach(handle.turn_id).events())
        assert_once_in_order(events, gap_free=False)
        assert events[-1].kind is parley.EventKind.END
        durable = clustered.client.store.events_after(handle.turn_id, 0)
        assert [e for e in events if e.kind is not parley.EventKind.TOKEN] == durable
    # The sessions whose locks were on the other primaries kept their drivers: a node's
    # failover cuts off its own sessions' turns at most (each heartbeat pipeline is the
    # node's own).
    assert [clustered.client.store.run_state(h.turn_id).attempts for h in elsewhere] == [1] * len(
        elsewhere
    )
    nodes.wait_healthy()  # its replica serves its slots: three primaries again
    assert victim not in nodes.primaries()


STREAMED = "".join(f"w{i:03d} " for i in range(60))


def test_gateways_follow_and_wait_for_turns_on_the_nodes_that_hold_them(
    clustered: Chaos, tmp_path: Path
) -> None:
    workspaces = tmp_path / "workspaces"
    gateways = [start_fleet_gateway(clustered.fleet, workspaces) for _ in range(2)]
    try:
        _follow_and_wait(clustered, gateways, workspaces)
    finally:
        for gateway in gateways:
            gateway.stop()


def _follow_and_wait(clustered: Chaos, gateways: list[Gateway], workspaces: Path) -> None:
    for gateway in gateways:
        wait_ready(gateway)
    Control(workspaces / TENANT / "x").script(
        [{"when": "", "steps": [{"text": STREAMED, "chunk_chars": 5, "delay_ms": 20}]}]
    )
    first, second = (gateway.tenant(TENANT) for gateway in gateways)
    turns = [
        first.submit(first.new_session(workspace="x")["id"], f"stream {n}")["turn_id"]
        for n in range(6)
    ]
    # Every turn waited for on the second gateway at once (its one ends watcher, on the
    # nodes' sharded channels), while each is read from the first and, after a few
    # events, from the second (the reader reconnecting elsewhere).
    results: dict[str, dict[str, Any]] = {}
    waiters = [
        threading.Thread(target=lambda t=t: results.__setitem__(t, second.result(t, wait=60)))
        for t in turns
    ]
    for waiter in waiters:
        waiter.start()
    for turn_id in turns:
        with first.stream(turn_id) as stream:
            head = [m.json() for m in itertools.islice(stream.events(), 5)]
        rest = second.event_json(turn_id, after=head[-1]["seq"])
        truth = [e.to_json() for e in clustered.client.attach(turn_id).events()]
        assert head + rest == truth and truth[-1]["kind"] == "end"
    for waiter in waiters:
        waiter.join(90)
    assert {t: (r["status"], r["reply"]) for t, r in results.items()} == {
        t: ("finished", STREAMED) for t in turns
    }
