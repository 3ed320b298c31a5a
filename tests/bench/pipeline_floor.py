"""The fleet's performance floor (``../shared/floor``): a bare turn pipeline run from its
own directory, as its README says, so that parley's figures sit beside it in one run.

The floor is the least a fleet turn can cost in this architecture: a durable insert and
a kick, the lock, the fence, the deltas through a Lua publish, a fenced step commit and
the final commit; no history, hooks or tools.  It uses its own database (``proto``, made
here from its ``schema.sql`` when missing) and Redis databases 3 (its broker) and 4.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis

from tests.support.fleet import REPO

FLOOR_DIR = Path(os.environ.get("PARLEY_FLOOR_DIR", REPO.parent / "shared" / "floor"))
ADMIN_DSN = "host=127.0.0.1 user=postgres dbname=postgres"


@dataclass(frozen=True)
class PipelineFloor:
    """The floor's figures from one run."""

    first_token_ms: float
    done_ms: float
    turns_per_second: float

    def line(self) -> str:
        return (
            f"the pipeline floor (../shared/floor): first token p50 {self.first_token_ms:.2f} ms, "
            f"end p50 {self.done_ms:.2f} ms, {self.turns_per_second:.0f} turns/s"
        )


def available() -> bool:
    return (FLOOR_DIR / "papp.py").is_file()


def _ensure_database() -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        if conn.execute("select 1 from pg_database where datname = 'proto'").fetchone():
            return
        conn.execute("create database proto")
    with psycopg.connect("host=127.0.0.1 user=postgres dbname=proto", autocommit=True) as conn:
        conn.execute((FLOOR_DIR / "schema.sql").read_text())


def _run(script: str) -> str:
    done = subprocess.run(
        [sys.executable, script], cwd=FLOOR_DIR, capture_output=True, text=True, timeout=300
    )
    if done.returncode:
        raise RuntimeError(f"the floor's {script} failed: {done.stderr[-2000:]}")
    return done.stdout


def measure() -> PipelineFloor:
    """Start the floor's worker (``celery -A papp worker -c 2``), run its latency and
    throughput scripts, stop it, and return what they printed."""
    _ensure_database()
    for db in (3, 4):  # a kick left by an earlier run would start on its worker
        redis.Redis(db=db).flushdb()
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "papp", "worker", "-c", "2", "-l", "WARNING"],
        cwd=FLOOR_DIR,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        time.sleep(4)  # (its first kick would otherwise time its start-up)
        latency = _run("plat.py")
        rate = _run("pbench.py")
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
    first = re.search(r"first token p50 ([\d.]+) ms", latency)
    done = re.search(r"done p50 ([\d.]+) ms", latency)
    turns = re.search(r"-> (\d+) turns/s", rate)
    if not (first and done and turns):
        raise RuntimeError(f"the floor printed no figures: {latency!r} {rate!r}")
    return PipelineFloor(float(first[1]), float(done[1]), float(turns[1]))
