"""What the benchmarks share: percentiles and milliseconds as they print them, and the
fleet they measure (one-process workers, two by default, and the sweeper, on a scripted
model)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.fleet import Fleet


def pct(samples: list[float], fraction: float) -> float:
    """The ``fraction`` percentile of ``samples`` (0.95: p95)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def ms(value: float) -> str:
    """Seconds as milliseconds, aligned for a table."""
    return f"{value * 1e3:7.2f} ms"


def start_scripted_fleet(
    database_url: str,
    redis_url: str,
    directory: Path,
    rules: Sequence[Any],
    *,
    broker_url: str | None = None,
    workers: int = 2,
    pool: str = "prefork",
    concurrency: int = 1,
) -> tuple[Fleet, Path]:
    """``workers`` workers (single-process ones by default; ``pool`` and ``concurrency``
    otherwise) and the sweeper whose model follows ``rules``, their kicks on
    ``broker_url`` (default: the Redis), their logs and script in ``directory``: the
    fleet, ready, and a workspace root for its sessions (``directory/workspace``)."""
    root = directory / "workspace"
    root.mkdir(exist_ok=True)
    script = directory / "script.json"
    script.write_text(json.dumps({"rules": rules}))
    fleet = Fleet(
        database_url=database_url,
        redis_url=redis_url,
        broker_url=broker_url,
        host=f"scripted:{script}",
        log_dir=directory,
    )
    for _ in range(workers):
        fleet.start_worker(concurrency=concurrency, pool=pool)
    fleet.start_beat()  # its own process: cpu_by_role counts it as the sweeper
    fleet.wait_ready()
    return fleet, root
