"""Embedded benchmark: wall time of one-step and 40-step turns on SQLite, beside a bare
SQLite insert+commit measured in the same run.  Run by hand:

    .venv/bin/python -m tests.bench.embedded

Prints medians and p95s, and each figure as a multiple of the floor.
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import parley
from parley.tools import FunctionTool

NOOP = FunctionTool(
    name="noop",
    description="Does nothing.",
    parameters={"type": "object", "properties": {}},
    function=lambda _args, _ctx: "ok",
)
RULES = {
    "rules": [
        {"when": "^one$", "steps": [{"text": "done"}]},
        {
            "when": "^forty$",
            "steps": [{"tool_calls": [{"name": "noop"}]}] * 39 + [{"text": "done"}],
        },
    ]
}


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def bare_sqlite_commit(directory: Path, count: int) -> list[float]:
    """INSERT + COMMIT with the same journal settings parley uses."""
    db = sqlite3.connect(directory / "floor.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT)")
    samples = []
    for n in range(count):
        start = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t (payload) VALUES (?)", (f"row {n}",))
        db.execute("COMMIT")
        samples.append(time.perf_counter() - start)
    db.close()
    return samples


def turns(directory: Path, prompt: str, count: int, *, fresh: bool) -> list[float]:
    """Wall time of ``session.turn`` (submit, run on the driver thread, wait).  With
    ``fresh`` every turn is the first of a new session; otherwise all turns stack up in
    one session, whose growing history every turn replays."""
    host = parley.Host(model=parley.models.ScriptedModel(RULES), tools=[NOOP])
    name = f"{prompt}-{'fresh' if fresh else 'deep'}.db"
    with parley.connect(f"sqlite:///{directory / name}", host=host) as client:
        session = client.open_session(directory)
        session.turn(prompt)  # warm up: imports, statement compilation
        samples = []
        for _ in range(count):
            if fresh:
                session = client.open_session(directory)
            start = time.perf_counter()
            result = session.turn(prompt)
            samples.append(time.perf_counter() - start)
            assert result.outcome is parley.TurnStatus.FINISHED
        return samples


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="parley-bench-") as tmp:
        directory = Path(tmp)
        floor = bare_sqlite_commit(directory, 2000)
        one = turns(directory, "one", 300, fresh=True)
        forty = turns(directory, "forty", 30, fresh=True)
        deep = turns(directory, "one", 300, fresh=False)
    base = statistics.median(floor)
    rows = [
        ("bare SQLite insert+commit", floor),
        ("one-step turn", one),
        ("40-step turn", forty),
        ("one-step turn, turns 1-300", deep),
        ("  of which the last 30", deep[-30:]),
    ]
    print(f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}")
    print(f"{'':28} {'median':>10} {'p95':>10} {'× floor':>9}")
    for name, samples in rows:
        median = statistics.median(samples)
        print(
            f"{name:28} {median * 1e3:>8.3f}ms {percentile(samples, 0.95) * 1e3:>8.3f}ms "
            f"{median / base:>8.1f}×"
        )
    per_step = (statistics.median(forty) - statistics.median(one)) / 39
    print(f"marginal cost of one step: {per_step * 1e3:.3f}ms ({per_step / base:.1f}× floor)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
