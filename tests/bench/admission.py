"""Admission benchmark (docs/admission.md): a backlog against a provider account's limit,
with admission on and off, figures against the floor the limit sets, in one run.

    .venv/bin/python -m tests.bench.admission [--turns 1000] [--rpm 1200]
        [--stream-seconds 0.5] [--probes 20] [--tenant-turns 800] [--flood-turns 400]
        [--parts on,tenants,flood,off] [--cold] [--refuse-first] [--json] [--keep-logs]

Needs the machine's PostgreSQL and Redis (Redis database 11 is flushed:
``PARLEY_BENCH_REDIS_URL`` names another).  The provider is the rate-limited
OpenAI-compatible server (tests/providers/rate_limited_server.py) in its own process,
allowing ``--rpm`` calls a minute, each streaming for ``--stream-seconds``; the fleet is
the Procfile's: two `parley worker` processes on its worker line and `parley beat`, with
the provider host (``tests.support.hosts:provider_host``), nothing about the limits
configured (the fleet learns them from the server's headers).  A fleet per part, each on
a fresh database and the flushed Redis database, one after the other (``--parts``):

1. ``on``: admission on: an interactive probe on the idle fleet (``--probes`` times),
   then ``--turns`` one-step batch turns submitted at once, with the same probe, from
   other sessions, spread through the batch;
2. ``tenants``: admission on, ``PARLEY_TENANT_WEIGHTS=big=3,small=1``: the two tenants
   submit their backlogs at once (3/5 and 2/5 of ``--tenant-turns``), and the store says
   how many calls each got while both still waited;
3. ``flood``: admission on: tenant ``flood`` submits ``--flood-turns`` interactive turns
   while tenant ``other`` submits half as many batch turns and probes through them
   (issue 43): the other's first tokens, and the two tenants' calls while both wait;
4. ``off``: admission off (``PARLEY_ADMISSION=off``: every call at once) on the load of 1.

The floor is the limit itself: ``turns`` calls at ``rpm / 60`` a second.  A warm-up of a
few interactive turns precedes each part's figures, so the fleet has learned the limit,
unless ``--cold`` (then the figures include a fresh fleet's first calls, its probe among
them).  ``--refuse-first`` has the provider refuse the backlog's first call in parts 1
and 4, as one out of phase with the fleet would (issue 42: a lone 429 at the start).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.bench.admission_fleet import (
    PROBE_SPAN,
    REDIS_URL,
    Options,
    Prober,
    failures,
    idle_probes,
    running_fleet,
    submit_all,
)
from tests.bench.admission_tenants import FloodRun, TenantRun, flood_run, tenant_run
from tests.bench.common import pct
from tests.providers.rate_limited_server import ServerProcess, server_process

PARTS = ("on", "tenants", "flood", "off")


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


# ---------------------------------------------------------------- the batch


def batch_run(server: ServerProcess, options: Options, admission: str) -> BatchRun:
    """Part ``on`` or ``off``: idle probes, then the batch with probes in it (a cold
    fleet's idle probes come after the batch: before it, they would warm it)."""
    with running_fleet(server, options, {"PARLEY_ADMISSION": admission}) as (_, client, root):
        idle = [] if options.cold else idle_probes(client, root, options.probes)
        with ThreadPoolExecutor(8) as openers:
            sessions = list(openers.map(lambda _: client.open_session(root), range(options.turns)))
        prober = Prober(client, root, options.probes, PROBE_SPAN * options.floor)
        server.reset_stats()
        if options.refuse_first:
            server.refuse(1)
        start = time.perf_counter()
        prober.start(start)
        handles = submit_all(sessions, "line")
        failed = failures(handles)
        wall = time.perf_counter() - start
        busy, without = prober.results()
        stats = server.stats()
        if options.cold:
            idle = idle_probes(client, root, options.probes)
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


# ---------------------------------------------------------------- the table


def table(
    options: Options,
    on: BatchRun | None,
    off: BatchRun | None,
    tenants: TenantRun | None,
    flood: FloodRun | None,
) -> str:
    """The figures of the parts that ran, on beside off, with their targets."""
    lines = [
        f"admission benchmark: {options.turns} batch turns, provider {options.rpm} RPM "
        f"({options.rate:g}/s), calls of {options.stream_seconds:g} s; floor "
        f"{options.floor:.1f} s; {'cold' if options.cold else 'warm'}"
        f"{', first call refused' if options.refuse_first else ''}; {os.cpu_count()} cores, "
        "load " + " ".join(f"{x:.2f}" for x in os.getloadavg()),
    ]
    if on is not None or off is not None:
        lines += _batch_rows(options, on, off)
    if tenants is not None:
        lines.append(
            f"tenants big=3, small=1, both waiting: {tenants.big} : {tenants.small} calls in "
            f"{tenants.window:.1f} s = {tenants.ratio:.2f} : 1 (target 3 ± 10 %: 2.7 to 3.3); "
            f"failed {tenants.failed}"
        )
    if flood is not None:
        lines.append(
            f"interactive flood ({options.flood_turns} turns) beside another tenant's batch, "
            f"both waiting: {flood.flood} : {flood.other} calls in {flood.window:.1f} s = "
            f"{flood.ratio:.2f} : 1 (target 1 ± 10 %); the other's first token p50/p95 "
            f"{_p(flood.first_token, 0.5)} / {_p(flood.first_token, 0.95)} s; "
            f"without a token {flood.probes_without_token}; failed {flood.failed}"
        )
    return "\n".join(lines)


def _batch_rows(options: Options, on: BatchRun | None, off: BatchRun | None) -> list[str]:
    lines = [f"{'figure':<44} {'on':>12} {'off':>12}   target"]

    def row(name: str, a: str, b: str, target: str = "") -> None:
        lines.append(f"{name:<44} {a:>12} {b:>12}   {target}")

    def of(run: BatchRun | None, figure: str) -> str:
        return "-" if run is None else figure.format(run=run)

    row(
        "wall time (s)",
        of(on, "{run.wall:.1f}"),
        of(off, "{run.wall:.1f}"),
        f"floor {options.floor:.1f}",
    )
    row(
        "limit used (floor / wall)",
        of(on, "{run.limit_used:.3f}"),
        of(off, "{run.limit_used:.3f}"),
        "≥ 0.9",
    )
    row("calls served", of(on, "{run.admitted}"), of(off, "{run.admitted}"), "turns + probes")
    row("429s", of(on, "{run.rate_limited}"), of(off, "{run.rate_limited}"))
    row(
        "429s per call served",
        of(on, "{run.refusals_per_call:.3f}"),
        of(off, "{run.refusals_per_call:.3f}"),
        "≤ 0.02",
    )
    row("failed turns", of(on, "{run.failed}"), of(off, "{run.failed}"), "0")
    for label, figures in (("idle", "idle_first_token"), ("in the batch", "busy_first_token")):
        a = getattr(on, figures) if on is not None else []
        b = getattr(off, figures) if off is not None else []
        row(f"first token {label}, p50 (s)", _p(a, 0.5), _p(b, 0.5))
        row(
            f"first token {label}, p95 (s)",
            _p(a, 0.95),
            _p(b, 0.95),
            "within 0.5 of idle" if label != "idle" else "",
        )
    row(
        "probes without a token",
        of(on, "{run.probes_without_token}"),
        of(off, "{run.probes_without_token}"),
    )
    return lines


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
    parser.add_argument("--flood-turns", type=_positive, default=400)
    parser.add_argument("--parts", default=",".join(PARTS), help="of " + ",".join(PARTS))
    parser.add_argument("--cold", action="store_true", help="no warm-up before a part")
    parser.add_argument("--refuse-first", action="store_true", help="the first call gets a 429")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--keep-logs", action="store_true", help="keep the fleets' logs")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or set(parts) - set(PARTS):
        parser.error(f"--parts must name some of {', '.join(PARTS)}, not {args.parts!r}")
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
        flood_turns=args.flood_turns,
        redis_url=REDIS_URL,
        log_dir=log_dir,
        cold=args.cold,
        refuse_first=args.refuse_first,
    )
    arguments = ("--rpm", str(options.rpm), "--stream-seconds", str(options.stream_seconds))
    figures: dict[str, Any] = {}
    try:
        with server_process(*arguments) as server:
            for part in PARTS:
                if part in parts:
                    figures[part] = _run(part, server, options)
    finally:
        if args.keep_logs:
            print(f"logs in {log_dir}")
        else:
            _remove(log_dir)
    print(
        table(
            options,
            figures.get("on"),
            figures.get("off"),
            figures.get("tenants"),
            figures.get("flood"),
        )
    )
    if args.json:
        print(json.dumps({part: run.figures() for part, run in figures.items()}, indent=2))
    return 0


def _run(part: str, server: ServerProcess, options: Options) -> Any:
    if part == "tenants":
        return tenant_run(server, options)
    if part == "flood":
        return flood_run(server, options)
    return batch_run(server, options, part)


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
