"""Fleet benchmark: the floors and the fleet measured in one run, figures as ratios.

    .venv/bin/python -m tests.bench.fleet [--slow-model [--turns 1000]]

Needs the machine's PostgreSQL and Redis (Redis database 11 is flushed).  Starts two
single-process `parley worker`s and `parley beat`, and, for the floor, two
single-process Celery workers running a noop task with the same broker settings on
kombu's own Redis channel (then once more on parley's, for comparison only).  Before
them, when ``../shared/floor`` is there, the fleet's pipeline floor
(:mod:`tests.bench.pipeline_floor`), whose first token and throughput parley's are
judged against.

Then the slow-model load (alone with ``--slow-model``): 1000 sessions each submit one
turn whose model streams for two seconds, all at once, to one `parley worker` of a
process per core (its default), each on Celery's threads pool, with a slot for each
turn among them; the floor is a bare Celery worker per core on the same pool, as many
slots among them, running 1000 tasks that wait as long, in the same run.  Beside them:
the same worker as one process (the figure before issue 50), and the Procfile's worker
line as it is (100 slots a process, so in waves).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis

import parley
from parley.coordination import constants as c
from parley.schemas.events import EventKind
from tests.bench import pipeline_floor
from tests.bench.common import ms, pct, start_scripted_fleet
from tests.bench.noop_floor import NoopFloor
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import Fleet, flush_redis, procfile_worker

REDIS_URL = os.environ.get("PARLEY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
TEXT = "".join(f"t{i:02d}" for i in range(70))  # 70 chunks of 3 characters
SLOW_WAITS, SLOW_WAIT_MS = 100, 20  # a model that streams 101 deltas 20 ms apart: 2 s
SLOW_TEXT = "".join(f"s{i:03d}" for i in range(SLOW_WAITS + 1))  # (4 characters each)
RULES = [
    {"when": "^one", "steps": [{"text": TEXT, "chunk_chars": 3}]},
    {
        "when": "^crash",
        "steps": [
            {"tool_calls": [{"name": "list_files"}]},
            {"text": "x" * 600, "chunk_chars": 3, "delay_ms": 10},
        ],
    },
    {"when": "^slow", "steps": [{"text": SLOW_TEXT, "chunk_chars": 4, "delay_ms": SLOW_WAIT_MS}]},
]


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


def roles(fleet: Fleet) -> dict[int, str]:
    """The fleet's process groups by role: its `parley beat` is the sweeper."""
    # (Fleet starts each as a list: python -m parley COMMAND …)
    return {
        p.pid: "sweeper" if "beat" in p.args[3:4] else "workers"  # type: ignore[index]
        for p in fleet.processes
    }


def processes() -> Iterable[tuple[int, str, list[str]]]:
    """Every process's pid, name and /proc stat fields after the name."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        name = text[text.index("(") + 1 : text.rindex(")")]
        yield int(stat.parent.name), name, text[text.rindex(")") + 2 :].split()


def cpu_by_role(
    fleet: Fleet | None, groups: dict[int, str] | None = None, *, database: str | None = None
) -> dict[str, float]:
    """CPU seconds used so far by this producer, the fleet's workers (Celery's main and
    pool processes), its sweeper, PostgreSQL and Redis, read from /proc; ``groups``
    names further process groups (pgid: role) to count.  With ``database``, PostgreSQL
    is the server's own processes and the backends of that database only, not those of
    the other databases on a shared machine (Redis is counted whole)."""
    groups = {**(roles(fleet) if fleet is not None else {}), **(groups or {})}
    totals = dict.fromkeys(("producer", "workers", "sweeper", "PostgreSQL", "Redis"), 0.0)
    totals.update(dict.fromkeys(groups.values(), 0.0))
    for pid, name, fields in processes():
        pgid = int(fields[2])
        seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        if pid == os.getpid():
            totals["producer"] += seconds
        elif pgid in groups:
            totals[groups[pgid]] += seconds
        elif name.startswith("postgres") and (database is None or _serves(pid, database)):
            totals["PostgreSQL"] += seconds
        elif name.startswith("redis-server"):
            totals["Redis"] += seconds
    return totals


POSTGRES_OWN = ("checkpointer", "background writer", "walwriter", "autovacuum launcher")


def _serves(pid: int, database: str) -> bool:
    """Whether PostgreSQL process ``pid`` is the server's own (the postmaster, its
    writers) or a backend of ``database``, by the title it gives itself."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    if not title.startswith("postgres: "):
        return True  # the postmaster
    what = title.split(": ", 2)[-1]
    return f" {database} " in f" {what} " or what.strip().startswith(POSTGRES_OWN)


def peak_rss(pgids: Iterable[int]) -> int:
    """The bytes each process of the groups ``pgids`` held resident at its peak, summed
    (one process per worker on the threads pool; a prefork worker's children, or a
    worker's processes, too)."""
    return sum(peak_rss_each(pgids))


def peak_rss_each(pgids: Iterable[int]) -> list[int]:
    """The bytes each process of the groups ``pgids`` held resident at its peak."""
    wanted, peaks = set(pgids), []
    for pid, _name, fields in processes():
        if int(fields[2]) not in wanted:
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(int(line.split()[1]) * 1024)
    return peaks


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


# ---------------------------------------------------------------- a slow model


@dataclass(frozen=True)
class SlowRun:
    """What one side of the slow-model load measured."""

    turns: int
    wall: float  # seconds from the first submission to the last end
    sent: float  # seconds the submissions (or sends) took, within ``wall``
    cpu: dict[str, float]  # CPU seconds by role
    rss: int  # the workers' peak resident bytes, summed over their processes
    rss_most: int  # the peak resident bytes of the largest of those processes

    def line(self, label: str) -> str:
        per_turn = "   ".join(
            f"{role} {1e3 * seconds / self.turns:5.2f}" for role, seconds in self.cpu.items()
        )
        per_delta = 1e3 * self.cpu["workers"] / (self.turns * (SLOW_WAITS + 1))
        return (
            f"{label:<34} {self.turns:5d} turns in {self.wall:6.2f} s (sent in {self.sent:4.2f} s)"
            f"   CPU/turn ms: {per_turn}   (all {1e3 * sum(self.cpu.values()) / self.turns:5.2f})"
            f"   workers' CPU/delta {per_delta:5.3f} ms"
            f"   worker peak RSS {self.rss / 2**20:6.1f} MB (largest process "
            f"{self.rss_most / 2**20:5.1f} MB)"
        )


def slow_fleet_run(
    database_url: str,
    script: Path,
    root: Path,
    log_dir: Path,
    *,
    turns: int,
    worker: list[str],
    processes: int = 1,
) -> SlowRun:
    """``turns`` sessions submit a slow turn each, all at once (from eight threads), to a
    fleet of ``parley worker``s of ``processes`` processes, one per ``worker`` line
    (CONCURRENCY or POOL:CONCURRENCY, a process's), and `parley beat`."""
    flush_redis(REDIS_URL)
    fleet = Fleet(
        database_url=database_url, redis_url=REDIS_URL, host=f"scripted:{script}", log_dir=log_dir
    )
    for spec in worker:
        pool, _, concurrency = spec.rpartition(":")
        fleet.start_worker(
            concurrency=int(concurrency), pool=pool or "threads", processes=processes
        )
    fleet.start_beat()
    fleet.wait_ready()
    client = parley.connect(database_url, redis_url=REDIS_URL, queue=fleet.queue)
    try:
        with ThreadPoolExecutor(8) as submitters:
            sessions = list(submitters.map(lambda _: client.open_session(root), range(turns)))
            database = database_url.rsplit("/", 1)[1]
            before = cpu_by_role(fleet, database=database)
            start = time.perf_counter()
            handles = list(submitters.map(lambda s: s.submit("slow turn"), sessions))
            sent = time.perf_counter() - start
            for handle in handles:
                result = handle.wait(600)
                assert result.outcome is parley.TurnStatus.FINISHED and result.reply == SLOW_TEXT
            wall = time.perf_counter() - start
        after = cpu_by_role(fleet, database=database)
        workers = [pgid for pgid, role in roles(fleet).items() if role == "workers"]
        rss = peak_rss_each(workers)
    finally:
        client.close()
        fleet.stop()
    cpu = {k: v - before[k] for k, v in after.items()}
    return SlowRun(turns, wall, sent, cpu, sum(rss), max(rss))


def slow_floor_run(database_url: str, *, turns: int, workers: int = 1) -> SlowRun:
    """The floor: ``workers`` bare Celery workers on the threads pool with ``turns``
    slots among them, sent ``turns`` tasks that each wait as the slow model streams, and
    do nothing else."""
    flush_redis(REDIS_URL)
    slots = -(-turns // workers)
    with NoopFloor(
        database_url, REDIS_URL, "stock", workers=workers, pool="threads", concurrency=slots
    ) as floor:
        groups = {w.pid: "workers" for w in floor.workers}
        database = database_url.rsplit("/", 1)[1]  # (which the floor never uses)
        before = cpu_by_role(None, groups, database=database)
        start = time.perf_counter()
        for _ in range(turns):
            floor.app.send_task(
                "bench.wait", args=[floor.key, SLOW_WAITS, SLOW_WAIT_MS], queue=floor.queue
            )
        sent = time.perf_counter() - start
        for _ in range(turns):
            assert floor.redis.blpop([floor.key], timeout=600), "a floor task never ended"
        wall = time.perf_counter() - start
        cpu = {k: v - before[k] for k, v in cpu_by_role(None, groups, database=database).items()}
        rss = peak_rss_each(groups)
    return SlowRun(turns, wall, sent, cpu, sum(rss), max(rss))


def slow_model(database_url: str, tmp: Path, turns: int) -> None:
    """The slow-model load on every core: its floor, `parley worker`'s default (a
    process per core) with a slot for each turn, the same as one process, and the
    Procfile's worker line as it is."""
    root = tmp / "workspace"
    root.mkdir(exist_ok=True)
    script = tmp / "script.json"
    script.write_text(json.dumps({"rules": RULES}))
    pool, concurrency = procfile_worker()
    cores = len(os.sched_getaffinity(0))  # (`parley worker`'s default process count)
    slots = -(-turns // cores)
    load = os.getloadavg()
    print(f"slow model: {turns} turns streaming {SLOW_WAITS + 1} deltas over 2 s each")
    print(f"  load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {cores} cores")
    floor = slow_floor_run(database_url, turns=turns, workers=cores)
    print(floor.line(f"floor: {cores} bare Celery threads:{slots}"))
    fleet = slow_fleet_run(
        database_url, script, root, tmp, turns=turns, worker=[f"threads:{slots}"], processes=cores
    )
    print(fleet.line(f"parley, {cores} processes threads:{slots}"))

    def ratios(run: SlowRun) -> str:
        above = 1e3 * (run.cpu["workers"] - floor.cpu["workers"]) / (turns * (SLOW_WAITS + 1))
        return (
            f"  ratio to the floor: wall {run.wall / floor.wall:4.2f}×, CPU per turn "
            f"{sum(run.cpu.values()) / sum(floor.cpu.values()):4.1f}× (the floor's includes "
            f"Celery and its broker only), workers' CPU "
            f"{run.cpu['workers'] / floor.cpu['workers']:4.2f}×, workers' CPU per delta above "
            f"the floor's {above:5.3f} ms"
        )

    print(ratios(fleet))
    single = slow_fleet_run(
        database_url, script, root, tmp, turns=turns, worker=[f"threads:{turns}"], processes=1
    )
    print(single.line(f"parley, 1 process threads:{turns}"))
    print(ratios(single))
    shipped = slow_fleet_run(
        database_url,
        script,
        root,
        tmp,
        turns=turns,
        worker=[f"{pool}:{concurrency}"],
        processes=cores,
    )
    print(shipped.line(f"the Procfile's line, {cores}× {pool}:{concurrency}"))
    load = os.getloadavg()
    print(f"  load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.fleet")
    parser.add_argument("--slow-model", action="store_true", help="only the slow-model load")
    parser.add_argument("--turns", type=int, default=1000, help="of the slow-model load")
    args = parser.parse_args()
    if args.slow_model:
        with (
            fresh_postgres_database("bench") as database_url,
            tempfile.TemporaryDirectory() as tmp,
        ):
            slow_model(database_url, Path(tmp), args.turns)
        return 0
    pipeline = pipeline_floor.measure() if pipeline_floor.available() else None
    flush_redis(REDIS_URL)
    with fresh_postgres_database("bench") as database_url, tempfile.TemporaryDirectory() as tmp:
        with NoopFloor(database_url, REDIS_URL, "parley") as channel:
            channel_trips = [channel.round_trip() for _ in range(300)]
            channel_rate = channel.rate(1000)
        with NoopFloor(database_url, REDIS_URL, "stock") as floor:  # also sent between turns, below
            round_trips = [floor.round_trip() for _ in range(300)]
            noop_rate = floor.rate(1000)
            fleet, root = start_scripted_fleet(database_url, REDIS_URL, Path(tmp), RULES)
            client = parley.connect(database_url, redis_url=REDIS_URL, queue=fleet.queue)
            try:
                latencies(client, root, 20)  # warm up both workers
                first, end, paused_trips = latencies(client, root, 200, between=floor.round_trip)
                floor.close()  # not needed past here
                client_before = client.store.transactions
                counters_before = worker_counters(fleet)
                database = database_url.rsplit("/", 1)[1]
                cpu_before = cpu_by_role(fleet, database=database)
                rate = throughput(client, root)
                cpu = {
                    k: v - cpu_before[k] for k, v in cpu_by_role(fleet, database=database).items()
                }
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
    if pipeline is not None:
        print(pipeline.line())
        print(
            f"  parley against it: first token "
            f"{1e3 * statistics.median(first) / pipeline.first_token_ms:4.2f}× (target ≤ 1.5), "
            f"throughput {rate / pipeline.turns_per_second:4.2f}× (target ≥ 0.9)"
        )
    print(f"bare Celery noop round trip   p50 {ms(noop)}   p95 {ms(pct(round_trips, 0.95))}")
    print(f"bare Celery noop throughput   {noop_rate:7.1f} tasks/s (2 workers)")
    print(
        f"  same noop, parley's channel p50 {ms(statistics.median(channel_trips))}   "
        f"{channel_rate:7.1f} tasks/s (not the floor: what parley.fleet.transport saves)"
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
    with fresh_postgres_database("bench") as database_url, tempfile.TemporaryDirectory() as tmp:
        slow_model(database_url, Path(tmp), args.turns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
