"""Watching a turn from the command line: its events printed until it ends, Ctrl-C
interrupting it, and a word on stderr when no fleet worker takes it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

from rich.console import Console
from rich.text import Text

import parley
from parley.cli.output import notice
from parley.render import EventPrinter
from parley.tree_reading import TreeReader

UNCLAIMED_NOTICE_SECONDS = 5.0
"""How long a fleet turn that `submit` or `resume` watches may stay queued, with nothing
of its session running, before the command says that no worker has taken it."""


@contextlib.contextmanager
def unclaimed_notice(client: parley.Client, handle: parley.TurnHandle) -> Iterator[None]:
    """While the block runs: once, if the fleet turn is still queued after
    :data:`UNCLAIMED_NOTICE_SECONDS` and nothing of its session runs, say on stderr that
    no worker has taken it (otherwise the command would wait without a word for a worker
    that may not exist)."""
    if not client.fleet:
        yield  # this process drives the turn
        return
    # A delayed turn is not taken before its time (docs/time.md): counted from then.
    not_before = handle.submitted.not_before
    waits = 0.0 if not_before is None else (not_before - datetime.now(UTC)).total_seconds()
    delay = max(0.0, waits) + UNCLAIMED_NOTICE_SECONDS
    timer = threading.Timer(delay, _notice_if_unclaimed, (client, handle))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _notice_if_unclaimed(client: parley.Client, handle: parley.TurnHandle) -> None:
    try:
        statuses = {t.turn_id: t.status for t in client.session(handle.session_id).tree()}
    except parley.errors.ParleyError:
        return  # (the store is out of reach: the watch itself says so)
    if (
        statuses.get(handle.turn_id) is parley.TurnStatus.QUEUED
        and parley.TurnStatus.RUNNING not in statuses.values()
    ):
        line = (
            f"turn {handle.turn_id} is queued and no worker has taken it in "
            f"{UNCLAIMED_NOTICE_SECONDS:g} s: is `parley worker` running?"
        )
        notice(line, "yellow")


def watch(
    handle: parley.TurnHandle, console: Console, after: int = 0, *, workers: bool = False
) -> int:
    """Print a turn's events (after ``after``) and its children's until it ends, then its
    id; the exit status is 0 for ``finished`` or ``succeeded``, else 1.  Ctrl-C interrupts
    the turn (it stops at its next step boundary and stays resumable); a second Ctrl-C
    leaves it to itself.  With ``workers``, say which worker takes the turn (on a fleet)."""
    printer = EventPrinter(console, workers=workers)
    # The turn's tree: its children indented under their calls (docs/sub-agents.md).
    tree = TreeReader(handle, after)
    try:
        for event in tree:
            printer(event)
    except KeyboardInterrupt:
        console.print(Text("\ninterrupting: the turn stops at its next step boundary", "magenta"))
        with contextlib.suppress(parley.errors.TurnEnded):  # it ended as Ctrl-C was pressed
            handle.interrupt()
        for event in tree:  # on from the last event read
            printer(event)
    result = handle.wait()
    console.print(Text(f"turn {result.turn_id}", style="dim"))
    if result.outcome is parley.TurnStatus.CANCELLED:
        console.print(Text(f"continue it with: parley resume {result.turn_id}", "dim"))
    return 0 if result.outcome in (parley.TurnStatus.FINISHED, parley.TurnStatus.SUCCEEDED) else 1
