"""The gateway's bounds that need no server: a body's depth (read without parsing it, on
the event loop), which requests count as a tenant's streams, and a tenant's share of the
threads of heavy work."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
from starlette.types import Scope

from parley.gateway.bodies import MAX_BODY_DEPTH, nests_deeper_than
from parley.gateway.tenant_limits import is_stream
from parley.gateway.work import HeavyWork


def test_depth_is_counted_outside_strings() -> None:
    deep = b"[" * (MAX_BODY_DEPTH + 1) + b"]" * (MAX_BODY_DEPTH + 1)
    assert nests_deeper_than(deep, MAX_BODY_DEPTH)
    assert not nests_deeper_than(deep[1:-1], MAX_BODY_DEPTH)
    quoted = b'{"text": "' + b"[" * 500 + b'\\"{{{"}'
    assert not nests_deeper_than(quoted, 1)


def test_a_body_of_escaped_quotes_is_read_in_linear_time() -> None:
    """An opening quote then escaped quotes to the end of a 1 MiB body: a string pattern
    that had to fail was tried from each quote to the end (some 40 minutes of the
    event loop, for every tenant)."""
    body = b'"' + b'\\"' * 500_000
    started = time.process_time()
    assert not nests_deeper_than(body, MAX_BODY_DEPTH)
    assert time.process_time() - started < 5  # seconds where it took tens of minutes


def scope(method: str, path: str, query: str = "") -> Scope:
    return {"type": "http", "method": method, "path": path, "query_string": query.encode()}


@pytest.mark.parametrize(
    ("method", "path", "query", "stream"),
    [
        ("GET", "/v1/turns/t/events", "", True),
        ("POST", "/v1/ag-ui", "", True),
        ("GET", "/v1/responses/r", "stream=true", True),
        ("GET", "/v1/responses/r", "", False),
        ("POST", "/v1/responses", "", True),  # (it waits for its turn unless background)
        ("GET", "/v1/turns/t/result", "wait=30", False),  # a request, bounded at 60 s
        ("GET", "/v1/turns/t", "", False),
    ],
)
def test_streams_count_as_streams(method: str, path: str, query: str, stream: bool) -> None:
    assert is_stream(scope(method, path, query)) is stream


class Blocked:
    """Work that holds its thread until released, counting who runs it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running: Counter[str] = Counter()

    def work(self, tenant: str) -> str:
        with self.lock:
            self.running[tenant] += 1
        self.release.wait(30)
        with self.lock:
            self.running[tenant] -= 1
        return tenant

    def now(self) -> dict[str, int]:
        with self.lock:
            return {k: v for k, v in self.running.items() if v}


async def until(condition: Callable[[], bool]) -> None:
    """Wait on the event loop until ``condition`` holds (at most 10 s)."""
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


def test_a_tenants_heavy_work_holds_at_most_its_share_of_the_threads() -> None:
    async def scenario() -> None:
        heavy = HeavyWork(threads=3, per_tenant=2)
        blocked = Blocked()
        try:
            greedy = [asyncio.create_task(heavy.run("a", blocked.work, "a")) for _ in range(6)]
            await until(lambda: blocked.now() == {"a": 2})
            # Another tenant's heavy work gets the third thread at once, though six of
            # the first tenant's came before it.
            other = asyncio.create_task(heavy.run("b", blocked.work, "b"))
            await until(lambda: blocked.now() == {"a": 2, "b": 1})
            await asyncio.sleep(0.1)
            assert blocked.now() == {"a": 2, "b": 1}  # still no more of the first's
            blocked.release.set()
            assert await asyncio.gather(*greedy, other) == ["a"] * 6 + ["b"]
        finally:
            blocked.release.set()
            heavy.close()

    asyncio.run(scenario())


def test_heavy_work_whose_request_is_gone_keeps_its_place_until_it_returns() -> None:
    async def scenario() -> None:
        heavy = HeavyWork(threads=2, per_tenant=1)
        blocked = Blocked()
        try:
            abandoned = asyncio.create_task(heavy.run("a", blocked.work, "a"))
            await until(lambda: blocked.now() == {"a": 1})
            abandoned.cancel()  # (its client left; the work still runs)
            later = asyncio.create_task(heavy.run("a", blocked.work, "a"))
            await asyncio.sleep(0.2)
            assert blocked.now() == {"a": 1} and not later.done()
            blocked.release.set()
            assert await later == "a"
            with pytest.raises(asyncio.CancelledError):
                await abandoned
        finally:
            blocked.release.set()
            heavy.close()

    asyncio.run(scenario())
