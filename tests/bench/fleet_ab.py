"""Two checkouts of parley measured side by side, to tell which is faster.

    .venv/bin/python -m tests.bench.fleet_ab OTHER_CHECKOUT [--rounds 12]
        [--other-python PATH] [--this-env NAME=VALUE ...]

This machine's speed moves more from one run to the next than most changes do, so
`tests.bench.fleet` before and after a change cannot tell them apart.  This starts a
fleet for each checkout (two `parley worker`s and `parley beat`, its own database, Redis
database and queue, the same services), then alternates between them: every round ten
one-step turns on each (submit → first token, submit → end), every fourth round the
200-turn throughput run on each (turns/s, CPU per turn of every process).  It prints
the medians.  OTHER_CHECKOUT is a tree such as `git worktree add /tmp/before HEAD~1`;
`--other-python` runs it with another interpreter (another set of packages);
`--this-env` sets a variable for this checkout's side only (its fleet and client), so
that one checkout against a worktree of itself measures a setting (tracing on, say).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
THIS_CHECKOUT = HERE.parents[2]
REDIS_URLS = ("redis://127.0.0.1:6379/11", "redis://127.0.0.1:6379/12")


def side(redis_url: str) -> None:
    """One checkout's fleet, driven by commands on stdin (``lat N``, ``tput``, ``quit``);
    runs with that checkout first on the import path, so it uses only what that
    checkout's ``tests.bench.fleet`` has had since before this script (an older
    ``latencies`` returns two lists, a newer one three)."""
    import parley
    from tests.bench.fleet import RULES, cpu_by_role, latencies, throughput

    # A checkout from before tests/support/ has these at tests' top level.
    new = importlib.util.find_spec("tests.support") is not None
    databases = importlib.import_module("tests.support.databases" if new else "tests.conftest")
    fleets = importlib.import_module("tests.support.fleet" if new else "tests.fleet")
    fresh_postgres_database, Fleet, flush_redis = (
        databases.fresh_postgres_database,
        fleets.Fleet,
        fleets.flush_redis,
    )

    flush_redis(redis_url)
    with fresh_postgres_database("ab") as url, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "workspace"
        root.mkdir()
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps({"rules": RULES}))
        fleet = Fleet(
            database_url=url, redis_url=redis_url, host=f"scripted:{script}", log_dir=Path(tmp)
        )
        fleet.start_worker(concurrency=1)
        fleet.start_worker(concurrency=1)
        fleet.start_beat()
        fleet.wait_ready()
        client = parley.connect(url, redis_url=redis_url, queue=fleet.queue)
        try:
            latencies(client, root, 20)  # warm up both workers
            print("ready", flush=True)
            for line in sys.stdin:
                command = line.split()
                if command[0] == "lat":
                    first, end = latencies(client, root, int(command[1]))[:2]
                    reply: Any = list(zip(first, end, strict=True))
                elif command[0] == "tput":
                    before = cpu_by_role(fleet)
                    rate = throughput(client, root)
                    after = cpu_by_role(fleet)
                    reply = [rate, sum(after.values()) - sum(before.values())]
                else:
                    break
                print(json.dumps(reply), flush=True)
        finally:
            client.close()
            fleet.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("other", type=Path, help="the other checkout")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--other-python", default=sys.executable)
    parser.add_argument(
        "--this-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a variable for this checkout's side only (repeatable)",
    )
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        side(args.side)
        return 0
    checkouts = {"other": args.other.resolve(), "this": THIS_CHECKOUT}
    pythons = {"other": args.other_python, "this": sys.executable}
    extra: dict[str, dict[str, str]] = {"other": {}, "this": {}}
    for setting in args.this_env:
        name, equals, value = setting.partition("=")
        if not equals or not name:
            parser.error(f"--this-env takes NAME=VALUE, not {setting!r}")
        extra["this"][name] = value
    sides = {}
    for (name, tree), redis_url in zip(checkouts.items(), REDIS_URLS, strict=True):
        sides[name] = subprocess.Popen(
            [pythons[name], str(HERE), str(tree), "--side", redis_url],
            cwd=tree,
            # The checkout's src first: the package installed (editable) from another
            # checkout's src would not be shadowed by the root alone.  Its fleet's
            # processes run on its interpreter, so a checkout whose tests.support.fleet
            # names only its root needs --other-python (a venv of its own).
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(tree)]),
                **extra[name],
            },
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    for process in sides.values():
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise SystemExit("a side did not start; see its output above")

    def ask(name: str, command: str) -> Any:
        process = sides[name]
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(command + "\n")
        process.stdin.flush()
        return json.loads(process.stdout.readline())

    first: dict[str, list[float]] = {name: [] for name in sides}
    end: dict[str, list[float]] = {name: [] for name in sides}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for n in range(args.rounds):
            order = list(sides) if n % 2 == 0 else list(reversed(sides))
            for name in order:
                for f, e in ask(name, "lat 10"):
                    first[name].append(f)
                    end[name].append(e)
            if n % 4 == 3:
                for name in order:
                    rate, seconds = ask(name, "tput")
                    rates[name].append(rate)
                    cpu[name].append(seconds / 200)
    finally:
        for process in sides.values():
            assert process.stdin is not None
            process.stdin.write("quit\n")
            process.stdin.close()
            process.wait(60)
    for name, tree in checkouts.items():
        throughput = (
            f"{statistics.median(rates[name]):6.1f} turns/s, "
            f"CPU per turn {1e3 * statistics.median(cpu[name]):5.2f} ms"
            if rates[name]
            else "(no throughput round: --rounds 4 or more)"
        )
        print(
            f"{name:5s} {tree}: first token p50 {1e3 * statistics.median(first[name]):5.2f} ms, "
            f"end p50 {1e3 * statistics.median(end[name]):5.2f} ms, {throughput}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
