"""The scaling model's measurements (docs/scaling.md#the-scaling-model): what a turn and
a delta cost each shared component, and throughput as workers are added.

    .venv/bin/python -m tests.bench.scaling [--workers 1,2,4,8,12,16] [--turns 200]

Starts a Redis Cluster of three primaries with a replica each on loopback (as the tests
do), puts the fleet's coordination on it and its broker on the machine's Redis (database
13, flushed; nothing else may use that server meanwhile: its command counts are the
broker's), and a fresh PostgreSQL database.

1. **Cost per turn**, for three shapes of turn, each ``--turns`` turns over 50 sessions
   submitted at once to two workers on the Procfile's line: the commands the Redis
   primaries ran (by command, from ``INFO commandstats``: a script's own commands
   counted too) and the bytes they received and sent, the broker's commands and the kicks
   it carried, PostgreSQL's transactions (parley's own counts: the workers' per drive,
   the producer's) and WAL bytes, and the CPU each component used.
2. **Throughput against workers**: 400 turns over 100 sessions whose model takes 40 ms
   (five chunks 10 ms apart), on 1, 2, 4 … single-process workers (one turn at a time
   each, so each adds a slot), beside the floor measured in the same run with as many
   workers: bare Celery workers each running a task that waits as long, then signals
   (``bench.wait``), on the same broker.  And the cores the whole machine's processes
   used meanwhile.
3. **One kick queue**: bare no-op tasks through one queue of a Redis broker and one
   RabbitMQ quorum queue (the machine's, ``PARLEY_TEST_AMQP_URL``), and the broker's CPU
   per task: what one queue carries per broker core.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis

import parley
from tests.bench.common import start_scripted_fleet
from tests.bench.fleet import cpu_by_role, processes, worker_counters
from tests.bench.noop_floor import NoopFloor
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import Fleet, flush_redis, procfile_worker
from tests.support.rabbitmq import AMQP_TEST_URL
from tests.support.redis_cluster import RedisClusterNodes, redis_cluster

BROKER_URL = os.environ.get("PARLEY_BENCH_BROKER_URL", "redis://127.0.0.1:6379/13")
BURST = "".join(f"t{i:02d}" for i in range(70))  # 70 deltas of 3 characters, at once
STREAM = "".join(f"s{i:03d}" for i in range(100))  # 100 deltas of 4, 10 ms apart: 1 s
SHAPES = {
    "one step, 70 deltas at once": ("one", 70, False),
    "one step, 100 deltas over 1 s": ("stream", 100, False),
    "the same, each turn followed by a reader": ("stream", 100, True),
    "a tool step, then 20 deltas": ("tool", 20, False),
}
RULES = [
    {"when": "^one", "steps": [{"text": BURST, "chunk_chars": 3}]},
    {"when": "^stream", "steps": [{"text": STREAM, "chunk_chars": 4, "delay_ms": 10}]},
    {"when": "^wait", "steps": [{"text": "w0 w1 w2 w3 w4 ", "chunk_chars": 3, "delay_ms": 10}]},
    {
        "when": "^tool",
        "steps": [
            {"tool_calls": [{"name": "list_files"}]},
            {"text": "x" * 60, "chunk_chars": 3},
        ],
    },
]
IGNORED = {"info", "cluster", "ping", "command", "config", "client", "hello", "select"}
"""Commands the measurement and the clients' handshakes send, not the fleet's work."""


@dataclass
class Sample:
    """Counters at one moment."""

    cluster_commands: Counter[str]
    cluster_bytes: tuple[int, int]  # received, sent: by every primary
    broker_commands: Counter[str]
    wal: int
    workers: tuple[int, ...]  # turns, transactions, round trips, events, coalesced
    producer_transactions: int
    cpu: dict[str, float]


def commands_of(client: redis.Redis) -> Counter[str]:
    """Calls per command since the server started (the measurement's own left out)."""
    stats = client.info("commandstats")
    counts: Counter[str] = Counter()
    for name, fields in stats.items():
        command = name.removeprefix("cmdstat_").split("|")[0]
        if command not in IGNORED:
            counts[command] += int(fields["calls"])
    return counts


def wal_position(database_url: str) -> int:
    with psycopg.connect(database_url.replace("+psycopg", "")) as db:
        row = db.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def cluster_cpu_groups(nodes: RedisClusterNodes) -> set[int]:
    return {process.pid for process in nodes.processes.values()}


def sample(
    nodes: RedisClusterNodes, broker: redis.Redis, fleet: Fleet, client: parley.Client
) -> Sample:
    commands: Counter[str] = Counter()
    received = sent = 0
    for port in nodes.primaries():
        node = nodes.node(port)
        try:
            commands += commands_of(node)
            stats = node.info("stats")
            received += int(stats["total_net_input_bytes"])
            sent += int(stats["total_net_output_bytes"])
        finally:
            node.close()
    cpu = cpu_by_role(fleet, database=fleet.database_url.rsplit("/", 1)[1])
    cluster = sum(cpu_of(cluster_cpu_groups(nodes)))
    cpu["Redis Cluster"] = cluster
    cpu["Redis"] -= cluster  # what is left is the broker's server
    cpu["broker Redis"] = cpu.pop("Redis")
    return Sample(
        cluster_commands=commands,
        cluster_bytes=(received, sent),
        broker_commands=commands_of(broker),
        wal=wal_position(fleet.database_url),
        workers=worker_counters(fleet),
        producer_transactions=client.store.transactions,
        cpu=cpu,
    )


def cpu_of(pids: set[int]) -> Iterable[float]:
    ticks = os.sysconf("SC_CLK_TCK")
    for pid, _name, fields in processes():
        if pid in pids:
            yield (int(fields[11]) + int(fields[12])) / ticks


def run_shape(
    client: parley.Client,
    root: Path,
    prefix: str,
    turns: int,
    *,
    sessions: int = 50,
    read: bool = False,
) -> float:
    """``turns`` turns of the shape over ``sessions`` sessions, all submitted at once,
    each followed by a reader of its events from its start with ``read``; seconds."""
    opened = [client.open_session(root) for _ in range(sessions)]
    start = time.perf_counter()
    handles = [opened[n % sessions].submit(f"{prefix} {n}") for n in range(turns)]
    readers = [threading.Thread(target=_read_all, args=(h,)) for h in handles if read]
    for reader in readers:
        reader.start()
    for handle in handles:
        assert handle.wait(300).outcome is parley.TurnStatus.FINISHED
    for reader in readers:
        reader.join(300)
    return time.perf_counter() - start


def _read_all(handle: parley.TurnHandle) -> None:
    for _event in handle.events():
        pass


WAITS, WAIT_MS = 4, 10  # the "wait" rule's model: what the floor's task waits
SCALE_TURNS = 400


def costs(nodes: RedisClusterNodes, database_url: str, tmp: Path, turns: int) -> None:
    pool, concurrency = procfile_worker()
    fleet, root = scripted_fleet(
        database_url, nodes.url, tmp, workers=2, pool=pool, concurrency=concurrency
    )
    client = parley.connect(
        database_url, redis_url=nodes.url, broker_url=BROKER_URL, queue=fleet.queue
    )
    broker = redis.Redis.from_url(BROKER_URL)
    try:
        run_shape(client, root, "one", 20)  # warm up
        for label, (prefix, deltas, read) in SHAPES.items():
            time.sleep(1)  # the sweeper's kicks of the last run settle
            before = sample(nodes, broker, fleet, client)
            seconds = run_shape(client, root, prefix, turns, read=read)
            after = sample(nodes, broker, fleet, client)
            report(label, deltas, turns, seconds, before, after)
    finally:
        broker.close()
        client.close()
        fleet.stop()


def report(label: str, deltas: int, turns: int, seconds: float, a: Sample, b: Sample) -> None:
    cluster = b.cluster_commands - a.cluster_commands
    broker = b.broker_commands - a.broker_commands
    drives, worker_xacts, trips, events, coalesced = (
        y - x for x, y in zip(a.workers, b.workers, strict=True)
    )
    producer = b.producer_transactions - a.producer_transactions
    received = b.cluster_bytes[0] - a.cluster_bytes[0]
    sent = b.cluster_bytes[1] - a.cluster_bytes[1]
    cpu = {role: b.cpu[role] - a.cpu[role] for role in b.cpu}
    top = ", ".join(f"{name} {count / turns:.2f}" for name, count in cluster.most_common(8))
    print(f"\n{label}: {turns} turns in {seconds:.1f} s ({turns / seconds:.0f} turns/s)")
    print(f"  Redis Cluster commands/turn {sum(cluster.values()) / turns:6.2f}  ({top})")
    print(
        f"  Redis Cluster bytes/turn    in {received / turns:7.0f}  out {sent / turns:7.0f}"
        f"   deltas/turn {deltas}, sent as {events / turns:.1f} events in "
        f"{trips / turns:.1f} pipelines ({coalesced / turns:.1f} deltas joined another)"
    )
    kicks = broker["lpush"] + broker["rpush"]
    print(
        f"  broker commands/turn        {sum(broker.values()) / turns:6.2f}  "
        f"(kicks published {kicks / turns:.2f}/turn; drives {drives / turns:.2f}/turn)"
    )
    print(
        f"  PostgreSQL transactions/turn {(worker_xacts + producer) / turns:5.2f}  "
        f"(workers {worker_xacts / turns:.2f}, producer {producer / turns:.2f})   "
        f"WAL {(b.wal - a.wal) / turns:7.0f} B/turn"
    )
    print(
        "  CPU ms/turn                 "
        + "  ".join(f"{role} {1e3 * s / turns:.2f}" for role, s in cpu.items())
    )


def scripted_fleet(
    database_url: str, redis_url: str, directory: Path, **workers: Any
) -> tuple[Fleet, Path]:
    """Workers (``workers``: how many, their pool and concurrency) and the sweeper on the
    cluster, kicks on the broker, their model following :data:`RULES`."""
    return start_scripted_fleet(
        database_url, redis_url, directory, RULES, broker_url=BROKER_URL, **workers
    )


def scale(nodes: RedisClusterNodes, database_url: str, tmp: Path, counts: list[int]) -> None:
    print(
        f"\nthroughput, {SCALE_TURNS} turns over 100 sessions, a 40 ms model, against "
        "single-process workers"
    )
    print("workers  parley turns/s  floor tasks/s  ratio   cores used (parley, floor)")
    for workers in counts:
        flush_redis(BROKER_URL)
        with NoopFloor(database_url, BROKER_URL, "stock", workers=workers) as floor:
            floor_rate, floor_cores = waiting_rate(floor, workers)
        directory = tmp / f"scale-{workers}"
        directory.mkdir()
        fleet, root = scripted_fleet(database_url, nodes.url, directory, workers=workers)
        client = parley.connect(
            database_url, redis_url=nodes.url, broker_url=BROKER_URL, queue=fleet.queue
        )
        try:
            run_shape(client, root, "wait", 2 * workers)  # every worker warm
            busy = machine_cpu()
            seconds = run_shape(client, root, "wait", SCALE_TURNS, sessions=100)
            cores = (machine_cpu() - busy) / seconds
        finally:
            client.close()
            fleet.stop()
        rate = SCALE_TURNS / seconds
        print(
            f"{workers:7d}  {rate:14.1f}  {floor_rate:13.1f}  {rate / floor_rate:5.2f}   "
            f"{cores:.2f}, {floor_cores:.2f}"
        )


def waiting_rate(floor: NoopFloor, workers: int) -> tuple[float, float]:
    """Tasks/s of :data:`SCALE_TURNS` floor tasks that wait as the model does, and the
    cores the machine used meanwhile."""
    for _ in range(2 * workers):  # every worker warm
        floor.app.send_task("bench.wait", args=[floor.key, WAITS, WAIT_MS], queue=floor.queue)
    for _ in range(2 * workers):
        floor.redis.blpop([floor.key], timeout=30)
    busy = machine_cpu()
    start = time.perf_counter()
    for _ in range(SCALE_TURNS):
        floor.app.send_task("bench.wait", args=[floor.key, WAITS, WAIT_MS], queue=floor.queue)
    for _ in range(SCALE_TURNS):
        assert floor.redis.blpop([floor.key], timeout=60), "a floor task never ended"
    seconds = time.perf_counter() - start
    return SCALE_TURNS / seconds, (machine_cpu() - busy) / seconds


def brokers(database_url: str) -> None:
    """One kick queue's carrying capacity on each broker: bare no-op tasks through it
    from two workers, and the broker's CPU per task."""
    print("\none queue, 2000 no-op tasks to 2 single-process workers")
    for label, broker_url, process in (
        ("Redis (kombu's channel)", BROKER_URL, "redis-server"),
        ("RabbitMQ, a quorum queue", AMQP_TEST_URL, "beam.smp"),
    ):
        flush_redis(BROKER_URL)
        with NoopFloor(database_url, BROKER_URL, "stock", broker_url=broker_url) as floor:
            floor.rate(200)  # warm up
            before = sum(cpu_named(process))
            rate = floor.rate(2000)
            used = sum(cpu_named(process)) - before
        print(f"  {label:<26} {rate:7.1f} tasks/s   broker CPU {1e3 * used / 2000:.3f} ms/task")


def cpu_named(name: str) -> Iterable[float]:
    """CPU seconds of every process called ``name``."""
    ticks = os.sysconf("SC_CLK_TCK")
    for _pid, process, fields in processes():
        if process == name:
            yield (int(fields[11]) + int(fields[12])) / ticks


def machine_cpu() -> float:
    """CPU seconds the machine spent busy since boot (/proc/stat: all but idle and
    iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.scaling")
    parser.add_argument("--workers", default="1,2,4,8,12,16", help="worker counts to run")
    parser.add_argument("--turns", type=int, default=200, help="turns per shape")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",") if n]
    flush_redis(BROKER_URL)
    with (
        redis_cluster() as nodes,
        fresh_postgres_database("scaling") as database_url,
        tempfile.TemporaryDirectory() as tmp,
    ):
        print(f"{os.cpu_count()} cores; Redis Cluster of {len(nodes.primaries())} primaries")
        costs(nodes, database_url, Path(tmp), args.turns)
        brokers(database_url)
        if counts:
            scale(nodes, database_url, Path(tmp), counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
