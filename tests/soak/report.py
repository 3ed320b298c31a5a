"""The soak's figures: what was asked and done, what broke and how fast the fleet came
back, first token with and without faults, memory at the start and the end; printed with
rich and written to ``report.json``."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from parley.coordination.constants import LOCK_TTL_MS
from tests.soak.checker import TERMINAL, Checker, Store, Violation
from tests.soak.faults import Fault
from tests.soak.journal import Journal
from tests.soak.memory import MemorySampler

SETTINGS = {
    "lock TTL (s)": LOCK_TTL_MS / 1000,
    "sweep period (s)": 2,
    "redelivery": "late acks, reject on worker lost; the sweeper re-kicks what a lost kick held",
}
"""What bounds crash → resumed (the soak runs the shipped values)."""
VIOLATIONS_SHOWN = 20


def percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def spread(values: list[float]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else None,
    }


@dataclass
class Report:
    figures: dict[str, Any]

    @classmethod
    def of(
        cls,
        *,
        options: dict[str, Any],
        journal: Journal,
        store: Store,
        faults: list[Fault],
        memory: MemorySampler,
        checker: Checker,
        seconds: float,
        load_seconds: float,
    ) -> Report:
        turns = list(journal.turns.values())
        lines = sum(len(b.custom_ids) for b in journal.batches)
        ended = sum(1 for t in store.turns.values() if t["status"] in TERMINAL)
        resumed = [s for f in faults if f.kind in ("kill_worker", "stop_worker") for s in f.resumed]
        finite = [s for s in resumed if math.isfinite(s)]
        first = {
            "calm": [t.first_token for t in turns if t.calm and t.first_token is not None],
            "faults": [t.first_token for t in turns if not t.calm and t.first_token is not None],
        }
        replies = {
            calm: [
                t.ended_at - t.submitted_at
                for t in turns
                if t.kind == "reply" and t.calm == calm and t.ended_at and not t.branched_from
            ]
            for calm in (True, False)
        }
        figures: dict[str, Any] = {
            "options": options,
            "arrivals": journal.arrivals,
            "turns accepted": len(turns),
            "batch lines": lines,
            "turns ended (store)": ended,
            "turns in the store": len(store.turns),
            "outcomes": dict(Counter(t["status"] for t in store.turns.values())),
            "kinds": dict(Counter(t.kind for t in turns)),
            "violations": len(checker.violations),
            "client errors": journal.errors[:50],
            "faults": dict(Counter(f.kind for f in faults)),
            "faults that failed to strike": [f"{f.kind}: {f.error}" for f in faults if f.error],
            "fault log": [
                {"kind": f.kind, "at": f.at, "target": f.target, "seconds": f.seconds}
                for f in faults
            ],
            "crash → resumed (s)": spread(finite) | {"never": len(resumed) - len(finite)},
            "resume bounds": SETTINGS,
            "first token (s), calm": spread(first["calm"]),
            "first token (s), under faults": spread(first["faults"]),
            "reply turn submitted → ended (s), calm": spread(replies[True]),
            "reply turn submitted → ended (s), under faults": spread(replies[False]),
            "rate asked (turns/s)": options["rate"],
            "rate held (turns accepted/s over the load)": len(turns) / load_seconds,
            "turns ended/s (over the whole run, drain included)": ended / seconds,
            "readers": len(journal.readers),
            "reader connections": sum(r.connections for r in journal.readers),
            "memory (MiB)": memory.by_role(),
            **checker.figures,
        }
        return cls(figures)

    def to_json(self) -> dict[str, Any]:
        return self.figures


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if value < 100 else f"{value:.0f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    return str(value)


def print_report(report: Report, console: Console | None = None) -> None:
    console = console or Console(width=120)
    table = Table(title="parley soak", show_header=False)
    for key, value in report.figures.items():
        if key in ("memory (MiB)", "fault log"):
            continue
        table.add_row(key, _fmt(value))
    console.print(table)
    memory = Table(title="memory (MiB)")
    for column in ("role", "start", "end", "processes", "longest (s)", "its RSS warm → end"):
        memory.add_column(column)
    for role, row in report.figures["memory (MiB)"].items():
        memory.add_row(
            role,
            f"{row['start_mib']:.0f}",
            f"{row['end_mib']:.0f}",
            str(row["processes"]),
            f"{row['longest_seconds']:.0f}",
            f"{row['longest_warm_mib']:.0f} → {row['longest_end_mib']:.0f}",
        )
    console.print(memory)


def print_violations(
    violations: list[Violation], store: Store, console: Console | None = None
) -> None:
    """Each violation with its turn's durable events (the first few in full)."""
    console = console or Console(width=160)
    if not violations:
        console.print("[bold green]no violations[/]")
        return
    console.print(f"[bold red]{len(violations)} violations[/]")
    for shown, violation in enumerate(violations):
        console.print(f"[red]✗ {violation.rule}[/] turn {violation.turn_id}: {violation.detail}")
        if shown < VIOLATIONS_SHOWN and violation.turn_id in store.events:
            for seq, kind, data, at in store.events[violation.turn_id]:
                console.print(f"    {seq:>4} {at:%H:%M:%S.%f} {kind:<18} {str(data)[:110]}")
