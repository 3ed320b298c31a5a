"""Admission benchmark (docs/admission.md): a backlog against a provider account's limit,
with admission on and off, figures against the floor the limit sets, in one run.

    .venv/bin/python -m tests.bench.admission [--turns 1000] [--rpm 1200]
        [--stream-seconds 0.5] [--probes 20] [--tenant-turns 800] [--json] [--keep-logs]

Needs the machine's PostgreSQL and Redis (Redis database 11 is flushed:
``PARLEY_BENCH_REDIS_URL`` names another).  The provider is the rate-limited
OpenAI-compatible server (tests/providers/rate_limited_server.py) in its own process,
allowing ``--rpm`` calls a minute, each streaming for ``--stream-seconds``; the fleet is
the Procfile's: two `parley worker` processes on its worker line and `parley beat`, with
the provider host (``tests.support.hosts:provider_host``), nothing about the limits
configured (the fleet learns them from the server's headers).  Three fleets, each on a
fresh database and the flushed Redis database, one after the other:

1. admission on: an interactive probe on the idle fleet (``--probes`` times), then
   ``--turns`` one-step batch turns submitted at once, with the same probe, from other
   sessions, spread through the batch;
2. admission on, ``PARLEY_TENANT_WEIGHTS=big=3,small=1``: the two tenants submit their
   backlogs at once (3/5 and 2/5 of ``--tenant-turns``), and the store says how many
   calls each got while both still waited;
3. admission off (``PARLEY_ADMISSION=off``: every call at once) on the same load as 1.

The floor is the limit itself: ``turns`` calls at ``rpm / 60`` a second.  A warm-up of a
few interactive turns precedes each part's figures, so the fleet has learned the limit
(the cold start, one probing call per worker, is the acceptance tests' to check).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

import parley
from schemas.events import EventKind
from tests.bench.common import pct
from tests.providers.rate_limited_server import ServerProcess, server_process
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import Fleet, flush_redis, procfile_worker

REDIS_URL = os.environ.get("PARLEY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
HOST = "tests.support.hosts:provider_host"
WEIGHTS = {"big": 3, "small": 1}
WARM_UP_TURNS = 10
"""Interactive turns run before a part's figures: enough for both workers' first calls."""
PROBE_LEAD_SECONDS = 2.0
"""How long after the batch's submission the first probe goes: the backlog waits by then."""
PROBE_SPAN = 0.8
"""The probes are spread over this fraction of the floor: all of them fall in the batch."""
WINDOW_MARGIN_SECONDS = 1.0
"""Cut from each end of the window in which both tenants had turns waiting: its first
second is the backlogs' first calls, its last the calls in flight as one ran out."""
TURN_TIMEOUT = 900.0


@dataclass(frozen=True, kw_only=True)
class Options:
    turns: int
    rpm: int
    stream_seconds: float
    probes: int
    tenant_turns: int
    redis_url: str
    log_dir: Path

    @property
    def rate(self) -> float:
        """The provider's limit, calls a second."""
        return self.rpm / 60

    @property
    def floor(self) -> float:
        """Seconds the limit allows ``turns`` one-call turns in at best."""
        return self.turns / self.rate


@dataclass(frozen=True, kw_only=True)
class BatchRun:
    """One side's batch: how long it took, what the provider saw, and the probes."""

    admission: str
    turns: int
    wall: float
    floor: float
    admitted: int
    """Calls the provider served (the turns' and the probes')."""
    rate_limited: int
    failed: int
    idle_first_token: list[float]
    busy_first_token: list[float]
    probes_without_token: int

    @property
    def limit_used(self) -> float:
        return self.floor / self.wall

    @property
    def refusals_per_call(self) -> float:
        return self.rate_limited / max(1, self.admitted)

    def figures(self) -> dict[str, Any]:
        idle, busy = self.idle_first_token, self.busy_first_token
        return {
            **asdict(self),
            "limit_used": self.limit_used,
            "refusals_per_call": self.refusals_per_call,
            "idle_p50": statistics.median(idle),
            "idle_p95": pct(idle, 0.95),
            "busy_p50": statistics.median(busy) if busy else None,
            "busy_p95": pct(busy, 0.95) if busy else None,
        }


@dataclass(frozen=True, kw_only=True)
class TenantRun:
    """The calls each tenant got while both had batch turns waiting."""

    big: int
    small: int
    window: float
    failed: int

    @property
    def ratio(self) -> float:
        return self.big / max(1, self.small)

    def figures(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "target": WEIGHTS["big"] / WEIGHTS["small"]}


# ---------------------------------------------------------------- a fleet


@contextmanager
def running_fleet(
    server: ServerProcess, options: Options, environment: dict[str, str]
) -> Iterator[tuple[Fleet, parley.Client, Path]]:
    """The Procfile's fleet on a fresh database and the flushed Redis database, against
    ``server``, with ``environment`` added; warmed up.  Yields it, a client of it, and
    the sessions' workspace."""
    pool, concurrency = procfile_worker()
    root = options.log_dir / "workspace"
    root.mkdir(exist_ok=True)
    with fresh_postgres_database("admbench") as database_url:
        flush_redis(options.redis_url)
        fleet = Fleet(
            database_url=database_url,
            redis_url=options.redis_url,
            host=HOST,
            log_dir=options.log_dir,
            environment={"PARLEY_TEST_PROVIDER_URL": server.base_url, **environment},
        )
        try:
            fleet.start_worker(concurrency, pool)
            fleet.start_worker(concurrency, pool)
            fleet.start_beat()
            fleet.wait_ready()
            client = fleet.client()
            try:
                warm_up(client, root)
                yield fleet, client, root
            finally:
                client.close()
        finally:
            fleet.stop()


def warm_up(client: parley.Client, root: Path) -> None:
    """A few interactive turns at once: each worker makes its first calls, the fleet
    learns the limit from the server's headers."""
    handles = [client.open_session(root).submit("warm up") for _ in range(WARM_UP_TURNS)]
    for handle in handles:
        handle.wait(TURN_TIMEOUT)


# ---------------------------------------------------------------- probes


def first_token(handle: parley.TurnHandle, since: float) -> float | None:
    """Seconds from ``since`` to the turn's first token (None: it ended without one);
    returns once the turn ended."""
    got = None
    for event in handle.events():
        if got is None and event.kind is EventKind.TOKEN:
            got = time.perf_counter() - since
        if event.kind is EventKind.END:
            break
    return got


def idle_probes(client: parley.Client, root: Path, count: int) -> list[float]:
    """The probe on an idle fleet, ``count`` times one after the other: an interactive
    one-step turn in a session of its own, submit → first token."""
    samples = []
    for _ in range(count):
        session = client.open_session(root)
        start = time.perf_counter()
        took = first_token(session.submit("I am waiting for this"), start)
        if took is None:
            raise RuntimeError("an idle probe ended without a token; see the fleet's logs")
        samples.append(took)
    return samples


class Prober:
    """Probes submitted at times spread through a batch, each followed by a thread of
    its own."""

    def __init__(self, client: parley.Client, root: Path, count: int, span: float) -> None:
        self._sessions = [client.open_session(root) for _ in range(count)]
        self._span = span
        self._results: list[float | None] = []
        self._followers: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, batch_started: float) -> None:
        self._batch_started = batch_started
        self._thread.start()

    def _run(self) -> None:
        spacing = self._span / max(1, len(self._sessions))
        for n, session in enumerate(self._sessions):
            due = self._batch_started + PROBE_LEAD_SECONDS + n * spacing
            time.sleep(max(0.0, due - time.perf_counter()))
            start = time.perf_counter()
            handle = session.submit(f"probe {n}: I am waiting for this")
            follower = threading.Thread(
                target=lambda h=handle, s=start: self._results.append(first_token(h, s)),
                daemon=True,
            )
            follower.start()
            self._followers.append(follower)

    def results(self) -> tuple[list[float], int]:
        """The probes' first tokens, and how many ended without one."""
        self._thread.join(TURN_TIMEOUT)
        for follower in self._followers:
            follower.join(TURN_TIMEOUT)
        got = [r for r in self._results if r is not None]
        return got, len(self._results) - len(got)


# ---------------------------------------------------------------- the batch


def submit_all(sessions: list[parley.Session], prompt: str) -> list[parley.TurnHandle]:
    """One batch turn in each session, from eight threads (as a producer of a big batch
    would)."""
    with ThreadPoolExecutor(8) as submitters:
        return list(
            submitters.map(
                lambda n: sessions[n].submit(f"{prompt} {n}", priority="batch"),
                range(len(sessions)),
            )
        )


def failures(handles: list[parley.TurnHandle]) -> int:
    """Wait for every turn; how many did not finish."""
    results = [h.wait(TURN_TIMEOUT) for h in handles]
    return sum(r.outcome is not parley.TurnStatus.FINISHED for r in results)


def batch_run(server: ServerProcess, options: Options, admission: str) -> BatchRun:
    """Part 1 (admission on) or 3 (off): idle probes, then the batch with probes in it."""
    with running_fleet(server, options, {"PARLEY_ADMISSION": admission}) as (_, client, root):
        idle = idle_probes(client, root, options.probes)
        with ThreadPoolExecutor(8) as openers:
            sessions = list(openers.map(lambda _: client.open_session(root), range(options.turns)))
        prober = Prober(client, root, options.probes, PROBE_SPAN * options.floor)
        server.reset_stats()
        start = time.perf_counter()
        prober.start(start)
        handles = submit_all(sessions, "line")
        failed = failures(handles)
        wall = time.perf_counter() - start
        busy, without = prober.results()
        stats = server.stats()
    return BatchRun(
        admission=admission,
        turns=options.turns,
        wall=wall,
        floor=options.floor,
        admitted=stats.admitted,
        rate_limited=stats.rate_limited,
        failed=failed,
        idle_first_token=idle,
        busy_first_token=busy,
        probes_without_token=without,
    )


# ---------------------------------------------------------------- tenants


def tenant_run(server: ServerProcess, options: Options) -> TenantRun:
    """Part 2: both tenants' backlogs submitted at once; the calls each got while both
    still had turns waiting, counted from the steps' commit times in the store."""
    weights = ",".join(f"{tenant}={weight}" for tenant, weight in WEIGHTS.items())
    environment = {"PARLEY_TENANT_WEIGHTS": weights}
    with running_fleet(server, options, environment) as (fleet, client, root):
        big = options.tenant_turns * 3 // 5
        counts = {"big": big, "small": options.tenant_turns - big}
        with ThreadPoolExecutor(8) as openers:
            sessions = {
                tenant: list(
                    openers.map(
                        lambda _, t=tenant: client.open_session(root, tenant=t), range(count)
                    )
                )
                for tenant, count in counts.items()
            }
        with ThreadPoolExecutor(2) as tenants:
            submitted = list(tenants.map(lambda t: submit_all(sessions[t], t), counts))
        failed = sum(failures(handles) for handles in submitted)
        commits = step_commits(fleet.database_url)
    return shares(commits, failed)


def step_commits(database_url: str) -> dict[str, list[datetime]]:
    """Each tenant's step commit times (a batch turn here is one step: one call)."""
    sql = """
        SELECT s.tenant, st.created_at FROM steps st
        JOIN runs r ON r.id = st.run_id JOIN sessions s ON s.id = r.session_id
        WHERE s.tenant IS NOT NULL
    """
    commits: dict[str, list[datetime]] = {tenant: [] for tenant in WEIGHTS}
    with psycopg.connect(database_url.replace("+psycopg", "")) as db:
        for tenant, at in db.execute(sql):
            commits.setdefault(tenant, []).append(at)
    return commits


def shares(commits: dict[str, list[datetime]], failed: int) -> TenantRun:
    """The calls of each tenant committed while both had turns waiting: from the first
    commit to the first tenant's last (each with a margin cut off)."""
    begins = min(min(times) for times in commits.values())
    ends = min(max(times) for times in commits.values())
    low = begins.timestamp() + WINDOW_MARGIN_SECONDS
    high = ends.timestamp() - WINDOW_MARGIN_SECONDS
    inside = {
        tenant: sum(low <= at.timestamp() <= high for at in times)
        for tenant, times in commits.items()
    }
    return TenantRun(big=inside["big"], small=inside["small"], window=high - low, failed=failed)


# ---------------------------------------------------------------- the table


def table(options: Options, on: BatchRun, off: BatchRun, tenants: TenantRun) -> str:
    """The figures, on beside off, with their targets."""
    lines = [
        f"admission benchmark: {options.turns} batch turns, provider {options.rpm} RPM "
        f"({options.rate:g}/s), calls of {options.stream_seconds:g} s; floor "
        f"{options.floor:.1f} s; {os.cpu_count()} cores, load "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        f"{'figure':<44} {'on':>12} {'off':>12}   target",
    ]

    def row(name: str, a: str, b: str, target: str = "") -> None:
        lines.append(f"{name:<44} {a:>12} {b:>12}   {target}")

    row("wall time (s)", f"{on.wall:.1f}", f"{off.wall:.1f}", f"floor {options.floor:.1f}")
    row("limit used (floor / wall)", f"{on.limit_used:.3f}", f"{off.limit_used:.3f}", "≥ 0.9")
    row("calls served", str(on.admitted), str(off.admitted), "turns + probes")
    row("429s", str(on.rate_limited), str(off.rate_limited))
    row(
        "429s per call served",
        f"{on.refusals_per_call:.3f}",
        f"{off.refusals_per_call:.3f}",
        "≤ 0.02",
    )
    row("failed turns", str(on.failed), str(off.failed), "0")
    for label, run_figures in (("idle", "idle_first_token"), ("in the batch", "busy_first_token")):
        a, b = getattr(on, run_figures), getattr(off, run_figures)
        row(f"first token {label}, p50 (s)", _p(a, 0.5), _p(b, 0.5))
        row(
            f"first token {label}, p95 (s)",
            _p(a, 0.95),
            _p(b, 0.95),
            "within 0.5 of idle" if label != "idle" else "",
        )
    row("probes without a token", str(on.probes_without_token), str(off.probes_without_token))
    lines.append(
        f"tenants big=3, small=1, both waiting: {tenants.big} : {tenants.small} calls in "
        f"{tenants.window:.1f} s = {tenants.ratio:.2f} : 1 (target 3 ± 10 %: 2.7 to 3.3); "
        f"failed {tenants.failed}"
    )
    return "\n".join(lines)


def _p(samples: list[float], fraction: float) -> str:
    if not samples:
        return "-"
    return f"{statistics.median(samples) if fraction == 0.5 else pct(samples, fraction):.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.admission")
    parser.add_argument("--turns", type=_positive, default=1000)
    parser.add_argument("--rpm", type=_positive, default=1200)
    parser.add_argument("--stream-seconds", type=float, default=0.5)
    parser.add_argument("--probes", type=_positive, default=20)
    parser.add_argument("--tenant-turns", type=_positive, default=800)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--keep-logs", action="store_true", help="keep the fleets' logs")
    args = parser.parse_args()
    if not args.stream_seconds >= 0:
        parser.error(f"--stream-seconds must be >= 0, not {args.stream_seconds}")
    if args.tenant_turns < 5:
        parser.error("--tenant-turns must be at least 5 (3/5 for big, 2/5 for small)")
    log_dir = Path(tempfile.mkdtemp(prefix="parley-admbench-"))
    options = Options(
        turns=args.turns,
        rpm=args.rpm,
        stream_seconds=args.stream_seconds,
        probes=args.probes,
        tenant_turns=args.tenant_turns,
        redis_url=REDIS_URL,
        log_dir=log_dir,
    )
    arguments = ("--rpm", str(options.rpm), "--stream-seconds", str(options.stream_seconds))
    try:
        with server_process(*arguments) as server:
            on = batch_run(server, options, "on")
            tenants = tenant_run(server, options)
            off = batch_run(server, options, "off")
    finally:
        if args.keep_logs:
            print(f"logs in {log_dir}")
        else:
            _remove(log_dir)
    print(table(options, on, off, tenants))
    if args.json:
        figures = {"on": on.figures(), "off": off.figures(), "tenants": tenants.figures()}
        print(json.dumps(figures, indent=2))
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, not {text}")
    return value


def _remove(directory: Path) -> None:
    for path in sorted(directory.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    directory.rmdir()


if __name__ == "__main__":
    raise SystemExit(main())
