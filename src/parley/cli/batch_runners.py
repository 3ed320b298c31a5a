"""Who runs an embedded batch's lines, as the command line tells it: what a Ctrl-C on
``parley batch submit`` leaves and what will run it, and ``parley batch results``
telling a batch that nothing runs from one that runs slowly.

Embedded, a batch's lines run in a process that has the database open with a host: the
one that submitted them, or the next one (``parley gateway``, ``parley batch submit``,
``parley batch results`` with a host, ``parley.connect()`` with one), which adopts the
work no live process drives (src/parley/kickers.py).  On a fleet the workers run them:
there, waiting for them is right."""

from __future__ import annotations

import argparse
import shlex
import time
from collections.abc import Callable

import parley
from parley.batches import BatchState
from parley.cli.connecting import names_a_host
from parley.coordination.constants import SWEEP_SECONDS
from parley.runtime.session_leases import live_holders

UNRUN_SECONDS = 3 * SWEEP_SECONDS
"""How long an embedded batch's queued lines may wait, with nothing of the database
running, before ``parley batch results`` says that nothing runs them: a live process
with a host drives the work it sees undriven twice, a sweep apart, well within it."""


class NothingRunsIt(Exception):
    """An embedded batch has queued lines and no process runs them (``state``)."""

    def __init__(self, state: BatchState) -> None:
        super().__init__(state.id)
        self.state = state


class UnrunWatch:
    """Told the batch each time ``results`` waits for more lines: raises
    :class:`NothingRunsIt` once, for :data:`UNRUN_SECONDS`, the batch had lines queued,
    none running, ended or waiting for capacity, and no process drove a session of the
    database (an embedded process's lease) nor waited for capacity (its timer kicks the
    turn when it is due).  Any of these, or a line's end, starts the count again."""

    def __init__(
        self,
        client: parley.Client,
        *,
        seconds: float = UNRUN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._seconds = seconds
        self._clock = clock
        self._since: float | None = None
        self._ended = -1

    def __call__(self, state: BatchState) -> None:
        if not self._idle(state):
            self._since = None
            return
        now = self._clock()
        if self._since is None or state.counts.ended != self._ended:
            self._since, self._ended = now, state.counts.ended
        elif now - self._since >= self._seconds:
            raise NothingRunsIt(state)

    def _idle(self, state: BatchState) -> bool:
        counts = state.counts
        # A line whose turn waits for its agents runs only while its child turns do.
        driven = counts.running - counts.awaiting_agents + counts.agents_running
        if not counts.queued or driven or counts.throttled:
            return False
        store = self._client.store
        if live_holders(store.leases):
            return False
        return not any(lane.waiting_capacity for lane in store.work_by_lane())


def unrun_line(args: argparse.Namespace, state: BatchState) -> str:
    """What ``results`` says of a batch nothing runs."""
    queued = state.counts.queued
    return (
        f"batch {state.id}: {_lines(queued)} queued and no process runs them: start one on "
        f"this database (`{_parley(args, host=False)} gateway`), or run them here with a host "
        f"(`{_parley(args, host=False)} --host HOST batch results {state.id}`, or "
        "PARLEY_MODEL set)"
    )


def left_line(args: argparse.Namespace, state: BatchState, *, fleet: bool) -> str:
    """What a Ctrl-C on ``batch submit`` says once this process let go of the batch:
    how many lines are left, and what runs them."""
    left = state.counts.total - state.counts.ended
    if fleet:
        return (
            f"stopped following batch {state.id}: the fleet's workers run its {_lines(left)} "
            f"left (`{_parley(args, host=False)} batch status {state.id}`)"
        )
    prefix = _parley(args, host=True)
    if names_a_host(args):
        runners = f"`{prefix} batch results {state.id}` (which prints them), or `{prefix} gateway`"
    else:
        runners = f"`{prefix} gateway`, or `{prefix} --host HOST batch results {state.id}`"
    return (
        f"batch {state.id}: {left} of {_lines(state.counts.total)} left; the next process "
        f"with a host on this database runs them: {runners}"
    )


def stopping_line(state: BatchState) -> str:
    """What a Ctrl-C on an embedded ``batch submit`` says first."""
    running = state.counts.running
    if not running:
        return "stopping: no line starts from now on"
    return (
        f"stopping: no line starts from now on, and the {_lines(running)} running finish "
        "first (Ctrl-C again leaves them to the next process, which resumes them)"
    )


def _lines(count: int) -> str:
    return f"{count} line" if count == 1 else f"{count} lines"


def _parley(args: argparse.Namespace, *, host: bool) -> str:
    """``parley`` with the global options this command was given (``--db``, and
    ``--host`` if ``host``), to repeat in a command it suggests."""
    words = ["parley"]
    if args.db:
        words += ["--db", args.db]
    if host and args.host:
        words += ["--host", args.host]
    return shlex.join(words)
