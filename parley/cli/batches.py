"""``parley batch submit|status|results|cancel`` (docs/batches.md#on-the-command-line).

``submit`` prints the batch's id as the first line of its standard output, so a script can
take it with ``head -1``; on a terminal it then shows a live progress bar until the batch
ends.  Embedded, this process runs the lines, so it always waits for them; on a fleet it
waits with ``--wait`` (or on a terminal, for the bar)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

import parley
from parley.batches import Batch, BatchState
from parley.cli.connecting import client_for, environment_names_a_host
from parley.openai_api.batch_objects import batch_object

POLL_SECONDS = 0.5


def submit(args: argparse.Namespace, console: Console) -> int:
    source = Path(args.file)
    if not source.is_file():
        raise parley.errors.InvalidRequest(f"no file {args.file!r} (a JSONL file of lines)")
    with client_for(args, runs_turns=True) as client:
        batch = client.submit_batch(
            source, root=args.root, tenant=args.tenant, request_id=args.request_id
        )
        print(batch.id, flush=True)
        live = sys.stdout.isatty()
        if client.fleet and not (args.wait or live):
            return 0  # the workers run it: `parley batch status ID` follows it
        if not (client.fleet or args.wait or live):
            print("this process runs the batch's lines: waiting for them", file=sys.stderr)
        state = _follow(batch, console) if live else _wait(batch)
        _summary(state, Console(stderr=True) if live else None)
        return 0 if state.status == "completed" else 1


def status(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        batch = client.batch(args.batch_id)
        if args.json:
            print(json.dumps(batch_object(client.store.get_batch(batch.id))))
            return 0
        state = batch.status()
    counts = state.request_counts
    console.print(f"batch {state.id}: {state.status}")
    console.print(
        f"  {counts['completed']} completed, {counts['failed']} failed, of {counts['total']}"
    )
    unfinished = state.counts
    console.print(
        f"  {unfinished.running} running, {unfinished.waiting} waiting for an answer, "
        f"{unfinished.throttled} waiting for capacity, {unfinished.queued} queued"
    )
    console.print(f"  output {state.output_file_id}, errors {state.error_file_id}")
    return 0


def results(args: argparse.Namespace, console: Console) -> int:
    # Embedded with a host named, this process drives what no process drives (lines a
    # submission that stopped left); without one it reads what others run.
    runs = bool(args.host) or environment_names_a_host()
    with client_for(args, runs_turns=runs) as client:
        batch = client.batch(args.batch_id)
        if args.output:
            with open(args.output, "w", encoding="utf-8") as out:
                _write(batch, out)
        else:
            _write(batch, sys.stdout)
    return 0


def cancel(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        state = client.batch(args.batch_id).cancel()
    counts = state.request_counts
    console.print(
        f"batch {state.id}: {state.status} ({counts['completed']} completed, "
        f"{counts['failed']} failed, of {counts['total']})"
    )
    return 0


# ------------------------------------------------------------------------------ helpers


def _write(batch: Batch, out: TextIO) -> None:
    for row in batch.results():
        out.write(json.dumps(row, separators=(",", ":")) + "\n")
        out.flush()


def _wait(batch: Batch) -> BatchState:
    while not (state := batch.status()).ended:
        time.sleep(POLL_SECONDS)
    return state


class _BatchProgress(Progress):
    """The bar, its count, the rate and the time left on one line; where the lines stand
    on the next (two lines fit an 80-column terminal)."""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            fields = task.fields
            yield Text(
                f"done {fields['done']} · failed {fields['failed']} · running "
                f"{fields['running']} · waiting for capacity {fields['throttled']}"
            )


def _follow(batch: Batch, console: Console) -> BatchState:
    """The live bar, until the batch ends."""
    state = batch.status()
    total = state.request_counts["total"]
    columns = (
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
    )
    started = time.monotonic()
    first = state.counts.ended
    with _BatchProgress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(batch.id, total=total, **_fields(state, 0.0))
        while True:
            elapsed = max(time.monotonic() - started, 1e-6)
            rate = (state.counts.ended - first) / elapsed
            progress.update(task, completed=state.counts.ended, **_fields(state, rate))
            if state.ended:
                return state
            time.sleep(POLL_SECONDS)
            state = batch.status()


def _fields(state: BatchState, rate: float) -> dict[str, Any]:
    counts = state.counts
    return {
        "done": counts.completed,
        "failed": counts.failed,
        "running": counts.running,
        "throttled": counts.throttled,
        "rate": f"{rate:.1f} lines/s",
    }


def _summary(state: BatchState, console: Console | None) -> None:
    counts = state.request_counts
    line = (
        f"batch {state.id} {state.status}: {counts['completed']} completed, "
        f"{counts['failed']} failed, of {counts['total']}; output {state.output_file_id}, "
        f"errors {state.error_file_id}"
    )
    if console is not None:
        console.print(line, soft_wrap=True)
    else:
        print(line, file=sys.stderr)
