"""The gateway's one watcher of turns' ends (src/parley/gateway/ends_watch.py), on each
coordinator (the Redis one on the machine's Redis): many waiting requests share one
thread; a waiter for a turn the watcher's blocking read does not cover yet rings it awake
(it would otherwise wait out the read); an end already published answers at once, and one
at or below the seq waited past does not (a resumed turn's earlier end); a wait with no
end returns 0 after its timeout."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator

import pytest

from parley.gateway import ends_watch
from parley.gateway.ends_watch import EndsWatcher
from parley.ports.backend import Coordinator
from parley.schemas.events import Ended, Event


@pytest.fixture
def watcher(coordinator: Coordinator) -> Iterator[EndsWatcher]:
    watching = EndsWatcher(coordinator)
    yield watching
    watching.close()


def end(coordinator: Coordinator, turn_id: str, seq: int) -> None:
    ended = Ended(outcome="finished", reply="ok")
    coordinator.publish([Event.of(turn_id, seq, ended)], now=True)


def own_threads() -> set[str]:
    """The names of the threads alive, but asyncio's pool's (``to_thread``'s)."""
    return {t.name for t in threading.enumerate() if not t.name.startswith("asyncio_")}


def test_many_waiters_share_one_thread_and_each_hears_its_end(
    coordinator: Coordinator, watcher: EndsWatcher
) -> None:
    turns = [str(uuid.uuid4()) for _ in range(40)]
    before = own_threads()

    async def scenario() -> list[int]:
        waits = [asyncio.create_task(watcher.end_after(t, 0, 10)) for t in turns]
        while watcher.watched < len(turns):
            await asyncio.sleep(0.01)
        assert own_threads() - before == {"parley-ends-watch"}  # (no thread per waiter)
        for n, turn_id in enumerate(turns):
            await asyncio.to_thread(end, coordinator, turn_id, n + 2)
        return await asyncio.gather(*waits)

    assert asyncio.run(scenario()) == [n + 2 for n in range(len(turns))]
    assert watcher.watched == 0


def test_a_waiter_for_a_new_turn_wakes_a_watcher_blocked_on_others(
    coordinator: Coordinator, watcher: EndsWatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reads and store rechecks longer than the test waits: without the doorbell, the
    # second waiter would only be covered once the first read ran out.
    monkeypatch.setattr(ends_watch, "READ_SECONDS", 30.0)
    monkeypatch.setattr(ends_watch, "STORE_RECHECK_SECONDS", 30.0)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())

    async def scenario() -> tuple[int, int]:
        blocked = asyncio.create_task(watcher.end_after(first, 0, 20))
        while watcher.watched < 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the watcher is in its read of the first turn's ends
        late = asyncio.create_task(watcher.end_after(second, 0, 5))
        await asyncio.sleep(0.2)
        await asyncio.to_thread(end, coordinator, second, 3)
        heard = await late
        await asyncio.to_thread(end, coordinator, first, 4)
        return heard, await blocked

    assert asyncio.run(scenario()) == (3, 4)


def test_an_end_already_published_answers_at_once_and_an_older_one_does_not(
    coordinator: Coordinator, watcher: EndsWatcher
) -> None:
    turn_id = str(uuid.uuid4())
    end(coordinator, turn_id, 5)

    async def scenario() -> tuple[int, int]:
        return await watcher.end_after(turn_id, 0, 5), await watcher.end_after(turn_id, 5, 0.5)

    assert asyncio.run(scenario()) == (5, 0)  # past 5 (a resumed turn): nothing yet


def test_a_wait_with_no_end_returns_nothing_after_its_timeout(watcher: EndsWatcher) -> None:
    async def scenario() -> int:
        return await watcher.end_after(str(uuid.uuid4()), 0, 0.3)

    assert asyncio.run(scenario()) == 0
    assert watcher.watched == 0
