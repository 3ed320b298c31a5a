"""Delayed turns benchmark (docs/performance.md#delayed-turns): the timer costs what is
due, not what waits.

    .venv/bin/python -m tests.bench.delayed_turns [--due 1000] [--over 60] [--waiting 100000]

Needs the machine's PostgreSQL and Redis (``PARLEY_BENCH_REDIS_URL``, by default Redis
database 11, is flushed).  On a fresh database:

1. **A sweep against the backlog.**  With 1,000, 10,000 and ``--waiting`` delayed turns
   due tomorrow (written in bulk, as submissions would leave them), the two statements a
   sweep runs for them, the release of due runs and the look for sessions with work, run
   200 times each: their wall time and the buffers PostgreSQL touched for one, beside a
   ``SELECT 1`` round trip measured in the same run (the floor).  Flat is the target.
2. **On time.**  Two single-process workers and ``parley beat`` start; ``--due`` turns
   are submitted through the Python client (``at=``), due evenly over ``--over``
   seconds from shortly after the last submission, while the backlog waits for
   tomorrow.  How late each started (the run's ``started_at`` less its time): p50, p99,
   max.  The target is p99 within a second.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

import parley
from parley.schemas import tables as t
from parley.store import statements as q
from parley.store.sql_store import SqlStore
from tests.bench.common import pct, start_scripted_fleet
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import flush_redis

REDIS_URL = os.environ.get("PARLEY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
ECHO = [{"when": ".*", "steps": [{"text": "ok"}]}]
SESSIONS = 1000
ROUNDS = 200


def add_backlog(store: SqlStore, template_turn: str, sessions: list[str], count: int) -> None:
    """``count`` more delayed turns due tomorrow, copies of ``template_turn``'s rows
    spread over ``sessions`` (each turn its own ordinal and position), written in bulk:
    the rows a submission leaves, without a transaction per turn."""
    start = _max_ordinal(store) + 1
    turn_values = {
        "id": "ids.turn_id",
        "session_id": "ids.session_id",
        "ordinal": "ids.n",
        "request_id": "NULL",
    }
    run_values = {
        "id": "ids.run_id",
        "turn_id": "ids.turn_id",
        "session_id": "ids.session_id",
        "queue_position": "ids.n",
        "not_before": "now() + interval '1 day' + ids.n * interval '1 millisecond'",
        "queued_at": "now() + interval '1 day'",
    }
    with store.engine.begin() as db:
        db.execute(
            text(
                "CREATE TEMP TABLE ids ON COMMIT DROP AS SELECT n, "
                "gen_random_uuid()::text AS turn_id, gen_random_uuid()::text AS run_id, "
                "(CAST(:sessions AS text[]))[1 + n % :count] AS session_id "
                "FROM generate_series(CAST(:start AS bigint), CAST(:stop AS bigint)) AS n"
            ),
            {
                "sessions": sessions,
                "count": len(sessions),
                "start": start,
                "stop": start + count - 1,
            },
        )
        for table, values, key in (
            (t.turns, turn_values, "id"),
            (t.runs, run_values, "turn_id"),
        ):
            columns = [c.name for c in table.c]
            chosen = ", ".join(values.get(c, f"template.{c}") for c in columns)
            db.execute(
                text(
                    f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT {chosen} "
                    f"FROM {table.name} AS template, ids WHERE template.{key} = :template"
                ),
                {"template": template_turn},
            )
        db.execute(text("ANALYZE turns; ANALYZE runs"))


def _max_ordinal(store: SqlStore) -> int:
    with store.engine.connect() as db:
        return int(db.execute(text("SELECT coalesce(max(ordinal), 0) FROM turns")).scalar_one())


def sweep_costs(store: SqlStore) -> dict[str, Any]:
    """Per statement: the median wall time of ``ROUNDS`` runs, and the buffers one run
    touched (EXPLAIN ANALYZE); and the floor, a ``SELECT 1``."""
    figures: dict[str, Any] = {}
    with store.engine.connect() as db:
        floor = []
        for _ in range(ROUNDS):
            began = time.perf_counter()
            db.execute(text("SELECT 1")).all()
            floor.append(time.perf_counter() - began)
        figures["floor"] = pct(floor, 0.5)
    looks: list[tuple[str, Callable[[], object], Any, dict[str, Any]]] = [
        ("release", store.release_due_runs, q.RELEASE_DUE, {"b_limit": 1000}),
        ("with work", store.sessions_with_work_lanes, q.SESSIONS_WITH_WORK, {}),
        ("capacity", store.waiting_for_capacity, q.CAPACITY_BY_LANE, {}),
    ]
    for name, run, statement, binds in looks:
        samples = []
        for _ in range(ROUNDS):
            began = time.perf_counter()
            run()
            samples.append(time.perf_counter() - began)
        figures[name] = pct(samples, 0.5)
        sql = str(statement.compile(store.engine))
        with store.engine.begin() as db:  # (rolled back: EXPLAIN ANALYZE runs the update)
            plan = db.exec_driver_sql(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}",
                {"b_now": datetime.now(UTC), **binds},
            ).scalar_one()
            db.rollback()
        top = plan[0]["Plan"]
        figures[name + " buffers"] = top.get("Shared Hit Blocks", 0) + top.get(
            "Shared Read Blocks", 0
        )
    return figures


def on_time(url: str, directory: Path, due: int, over: float) -> list[tuple[float, float]]:
    """How late each of ``due`` turns due over ``over`` seconds started, in seconds, with
    how long after its submission it was due."""
    fleet, root = start_scripted_fleet(url, REDIS_URL, directory, ECHO)
    try:
        with parley.connect(url, redis_url=REDIS_URL, queue=fleet.queue) as client:
            sessions = [client.open_session(root) for _ in range(min(due, 200))]
            # Due from shortly after the last submission on (a submission takes some ms).
            first = datetime.now(UTC) + timedelta(seconds=5 + due * 0.01)
            step = over / due
            asked = {f"due {n}": first + timedelta(seconds=n * step) for n in range(due)}
            handles = []
            ahead: dict[str, float] = {}
            for n, (prompt, when) in enumerate(asked.items()):
                ahead[prompt] = (when - datetime.now(UTC)).total_seconds()
                handles.append(sessions[n % len(sessions)].submit(prompt, at=when))
            for handle in handles:
                handle.wait(timeout=over + 120)
            with client.store.engine.connect() as db:
                started = db.execute(
                    text(
                        "SELECT t.prompt, r.started_at FROM runs r "
                        "JOIN turns t ON t.id = r.turn_id WHERE t.prompt LIKE 'due %'"
                    )
                ).all()
        return [
            (ahead[row.prompt], (row.started_at - asked[row.prompt]).total_seconds())
            for row in started
        ]
    finally:
        fleet.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--due", type=int, default=1000)
    parser.add_argument("--over", type=float, default=60.0)
    parser.add_argument("--waiting", type=int, default=100_000)
    args = parser.parse_args()
    flush_redis(REDIS_URL)
    with fresh_postgres_database("delayed") as url, tempfile.TemporaryDirectory() as tmp:
        store = SqlStore.from_url(url)
        try:
            sessions = [
                store.create_session(root=tmp, metadata={}, token_ceiling=None).session_id
                for _ in range(SESSIONS)
            ]
            template = store.submit_turn(
                session_id=sessions[0],
                prompt="template",
                request_id=None,
                contract=None,
                if_busy=parley.IfBusy.ENQUEUE,
                not_before=datetime.now(UTC) + timedelta(days=1),
            ).turn.turn_id
            print("1. a sweep against the backlog (median of 200; buffers of one run)")
            print(
                f"{'waiting':>9} {'release':>10} {'bufs':>5} {'with work':>10} {'bufs':>5} "
                f"{'capacity':>10} {'bufs':>5} {'SELECT 1':>9}"
            )
            have = 1
            for backlog in (1_000, 10_000, args.waiting):
                add_backlog(store, template, sessions, backlog - have)
                have = backlog
                f = sweep_costs(store)
                print(
                    f"{backlog:>9} {f['release'] * 1e3:8.3f}ms {f['release buffers']:>5} "
                    f"{f['with work'] * 1e3:8.3f}ms {f['with work buffers']:>5} "
                    f"{f['capacity'] * 1e3:8.3f}ms {f['capacity buffers']:>5} "
                    f"{f['floor'] * 1e3:7.3f}ms"
                )
        finally:
            store.close()
        print(f"2. on time: {args.due} turns due over {args.over:.0f}s, {have} waiting")
        late = on_time(url, Path(tmp), args.due, args.over)
        for what, samples in (
            ("all", [x for _when, x in late]),
            ("due within a minute (the broker's countdown)", [x for w, x in late if w < 60]),
            ("due later (beat's timer)", [x for w, x in late if w >= 60]),
        ):
            if samples:
                print(
                    f"late by, {what}: p50 {pct(samples, 0.5) * 1e3:.0f} ms, "
                    f"p99 {pct(samples, 0.99) * 1e3:.0f} ms, max {max(samples) * 1e3:.0f} ms; "
                    f"early: {sum(1 for x in samples if x < 0)} of {len(samples)}"
                )


if __name__ == "__main__":
    main()
