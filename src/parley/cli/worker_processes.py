"""`parley worker` on every core: one Celery worker process per core, supervised as one
worker.

One worker process is one GIL, so a worker that streams many turns is bound by one core
(docs/performance.md, "A slow model").  With ``--processes N`` (default: the cores it
may run on, on a pool other than prefork) ``parley worker`` starts N children, each
``parley worker --processes 1`` with the same Celery options and a node name of its own
(``NAME-1@HOST``, ...), and supervises them: a child that dies is started again (the
others go on; the sweeper recovers its turns, as after any worker's crash), SIGTERM or
SIGINT is a warm shutdown of every child, and the parent exits once they all have.
Each child asks the kernel to kill it when the parent dies (``PR_SET_PDEATHSIG``), so
a SIGKILL of the parent stops all their work, as it would stop one process's.

The parent serves the children's metrics on ``PARLEY_METRICS_PORT`` (they count in
files under one ``PROMETHEUS_MULTIPROC_DIR``, as a prefork pool's processes do).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

from parley.errors import InvalidRequest
from parley.settings import Settings

log = logging.getLogger("parley.worker")

SUPERVISOR_VARIABLE = "PARLEY_WORKER_SUPERVISOR"
"""Set in a child's environment to its parent's pid: the child then dies with it."""

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
QUICK_DEATH_SECONDS = 10.0
"""A child that dies sooner than this after its start waits before it is started again,
longer each time in a row (up to :data:`RESTART_PAUSE_MOST`): a child that cannot run
(a Celery option it refuses, say) must not spin the machine."""
RESTART_PAUSE_MOST = 30.0
GIVE_UP_AFTER = 5
"""Quick deaths in a row, of the children together, after which the worker stops them
all and exits with the last one's status: nothing it restarts stays up."""


def processes_option(text: str) -> int:
    """``--processes``: a positive whole number (argparse's ``type``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, not {text!r}")
    return value


def pool_of(celery_args: Sequence[str]) -> str:
    """The Celery pool ``celery_args`` choose (``-P``/``--pool``; Celery's default,
    prefork, without)."""
    pool = "prefork"
    args = list(celery_args)
    for i, arg in enumerate(args):
        if arg in ("-P", "--pool") and i + 1 < len(args):
            pool = args[i + 1]
        elif arg.startswith("--pool="):
            pool = arg.split("=", 1)[1]
        elif arg.startswith("-P") and len(arg) > 2:
            pool = arg[2:]
    return pool


def process_count(given: int | None, settings: Settings, celery_args: Sequence[str]) -> int:
    """How many worker processes to run: ``--processes``, else
    ``PARLEY_WORKER_PROCESSES``, else one per core; always one on the prefork pool, which
    has processes of its own (more than one asked for there is an error)."""
    asked = given if given is not None else settings.worker_processes
    if pool_of(celery_args) == "prefork":
        if asked is not None and asked != 1:
            raise InvalidRequest(
                f"--processes {asked} (or PARLEY_WORKER_PROCESSES) needs a pool other than "
                "prefork (--pool threads): prefork runs a process per kick already, and "
                "its --concurrency is how many"
            )
        return 1
    # The cores this process may run on (a cpuset's, a container's), not the machine's.
    return asked if asked is not None else len(os.sched_getaffinity(0)) or 1


def die_with_parent() -> None:
    """In a child of the supervisor, before Celery starts: have the kernel SIGKILL this
    process when the parent dies, and exit now if it already has."""
    parent = os.environ.pop(SUPERVISOR_VARIABLE, None)
    if parent is None:
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        # Elsewhere (macOS, for development) no such request: a thread watches for
        # this process being handed to another parent.
        threading.Thread(
            target=_exit_when_orphaned, args=(int(parent),), name="parley-orphan", daemon=True
        ).start()
    # The parent may have died between starting this process and the prctl: then
    # nobody would kill it.
    if os.getppid() != int(parent):
        os._exit(1)


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def child_names(celery_args: Sequence[str], count: int) -> tuple[list[str], list[str]]:
    """``celery_args`` without their node name, and each child's: ``NAME-i@HOST`` from
    the given ``NAME@HOST`` (``-n``/``--hostname``), or ``parley-PID-i@%h``."""
    rest: list[str] = []
    given: str | None = None
    args = list(celery_args)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-n", "--hostname") and i + 1 < len(args):
            given = args[i + 1]
            i += 2
            continue
        if arg.startswith("--hostname="):
            given = arg.split("=", 1)[1]
        elif arg.startswith("-n") and len(arg) > 2:
            given = arg[2:]
        else:
            rest.append(arg)
        i += 1
    name, at, host = (given or f"parley-{os.getpid()}@%h").partition("@")
    return rest, [f"{name}-{n}{at}{host}" for n in range(1, count + 1)]


@dataclass
class _Child:
    name: str
    process: subprocess.Popen[bytes]
    started: float


class Supervisor:
    """The parent of ``count`` worker processes (see the module docstring)."""

    def __init__(self, count: int, celery_args: Sequence[str]) -> None:
        self._args, self._names = child_names(celery_args, count)
        self._children: dict[int, _Child] = {}  # by pid
        self._stopping = False
        self._quick_deaths = 0

    def run(self) -> int:
        """Start the children and supervise them until they have all stopped; returns
        the exit status."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._stop)
        log.info("worker of %d processes (pid %d): %s", len(self._names), os.getpid(), self._names)
        for index in range(len(self._names)):
            self._start(index)
        status = 0
        while self._children:
            pid, wait_status = os.waitpid(-1, 0)
            child = self._children.pop(pid, None)
            if child is None:
                continue
            code = os.waitstatus_to_exitcode(wait_status)
            if self._stopping:
                log.info("%s (pid %d) stopped (%d)", child.name, pid, code)
                if code > 0:
                    status = max(status, code)
                continue
            if code == 0:
                # Told to stop on its own (Celery's remote `shutdown`): not a crash.
                log.info("%s (pid %d) stopped (0); not restarted", child.name, pid)
                continue
            status = self._died(child, pid, code)
            if status:
                return status
        return status

    def _died(self, child: _Child, pid: int, code: int) -> int:
        """Start a dead child again (after a pause if it died young); a non-zero status
        when the worker gives up instead."""
        lived = time.monotonic() - child.started
        log.warning(
            "%s (pid %d) died (%s) after %.1f s; starting it again",
            child.name,
            pid,
            f"signal {-code}" if code < 0 else f"status {code}",
            lived,
        )
        if lived < QUICK_DEATH_SECONDS:
            self._quick_deaths += 1
            if self._quick_deaths >= GIVE_UP_AFTER:
                log.error("%d quick deaths in a row: stopping the worker", self._quick_deaths)
                self._stop(signal.SIGTERM, None)
                for other in list(self._children):
                    os.waitpid(other, 0)
                self._children.clear()
                return code if code > 0 else 1
            pause = min(RESTART_PAUSE_MOST, 0.5 * 2.0 ** (self._quick_deaths - 1))
            deadline = time.monotonic() + pause
            while not self._stopping and time.monotonic() < deadline:
                time.sleep(0.1)
            if self._stopping:
                return 0
        else:
            self._quick_deaths = 0
        if not self._stopping:
            self._start(self._names.index(child.name))
        return 0

    def _start(self, index: int) -> None:
        name = self._names[index]
        argv = [sys.executable, "-m", "parley", "worker", "--processes", "1"]
        argv += [*self._args, "--hostname", name]
        env = {**os.environ, SUPERVISOR_VARIABLE: str(os.getpid())}
        # (Same process group: a signal to the group reaches every child.)
        process = subprocess.Popen(argv, env=env)
        self._children[process.pid] = _Child(name, process, time.monotonic())
        log.info("%s started (pid %d)", name, process.pid)
        if self._stopping:
            # A SIGTERM that came while it was being started did not reach it.
            os.kill(process.pid, signal.SIGTERM)

    def _stop(self, signum: int, _frame: FrameType | None) -> None:
        """SIGTERM or SIGINT: a warm shutdown of every child (each gets SIGTERM once;
        a terminal's Ctrl-C has also reached them, and a second SIGINT there would make
        Celery's shutdown cold)."""
        if self._stopping:
            return
        self._stopping = True
        log.info("stopping: warm shutdown of %d processes", len(self._children))
        for pid in self._children:
            with contextlib.suppress(ProcessLookupError):  # (dead, not yet reaped)
                os.kill(pid, signal.SIGTERM)
