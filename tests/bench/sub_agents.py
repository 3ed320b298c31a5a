"""Sub-agents benchmark (docs/sub-agents.md): a tree's overhead per child turn beside a
plain turn's, and the parent's wait after its last child ended, in one run.

    .venv/bin/python -m tests.bench.sub_agents [--parents 100] [--children 10]

Needs the machine's PostgreSQL and Redis (Redis database 11 is flushed).  Starts the
Procfile's worker line (its pool and concurrency) twice and the sweeper, whose host
(:func:`bench_host`) declares one agent.  First the floor: ``parents × children`` plain
one-step turns, each in a session of its own, submitted at once; then ``parents``
parents, each fanning out to ``children`` one-step child turns in one step, submitted at
once.  Figures: wall time per turn of each (the tree's per child turn; its parents are
extra turns it pays for), their ratio, and per parent the time from its last child's end
to its own end (the wake, the claim and its final step), p50 and p95.  Timings are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import parley
from parley.models import ScriptedModel
from parley.schemas.records import TurnStatus
from tests.bench.common import ms, pct
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import Fleet, flush_redis, procfile_worker

REDIS_URL = os.environ.get("PARLEY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
SCRIPT_VARIABLE = "PARLEY_BENCH_SCRIPT"
TURN_TIMEOUT = 900.0


def rules(children: int) -> list[dict[str, object]]:
    """A parent (``fan out``) calls the helper ``children`` times in one step, then
    answers; a child (``part …``) and a plain turn (``one``) answer at once."""
    calls = [{"name": "helper", "arguments": {"task": f"part {n}"}} for n in range(children)]
    return [
        {"when": "^fan out", "steps": [{"tool_calls": calls}, {"text": "all parts done"}]},
        {"when": ".*", "steps": [{"text": "done: {prompt}"}]},
    ]


def bench_host() -> parley.Host:
    """The benchmark's host: the script ``PARLEY_BENCH_SCRIPT`` names, one agent, and
    every call of a step at once."""
    return parley.Host(
        model=ScriptedModel(os.environ[SCRIPT_VARIABLE]),
        agents=[parley.Agent("helper", "Does one part of the work.")],
        max_parallel_agents=1000,
    )


def run_all(client: parley.Client, root: Path, prompts: list[str]) -> tuple[float, list[str]]:
    """Submit every prompt at once, each on a session of its own; wall seconds until all
    ended, and their turn ids."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=32) as pool:
        handles = list(pool.map(lambda p: client.open_session(root).submit(p), prompts))
        results = list(pool.map(lambda h: h.wait(TURN_TIMEOUT), handles))
    elapsed = time.perf_counter() - started
    failed = [r for r in results if r.outcome is not TurnStatus.FINISHED]
    assert not failed, f"{len(failed)} turns did not finish: {failed[0]}"
    return elapsed, [r.turn_id for r in results]


def parents_wait(client: parley.Client, parents: list[str]) -> list[float]:
    """Per parent: seconds from its last child's end to its own end."""
    waits = []
    for turn_id in parents:
        result = client.attach(turn_id).result()
        assert result is not None
        ends = [client.store.run_state(child.turn_id).ended_at for child in result.children]
        ended = client.store.run_state(turn_id).ended_at
        assert ended is not None and ends and all(e is not None for e in ends)
        waits.append((ended - max(e for e in ends if e is not None)).total_seconds())
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parents", type=int, default=100)
    parser.add_argument("--children", type=int, default=10)
    args = parser.parse_args()
    plain_count = args.parents * args.children
    pool, concurrency = procfile_worker()
    with tempfile.TemporaryDirectory() as tmp, fresh_postgres_database("bench_agents") as url:
        directory = Path(tmp)
        script = directory / "script.json"
        script.write_text(json.dumps({"rules": rules(args.children)}))
        root = directory / "workspace"
        root.mkdir()
        flush_redis(REDIS_URL)
        fleet = Fleet(
            database_url=url,
            redis_url=REDIS_URL,
            host="tests.bench.sub_agents:bench_host",
            log_dir=directory,
            environment={SCRIPT_VARIABLE: str(script)},
        )
        try:
            for _ in range(2):
                fleet.start_worker(concurrency=concurrency, pool=pool)
            fleet.start_beat()
            fleet.wait_ready()
            with fleet.client() as client:
                run_all(client, root, ["one warm-up"] * 20)
                plain, _ids = run_all(client, root, ["one"] * plain_count)
                tree, parents = run_all(client, root, ["fan out"] * args.parents)
                waits = parents_wait(client, parents)
        finally:
            fleet.stop()
    per_plain = plain / plain_count
    per_child = tree / plain_count
    print(f"workers: 2 × {pool} --concurrency {concurrency}")
    print(f"plain turns: {plain_count} in {plain:.2f} s, {ms(per_plain)} per turn")
    print(
        f"tree: {args.parents} parents × {args.children} children in {tree:.2f} s, "
        f"{ms(per_child)} per child turn"
    )
    print(f"overhead ratio (per child turn / per plain turn): {per_child / per_plain:.2f}")
    print(f"parent's wait after its last child ended: p50 {ms(pct(waits, 0.5))}")
    print(f"                                          p95 {ms(pct(waits, 0.95))}")


if __name__ == "__main__":
    main()
