"""One of something per process (src/parley/runtime/per_process.py): however many threads
ask for it at once, one is built and all of them get it; a process forked meanwhile
builds its own, even while a thread of its parent was building."""

from __future__ import annotations

import os
import signal
import threading
import time

from parley.runtime.per_process import PerProcess

ASKING = 16


def test_threads_asking_at_once_share_the_one_built() -> None:
    builds: list[object] = []

    def build() -> object:
        time.sleep(0.05)  # as long as a runtime takes: every thread asks meanwhile
        made = object()
        builds.append(made)
        return made

    holder = PerProcess(build)
    start = threading.Barrier(ASKING)
    got: list[object] = []

    def ask() -> None:
        start.wait(10)
        got.append(holder.get())

    threads = [threading.Thread(target=ask) for _ in range(ASKING)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(builds) == 1
    assert got == builds * ASKING
    assert holder.get() is builds[0]


def test_a_forked_process_builds_its_own_even_while_its_parent_builds() -> None:
    parent = os.getpid()
    building, done = threading.Event(), threading.Event()

    def build() -> int:
        if os.getpid() == parent:
            building.set()
            done.wait(10)  # the parent's build is still under way at the fork
        return os.getpid()

    holder = PerProcess(build)
    builder = threading.Thread(target=holder.get)
    builder.start()
    try:
        assert building.wait(10)
        child = os.fork()
        if child == 0:  # pragma: no cover (the child's own exit status says)
            status = 1
            try:
                # A lock copied as held would block here for good: the alarm ends the
                # child (its own, not pytest-timeout's handler, which would raise into
                # a copy of the test run).
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                signal.alarm(5)
                status = 0 if holder.get() == os.getpid() else 1
            finally:
                os._exit(status)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        done.set()
        builder.join(10)
    assert holder.get() == parent
