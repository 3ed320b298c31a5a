"""Following a batch until it ends: on a terminal a live progress bar (its two lines fit
80 columns), elsewhere a quiet poll; then the one line that sums it up."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from parley.batches import Batch, BatchState
from parley.cli.output import notice

POLL_SECONDS = 0.5


def wait(batch: Batch) -> BatchState:
    """Poll the batch until it ends."""
    while not (state := batch.status()).ended:
        time.sleep(POLL_SECONDS)
    return state


class _BatchProgress(Progress):
    """The bar, its count, the rate and the time left on one line; where the lines stand
    on the next (two lines fit an 80-column terminal)."""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            yield Text(standing(task.fields))


def standing(fields: dict[str, Any]) -> str:
    """Where the lines stand (the bar's second line), and, while the lines' agent calls
    run as child turns, those turns (docs/sub-agents.md#9-counts)."""
    text = (
        f"done {fields['done']} · failed {fields['failed']} · running "
        f"{fields['running']} · waiting for capacity {fields['throttled']}"
    )
    if fields.get("agents_running") or fields.get("agents_waiting"):
        text += f" · agents {fields['agents_running']} running, {fields['agents_waiting']} waiting"
    return text


def follow(batch: Batch, console: Console) -> BatchState:
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
        "agents_running": counts.agents_running,
        "agents_waiting": counts.agents_waiting,
        "rate": f"{rate:.1f} lines/s",
    }


def summary(state: BatchState) -> None:
    """The batch's end, on stderr (stdout has its id alone)."""
    counts = state.request_counts
    notice(
        f"batch {state.id} {state.status}: {counts['completed']} completed, "
        f"{counts['failed']} failed, of {counts['total']}; output {state.output_file_id}, "
        f"errors {state.error_file_id}"
    )
