"""Where a route's blocking work runs (docs/security.md#6-heavy-work).

Light work, a read or a write of a few rows, runs on the thread pool every route shares
(anyio's, where FastAPI runs plain routes): :func:`light`.  Heavy work, what grows with a
file or a batch (storing an upload, making a batch of a file's lines, cancelling one, a
page of a file being downloaded), runs on threads of its own, at most
``PARLEY_GATEWAY_HEAVY_THREADS`` at once and at most ``PARLEY_GATEWAY_TENANT_HEAVY`` of
them one tenant's: :class:`HeavyWork`.  A tenant's heavy request past its share waits
its turn on the event loop, holding no thread.  So no heavy request waits for, or holds,
a thread a light one needs, and no tenant's heavy work holds more than its share of the
heavy threads.  (The OpenAI routes ran everything on asyncio's default pool, as many
threads as cores and four more: six batch creations of one tenant made another tenant's
``GET /v1/responses/{id}`` wait 36.5 s.)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

T = TypeVar("T")


async def light(work: Callable[..., T], *args: object) -> T:
    """``work(*args)`` on the thread pool every route shares."""
    return await run_in_threadpool(work, *args)


@dataclass
class _Places:
    """One tenant's places on the heavy threads, and the requests holding or awaiting one."""

    free: asyncio.Semaphore
    users: int = 0


class HeavyWork:
    """Threads of their own for heavy work, ``threads`` in all and ``per_tenant`` of one
    tenant's at once (see the module docstring)."""

    def __init__(self, *, threads: int, per_tenant: int) -> None:
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="parley-heavy")
        self._per_tenant = per_tenant
        self._places: dict[str, _Places] = {}  # (on the event loop only)

    async def run(self, tenant: str, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` on a heavy thread, once one of ``tenant``'s places is free.
        The place is held until the work has returned, even if the request awaiting it
        is gone (its client left): abandoned work still counts."""
        places = self._places.get(tenant)
        if places is None:
            places = self._places[tenant] = _Places(asyncio.Semaphore(self._per_tenant))
        places.users += 1
        try:
            await places.free.acquire()
        except BaseException:
            self._leave(tenant, places, acquired=False)
            raise
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # (the request's log scope, as to_thread's)
        try:
            future: Future[T] = self._threads.submit(context.run, functools.partial(work, *args))
        except BaseException:  # (closed: the gateway is stopping)
            self._leave(tenant, places)
            raise
        future.add_done_callback(lambda _: _call_soon(loop, self._leave, tenant, places))
        return await asyncio.wrap_future(future)

    async def stream(self, tenant: str, chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
        """``chunks``, each read as heavy work of ``tenant``'s: a slow reader holds no
        place between them."""
        while True:
            chunk = await self.run(tenant, next, chunks, None)
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        """Stop taking work; what has not started never will."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _leave(self, tenant: str, places: _Places, *, acquired: bool = True) -> None:
        if acquired:
            places.free.release()
        places.users -= 1
        if not places.users:
            del self._places[tenant]


def _call_soon(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: object
) -> None:
    """``callback(*args)`` on ``loop``, from another thread; nothing once the loop has
    closed (work that outlived the gateway's shutdown)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


__all__ = ["HeavyWork", "light"]
