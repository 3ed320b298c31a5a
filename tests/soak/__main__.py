"""``python -m tests.soak``: the chaos soak (docs/soak.md).

Starts its own PostgreSQL, Redis (and RabbitMQ with ``--broker amqp``), the fleet as the
Procfile runs it and two gateways; drives ``--rate`` turns a second for ``--minutes``
while the faults strike; drains; checks the history; prints the figures and writes them
with the journal to ``--out``.  Exits 1 on any violation (or a fault that failed to
strike), 0 otherwise."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from tests.soak import faults as fault_plan
from tests.soak.checker import Checker, Store, read_ledger
from tests.soak.faults import Faults
from tests.soak.journal import Journal
from tests.soak.load import Load
from tests.soak.memory import MemorySampler
from tests.soak.report import Report, print_report, print_violations
from tests.soak.topology import TOKEN, Topology


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30, help="how long the load runs")
    parser.add_argument("--rate", type=float, default=50, help="turns submitted a second")
    parser.add_argument("--sessions", type=int, default=3000, help="sessions the turns go to")
    parser.add_argument("--broker", choices=("redis", "amqp"), default="redis")
    parser.add_argument("--calm", type=float, default=30, help="seconds before the first fault")
    parser.add_argument("--no-faults", action="store_true", help="the same load, nothing broken")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="where logs and figures go")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = arguments(argv)
    seed = options.seed if options.seed is not None else random.randrange(1 << 30)
    out = options.out or Path(tempfile.mkdtemp(prefix="parley-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"soak: {options.minutes} min at {options.rate}/s, broker {options.broker}, "
        f"seed {seed}, in {out}",
        flush=True,
    )
    topology = Topology(out, broker=options.broker)
    try:
        topology.start()
        return run(options, seed, out, topology)
    finally:
        topology.stop()


def run(options: argparse.Namespace, seed: int, out: Path, topology: Topology) -> int:
    rng = random.Random(seed)
    load_seconds = options.minutes * 60
    journal = Journal()
    load = Load(
        urls=[g.url for g in topology.gateways],
        token=TOKEN,
        journal=journal,
        rate=options.rate,
        sessions=options.sessions,
        seed=seed,
    )
    memory = MemorySampler(topology)
    faults = Faults(topology, [], random.Random(seed + 1))
    began = time.monotonic()

    async def drive() -> None:
        await load.open_sessions()
        start = time.monotonic()
        calm_until = start + min(options.calm, load_seconds / 4)
        if not options.no_faults:
            faults.schedule = fault_plan.plan(calm_until, start + load_seconds - 10, rng)
            load.faults_at = time.time() + (calm_until - start)
        memory.start()
        faults.start()
        await load.run(start + load_seconds)
        faults.stop()
        await load.finish(timeout=300)
        await load.close()

    asyncio.run(drive())
    ended_at = time.monotonic()
    memory.stop()
    journal.save(out / "journal.json")
    store = Store.read(topology.database_url)
    checker = Checker(store, journal, read_ledger(topology.directory / "ledger.jsonl"))
    violations = checker.check()
    report = Report.of(
        options=vars(options) | {"seed": seed, "out": str(out)},
        journal=journal,
        store=store,
        faults=faults.log,
        memory=memory,
        checker=checker,
        seconds=ended_at - began,
        load_seconds=load_seconds,
    )
    (out / "report.json").write_text(json.dumps(report.to_json(), indent=2, default=str))
    print_report(report)
    print_violations(violations, store)
    failed_faults = [f for f in faults.log if f.error]
    return 1 if violations or failed_faults or journal.errors else 0


if __name__ == "__main__":
    sys.exit(main())
