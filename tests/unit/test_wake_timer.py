"""The embedded client's wake timer (src/parley/runtime/wake_timer.py): one thread fires
each asked time, soonest first whatever the order asked, none early, and none once
closed; a thousand times cost it no thread each."""

from __future__ import annotations

import threading
import time

from parley.runtime.wake_timer import WakeTimer


def test_times_fire_soonest_first_none_early_on_one_thread() -> None:
    fired: list[tuple[str, float]] = []
    threads: set[str] = set()
    done = threading.Event()
    began = time.monotonic()

    def fire(session_id: str, _priority: str) -> None:
        fired.append((session_id, time.monotonic() - began))
        threads.add(threading.current_thread().name)
        if len(fired) == 3:
            done.set()

    timer = WakeTimer(fire)
    before = threading.active_count()
    timer.at(0.3, "late", "interactive")
    timer.at(0.1, "soon", "interactive")
    timer.at(0.2, "middle", "batch")
    assert threading.active_count() == before + 1
    assert done.wait(5)
    assert [name for name, _at in fired] == ["soon", "middle", "late"]
    for (_name, at), asked in zip(fired, (0.1, 0.2, 0.3), strict=True):
        assert at >= asked
    assert threads == {"parley-wake-timer"}
    timer.close()


def test_many_times_share_the_thread_and_a_close_forgets_them() -> None:
    fired: list[str] = []
    timer = WakeTimer(lambda session_id, _priority: fired.append(session_id))
    before = threading.active_count()
    for n in range(1000):
        timer.at(60 + n, f"s{n}", "interactive")
    assert threading.active_count() == before + 1 and timer.pending() == 1000
    timer.close(timeout=5)
    assert timer.pending() == 0 and fired == []
    timer.at(0, "after close", "interactive")
    time.sleep(0.1)
    assert fired == []
