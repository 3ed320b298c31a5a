"""Fleet benchmark: the floors and the fleet measured in one run, figures as ratios.

    .venv/bin/python -m tests.bench.fleet

Needs the machine's PostgreSQL and Redis (Redis database 11 is flushed).  Starts two
single-process `parley worker`s and `parley beat`, and, for the floor, two
single-process Celery workers running a noop task with the same broker settings on
kombu's own Redis channel (then once more on parley's, for comparison only).
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import redis

import parley
from schemas.events import EventKind
from tests.conftest import fresh_postgres_database
from tests.fleet import REPO, Fleet, flush_redis
from workers import constants as c

REDIS_URL = os.environ.get("PARLEY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
TEXT = "".join(f"t{i:02d}" for i in range(70))  # 70 chunks of 3 characters
RULES = [
    {"when": "^one", "steps": [{"text": TEXT, "chunk_chars": 3}]},
    {
        "when": "^crash",
        "steps": [
            {"tool_calls": [{"name": "list_files"}]},
            {"text": "x" * 600, "chunk_chars": 3, "delay_ms": 10},
        ],
    },
]


def pct(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def ms(value: float) -> str:
    return f"{value * 1e3:7.2f} ms"


# ---------------------------------------------------------------- the floor


class NoopFloor:
    """Two single-process Celery workers running a noop task, and a producer for it.
    ``channel``: "stock" for kombu's Redis channel (the floor), "parley" for parley's."""

    def __init__(self, database_url: str, channel: str) -> None:
        self.queue = f"bench.noop.{uuid.uuid4().hex[:6]}"
        env = {
            **os.environ,
            "PARLEY_DATABASE_URL": database_url,
            "PARLEY_REDIS_URL": REDIS_URL,
            "PARLEY_QUEUE": self.queue,
            "PARLEY_BENCH_CHANNEL": channel,
            "PYTHONPATH": str(REPO),
        }
        self.workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "tests.bench.noop_app",
                    "worker",
                    "--queues",
                    self.queue,
                    "--concurrency",
                    "1",
                    "--loglevel",
                    "WARNING",
                    "--hostname",
                    f"noop{n}@%h",
                ],
                env=env,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for n in range(2)
        ]
        from broker_config.app import create_app
        from broker_config.settings import FleetSettings

        self.app = create_app(FleetSettings.from_env(env), stock_kombu=channel == "stock")
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.key = f"bench:{uuid.uuid4().hex}"
        self.app.send_task("bench.noop", args=[self.key], queue=self.queue)
        assert self.redis.blpop([self.key], timeout=60), "noop workers did not start"

    def round_trip(self) -> float:
        """Seconds from sending a noop task until it ran."""
        start = time.perf_counter()
        self.app.send_task("bench.noop", args=[self.key], queue=self.queue)
        self.redis.blpop([self.key], timeout=10)
        return time.perf_counter() - start

    def rate(self, count: int) -> float:
        """Tasks/s for ``count`` tasks sent at once."""
        start = time.perf_counter()
        for _ in range(count):
            self.app.send_task("bench.noop", args=[self.key], queue=self.queue)
        for _ in range(count):
            self.redis.blpop([self.key], timeout=30)
        return count / (time.perf_counter() - start)

    def close(self) -> None:
        """Stop the workers (once)."""
        if not self.workers:
            return
        self.redis.close()
        self.app.close()
        for worker in self.workers:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(20)
        self.workers = []

    def __enter__(self) -> NoopFloor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- parley


def latencies(
    client: parley.Client, root: Path, count: int, between: Callable[[], float] | None = None
) -> tuple[list[float], list[float], list[float]]:
    """submit → first token and submit → end of a one-step, 70-chunk turn; and what
    ``between`` measures after each turn (the floor sent as kicks are: after a pause)."""
    first, end, interleaved = [], [], []
    for _ in range(count):
        if between is not None:
            interleaved.append(between())
        session = client.open_session(root)
        start = time.perf_counter()
        handle = session.submit("one step")
        got_first = None
        for event in handle.events():
            if got_first is None and event.kind is EventKind.TOKEN:
                got_first = time.perf_counter() - start
            if event.kind is EventKind.END:
                end.append(time.perf_counter() - start)
        assert got_first is not None
        first.append(got_first)
    return first, end, interleaved


def throughput(client: parley.Client, root: Path) -> float:
    """Turns per second for 200 one-step turns over 50 sessions."""
    sessions = [client.open_session(root) for _ in range(50)]
    start = time.perf_counter()
    handles = [s.submit(f"one of four {n}") for n in range(4) for s in sessions]
    for handle in handles:
        assert handle.wait(120).outcome is parley.TurnStatus.FINISHED
    return len(handles) / (time.perf_counter() - start)


DRIVE_LINE = re.compile(
    r"turns=(\d+) transactions=(\d+) round_trips=(\d+) events=(\d+) coalesced=(\d+)"
)


def worker_counters(fleet: Fleet) -> tuple[int, ...]:
    """Sum the per-drive counters the workers log (duplicate kicks included)."""
    totals = [0] * 5
    for log in fleet.log_dir.glob(f"{fleet.queue}-worker-*.log"):
        for match in DRIVE_LINE.finditer(log.read_text(errors="replace")):
            for i in range(5):
                totals[i] += int(match.group(i + 1))
    return tuple(totals)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_by_role(fleet: Fleet) -> dict[str, float]:
    """CPU seconds used so far by this producer, the fleet's workers (Celery's main and
    pool processes), its sweeper, PostgreSQL and Redis, read from /proc."""
    groups = {p.pid: ("sweeper" if n == 2 else "workers") for n, p in enumerate(fleet.processes)}
    totals = dict.fromkeys(("producer", "workers", "sweeper", "PostgreSQL", "Redis"), 0.0)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        pid, pgid = int(stat.parent.name), int(fields[2])
        seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        if pid == os.getpid():
            totals["producer"] += seconds
        elif pgid in groups:
            totals[groups[pgid]] += seconds
        elif name.startswith("postgres"):
            totals["PostgreSQL"] += seconds
        elif name.startswith("redis-server"):
            totals["Redis"] += seconds
    return totals


def bytes_of_turn(database_url: str, turn_id: str) -> int:
    """Bytes of every row stored for one turn."""
    sql = """
        SELECT
          (SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM turns t WHERE t.id = %(t)s)
        + (SELECT coalesce(sum(pg_column_size(r.*)), 0) FROM runs r WHERE r.turn_id = %(t)s)
        + (SELECT coalesce(sum(pg_column_size(s.*)), 0) FROM steps s
             JOIN runs r ON r.id = s.run_id WHERE r.turn_id = %(t)s)
        + (SELECT coalesce(sum(pg_column_size(e.*)), 0) FROM events e WHERE e.turn_id = %(t)s)
    """
    with psycopg.connect(database_url.replace("+psycopg", "")) as db:
        row = db.execute(sql, {"t": turn_id}).fetchone()
    assert row is not None
    return int(row[0])


def storage(
    client: parley.Client, root: Path, database_url: str
) -> tuple[dict[int, int], dict[int, float], tuple[int, int]]:
    """Bytes stored for turns 10 and 1000 of one session, the median seconds of
    ``session.turn`` (submit, run, wait) around each, and the bytes the last turn holds
    in Redis once ended: its replay buffer, and its ends stream."""
    session = client.open_session(root)
    sizes, times = {}, []
    for n in range(1, 1001):
        start = time.perf_counter()
        result = session.turn(f"one of many {n}")
        times.append(time.perf_counter() - start)
        if n in (10, 1000):
            sizes[n] = bytes_of_turn(database_url, result.turn_id)
    cache = redis.Redis.from_url(REDIS_URL)
    in_redis = tuple(
        int(cache.memory_usage(key) or 0)
        for key in (c.events_key(result.turn_id), c.ends_key(result.turn_id))
    )
    cache.close()
    medians = {10: statistics.median(times[:20]), 1000: statistics.median(times[-20:])}
    return sizes, medians, (in_redis[0], in_redis[1])


def crash_to_resume(fleet: Fleet, client: parley.Client, root: Path) -> float:
    """Seconds from a worker's SIGKILL to its turn running again on another worker."""
    handle = client.open_session(root).submit("crash me")
    for event in handle.events():
        if event.kind is EventKind.TOKEN:
            break
    worker = client.store.run_state(handle.turn_id).worker
    assert worker is not None
    os.killpg(os.getpgid(int(worker.split(":")[1])), signal.SIGKILL)
    killed = time.perf_counter()
    for event in handle.events(after=0):
        if event.kind is EventKind.STARTED and event.data["attempt"] == 2:
            return time.perf_counter() - killed
    raise AssertionError("the turn never started again")


def main() -> int:
    flush_redis(REDIS_URL)
    with fresh_postgres_database("bench") as database_url, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "workspace"
        root.mkdir()
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps({"rules": RULES}))

        with NoopFloor(database_url, "parley") as channel:
            channel_trips = [channel.round_trip() for _ in range(300)]
            channel_rate = channel.rate(1000)
        with NoopFloor(database_url, "stock") as floor:  # also sent between turns, below
            round_trips = [floor.round_trip() for _ in range(300)]
            noop_rate = floor.rate(1000)
            fleet = Fleet(
                database_url=database_url,
                redis_url=REDIS_URL,
                host=f"scripted:{script}",
                log_dir=Path(tmp),
            )
            fleet.start_worker(concurrency=1)
            fleet.start_worker(concurrency=1)
            fleet.start_beat()  # third process: cpu_by_role counts it as the sweeper
            fleet.wait_ready()
            client = parley.connect(database_url, redis_url=REDIS_URL, queue=fleet.queue)
            try:
                latencies(client, root, 20)  # warm up both workers
                first, end, paused_trips = latencies(client, root, 200, between=floor.round_trip)
                floor.close()  # not needed past here
                client_before = client.store.transactions
                counters_before = worker_counters(fleet)
                cpu_before = cpu_by_role(fleet)
                rate = throughput(client, root)
                cpu = {k: v - cpu_before[k] for k, v in cpu_by_role(fleet).items()}
                client_xacts = client.store.transactions - client_before
                turns, worker_xacts, trips, events, coalesced = (
                    a - b for a, b in zip(worker_counters(fleet), counters_before, strict=True)
                )
                sizes, turn_times, in_redis = storage(client, root, database_url)
                resume = crash_to_resume(fleet, client, root)
            finally:
                client.close()
                fleet.stop()

    noop = statistics.median(round_trips)
    print(f"bare Celery noop round trip   p50 {ms(noop)}   p95 {ms(pct(round_trips, 0.95))}")
    print(f"bare Celery noop throughput   {noop_rate:7.1f} tasks/s (2 workers)")
    print(
        f"  same noop, parley's channel p50 {ms(statistics.median(channel_trips))}   "
        f"{channel_rate:7.1f} tasks/s (not the floor: what broker_config.transport saves)"
    )
    print(
        f"submit → first token          p50 {ms(statistics.median(first))}   "
        f"p95 {ms(pct(first, 0.95))}   {statistics.median(first) / noop:4.2f}× noop (target ≤ 3)"
    )
    paused = statistics.median(paused_trips)
    print(
        f"  the noop sent between turns p50 {ms(paused)}   (sent after a pause, as kicks are; "
        f"first token {statistics.median(first) / paused:4.2f}× that; not the floor)"
    )
    print(
        f"submit → end (70 chunks)      p50 {ms(statistics.median(end))}   p95 {ms(pct(end, 0.95))}"
    )
    print(
        f"throughput, 200 turns/50 sess {rate:7.1f} turns/s   "
        f"{rate / noop_rate:4.2f}× noop (target ≥ 0.3)"
    )
    print(
        "CPU per turn in that run      "
        + "   ".join(f"{role} {1e3 * seconds / turns:4.2f} ms" for role, seconds in cpu.items())
        + f"   (all {1e3 * sum(cpu.values()) / turns:5.2f} ms on {os.cpu_count()} cores)"
    )
    print(
        f"PostgreSQL transactions/turn  {worker_xacts / turns:5.2f} by the workers for a "
        f"one-step turn, duplicate kicks included (target ≤ 1 + 2), "
        f"{client_xacts / turns:4.2f} by the producer (its submissions and new sessions; "
        f"wait's reads run outside transactions)"
    )
    print(
        f"Redis round trips/100 deltas  {100 * trips / (events + coalesced):5.2f} "
        f"({events + coalesced} events and deltas in {trips} pipelines, {coalesced} deltas "
        f"joined a queued token event; target ≤ 10)"
    )
    print(
        f"bytes stored per turn         turn 10: {sizes[10]} B   turn 1000: {sizes[1000]} B "
        f"({sizes[1000] / sizes[10]:4.2f}×)"
    )
    print(
        f"Redis bytes per ended turn    {in_redis[0]} B replay buffer (kept "
        f"PARLEY_REPLAY_SECONDS, default {c.ENDED_BUFFER_SECONDS} s) + {in_redis[1]} B ends "
        f"stream (kept {c.ENDS_STREAM_SECONDS} s)"
    )
    print(
        f"one turn, submit to result    turns 1–20: {ms(turn_times[10])}   turns 981–1000: "
        f"{ms(turn_times[1000])} ({turn_times[1000] / turn_times[10]:4.2f}×; each request "
        "carries the whole history)"
    )
    print(f"SIGKILL → running elsewhere   {resume:5.2f} s (target ≤ 15)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
