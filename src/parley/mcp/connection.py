"""``McpConnection``: one live MCP client session, driven from synchronous code.

The ``mcp`` SDK is asynchronous and parley's engine is not, so each connection owns a
daemon thread running its own event loop (an anyio blocking portal).  The session lives
in one task on that loop for the connection's whole life; tool calls are submitted to the
loop from any thread and waited for with a timeout.  Calls from several threads run
concurrently over the one session (JSON-RPC matches answers to requests by id).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import os
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager
from importlib import metadata
from typing import Any, Literal, TextIO

import anyio
import anyio.from_thread
import httpx2
import mcp_types
from mcp import Client, MCPError
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from parley.errors import McpError
from parley.mcp.spec import McpServer
from parley.models._wire import public_url

log = logging.getLogger("parley.mcp")

# The SDK bounds a stdio server's shutdown (stdin closed, 2 s; SIGTERM, 2 s; SIGKILL, 2 s):
# waiting a little longer than that for the session task is always enough.
_SHUTDOWN_WAIT = 8.0
# How much later than the call timeout the caller's thread gives up on the loop: the loop
# normally answers (with a timeout error) first, and this only guards a wedged loop.
_CALL_SLACK = 2.0
_LIST_PAGES = 100
# SSE streams stay open between events; the SDK's own default for their read timeout.
_SSE_READ_TIMEOUT = 300.0
_STDERR_LINES = 20


class McpConnection:
    """One MCP server, connected.  Create with :meth:`begin`, then :meth:`wait_started`
    (two steps so that a toolbox can start several servers at once); call tools with
    :meth:`call`; end with :meth:`close` (idempotent, from any thread)."""

    def __init__(self, spec: McpServer) -> None:
        self.spec = spec
        self.tools: tuple[mcp_types.Tool, ...] = ()
        self._lock = threading.Lock()
        self._state: Literal["new", "starting", "open", "closed"] = "new"
        self._portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._closing: anyio.Event | None = None
        self._session_task: concurrent.futures.Future[None] | None = None
        self._ready: concurrent.futures.Future[tuple[mcp_types.Tool, ...]] = (
            concurrent.futures.Future()
        )
        self._start_timeout = spec.timeout
        self._stderr: _StderrTail | None = None
        # Touched only on the loop thread.
        self._client: Client | None = None
        # Why the session ended on its own (the server died or hung up), if it did.
        self._ended: str | None = None

    @property
    def name(self) -> str:
        """The server's name."""
        return self.spec.name

    @property
    def alive(self) -> bool:
        """True while the connection is open and the server has not gone away."""
        return self._state == "open" and self._ended is None

    # ------------------------------------------------------------------ start

    def begin(self, timeout: float | None = None) -> None:
        """Start connecting in the background; ``timeout`` (default: the spec's) bounds
        spawning or connecting, ``initialize`` and listing the tools."""
        # Under the lock, so that a close() from another thread sees all of it or none.
        with self._lock:
            if self._state != "new":
                raise McpError(f"MCP server {self.name!r}: the connection was already started")
            self._state = "starting"
            if timeout is not None:
                self._start_timeout = min(timeout, self.spec.timeout)
            if self.spec.transport == "stdio":
                self._stderr = _StderrTail(self.name)
            self._portal_cm = anyio.from_thread.start_blocking_portal(name=f"mcp-{self.name}")
            portal = self._portal = self._portal_cm.__enter__()
            self._closing = portal.call(anyio.Event)
            self._session_task = portal.start_task_soon(self._session)

    def wait_started(self) -> None:
        """Wait for :meth:`begin` to finish.  A server that failed to start raises
        :class:`McpError` naming the cause; nothing of it is left running."""
        try:
            self.tools = self._ready.result(timeout=self._start_timeout + _SHUTDOWN_WAIT)
        except concurrent.futures.TimeoutError:
            cause = f"no answer within {self._start_timeout:g} s"
        except _StartFailed as exc:
            closed = exc.cause is None and self._state == "closed"
            cause = "closed while starting" if closed else self._describe(exc.cause)
        else:
            with self._lock:
                if self._state == "starting":
                    self._state = "open"
                    return
            cause = "closed while starting"
        self.close()
        raise McpError(f"MCP server {self.name!r} did not start: {cause}{self._stderr_note()}")

    # ------------------------------------------------------------------ calls

    def call(self, tool: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        """Call ``tool`` and wait (at most the spec's call timeout) for its result.  A
        transport failure or a timeout raises :class:`McpError`; a result with ``is_error``
        is returned as it is."""
        timeout = self.spec.per_call_timeout
        where = f"MCP server {self.name!r}, tool {tool!r}"
        with self._lock:
            portal = self._portal if self._state == "open" else None
        if portal is None or self._ended is not None:
            raise McpError(f"{where}: the connection is {self._ended or 'closed'}")
        try:
            future = portal.start_task_soon(self._call, tool, arguments, timeout)
        except RuntimeError as exc:  # the portal stopped under us: closed meanwhile
            raise McpError(f"{where}: the connection is closed") from exc
        try:
            result: mcp_types.CallToolResult = future.result(timeout=timeout + _CALL_SLACK)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise McpError(f"{where}: timed out after {timeout:g} s") from None
        except concurrent.futures.CancelledError:
            raise McpError(f"{where}: the connection was closed during the call") from None
        except McpError:
            raise
        except Exception as exc:
            raise McpError(f"{where}: {self._describe(exc)}") from exc
        return result

    async def _call(
        self, tool: str, arguments: dict[str, Any], timeout: float
    ) -> mcp_types.CallToolResult:
        client = self._client
        if client is None:
            raise McpError(f"MCP server {self.name!r}: the connection is closed")
        try:
            # The SDK's own timeout cancels the request at the server too; this outer
            # bound also covers the extra rounds of an input-required exchange.
            with anyio.fail_after(timeout + _CALL_SLACK / 2):
                return await client.call_tool(tool, arguments, read_timeout_seconds=timeout)
        except TimeoutError:
            raise McpError(
                f"MCP server {self.name!r}, tool {tool!r}: timed out after {timeout:g} s"
            ) from None
        except MCPError as exc:
            if exc.code == mcp_types.REQUEST_TIMEOUT:
                raise McpError(
                    f"MCP server {self.name!r}, tool {tool!r}: timed out after {timeout:g} s"
                ) from None
            if exc.code == mcp_types.CONNECTION_CLOSED and exc.message == "Connection closed":
                # The session itself is over (the server exited or hung up), not just this
                # request's stream: later calls fail at once, and the toolbox says so.
                self._ended = f"gone ({self._describe(exc)})"
            raise

    # ------------------------------------------------------------------ close

    def close(self) -> None:
        """End the session and stop the server (a stdio process is stopped and reaped).
        Calls in flight fail with :class:`McpError`.  Safe to call twice, from any thread."""
        with self._lock:
            if self._state == "closed":
                return
            self._state = "closed"
        portal, closing, task = self._portal, self._closing, self._session_task
        if portal is not None and self._portal_cm is not None:
            if task is not None and not self._ready.done():
                task.cancel()  # still starting: stop waiting for the server at once
            elif closing is not None:
                _ignore_stopped(lambda: portal.call(closing.set))
            if task is not None:
                concurrent.futures.wait([task], timeout=_SHUTDOWN_WAIT)
            # Calls still waiting on the loop are cancelled, then the loop thread is joined.
            _ignore_stopped(lambda: portal.call(portal.stop, True))
            self._portal_cm.__exit__(None, None, None)
        if self._stderr is not None:
            self._stderr.close()

    # ------------------------------------------------------------------ the session task

    async def _session(self) -> None:
        """Open the session, list the tools, then hold the session open until closed."""
        assert self._closing is not None
        failure: BaseException | None = None
        try:
            deadline = anyio.current_time() + self._start_timeout
            with anyio.CancelScope(deadline=deadline) as scope:
                async with self._open_client() as client:
                    tools = await _list_tools(client)
                    scope.deadline = math.inf  # the start timeout is over
                    self._client = client
                    self._ready.set_result(tools)
                    await self._closing.wait()
            if scope.cancelled_caught and not self._ready.done():
                failure = TimeoutError()
        except Exception as exc:
            failure = exc
        finally:
            self._client = None
            if self._stderr is not None:
                # The child has its own copy: ours goes now so the reader sees the end.
                self._stderr.close_writer()
            if not self._ready.done():
                self._ready.set_exception(_StartFailed(failure))
            elif failure is not None and self._state != "closed":
                self._ended = f"gone ({self._describe(failure)})"
                log.warning("MCP server %r: the session ended: %s", self.name, self._ended)

    @asynccontextmanager
    async def _open_client(self) -> AsyncIterator[Client]:
        spec = self.spec
        info = mcp_types.Implementation(name="parley", version=_parley_version())
        async with AsyncExitStack() as stack:
            if spec.transport == "stdio":
                assert self._stderr is not None
                params = StdioServerParameters(
                    command=spec.command[0],
                    args=list(spec.command[1:]),
                    env=dict(spec.env) if spec.env else None,
                    cwd=spec.cwd,
                )
                transport: Any = stdio_client(params, errlog=self._stderr.writer)
            else:
                assert spec.url is not None
                read = max(_SSE_READ_TIMEOUT, spec.per_call_timeout + _CALL_SLACK)
                http = httpx2.AsyncClient(
                    headers=dict(spec.headers or {}),
                    timeout=httpx2.Timeout(spec.timeout, read=read),
                )
                await stack.enter_async_context(http)
                transport = streamable_http_client(spec.url, http_client=http)
            # No response cache: a listing is read once per connection anyway.
            client = Client(transport, client_info=info, cache=None)
            yield await stack.enter_async_context(client)

    # ------------------------------------------------------------------ messages

    def _describe(self, exc: BaseException | None) -> str:
        """A sentence for why the server failed, from the (possibly grouped) exception."""
        if exc is None:
            return "cancelled"
        causes: list[str] = []
        for leaf in _leaves(exc):
            text = self._describe_one(leaf)
            if text not in causes:
                causes.append(text)
        return "; ".join(causes)

    def _describe_one(self, exc: BaseException) -> str:
        spec = self.spec
        if isinstance(exc, McpError):
            return str(exc)
        if isinstance(exc, TimeoutError):
            return f"no answer within {self._start_timeout:g} s"
        if isinstance(exc, OSError) and spec.transport == "stdio" and exc.strerror:
            return f"cannot run {spec.command[0]!r}: {exc.strerror}"
        # Errors end up in logs and in the stored turn: never a URL's user:password part.
        url = public_url(str(spec.url))
        if isinstance(exc, httpx2.ConnectError):
            return f"cannot connect to {url}: {exc}"
        if isinstance(exc, httpx2.TimeoutException):
            return f"{url} did not answer in time ({type(exc).__name__})"
        if isinstance(exc, MCPError):
            if exc.code == mcp_types.CONNECTION_CLOSED:
                if spec.transport == "stdio":
                    return "the server process exited or closed its output"
                return "the server closed the connection"
            return f"the server answered with error {exc.code}: {exc.message}"
        return f"{type(exc).__name__}: {exc}"

    def _stderr_note(self) -> str:
        tail = self._stderr.tail() if self._stderr is not None else ""
        return f" (its stderr ends with: {tail})" if tail else ""


class _StartFailed(Exception):
    """Carries the original start failure from the loop thread to the waiting one."""

    def __init__(self, cause: BaseException | None) -> None:
        super().__init__(repr(cause))
        self.cause = cause


class _StderrTail:
    """A stdio server's stderr, read on a thread: each line goes to the ``parley.mcp`` log
    and the last few are kept to explain a failed start."""

    def __init__(self, server: str) -> None:
        read_fd, write_fd = os.pipe()
        self.server = server
        self.writer: TextIO = os.fdopen(write_fd, "w")
        self._reader = os.fdopen(read_fd, "rb")
        self._lines: deque[str] = deque(maxlen=_STDERR_LINES)
        self._thread = threading.Thread(target=self._pump, name=f"mcp-{server}-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        with self._reader:
            for raw in self._reader:
                line = raw.decode("utf-8", errors="replace").rstrip()
                if line:
                    self._lines.append(line)
                    log.info("MCP server %r: %s", self.server, line)

    def close_writer(self) -> None:
        """Drop parley's copy of the pipe's write end (the child keeps its own)."""
        self.writer.close()

    def close(self) -> None:
        """Stop reading, once the child is gone and the pipe has drained."""
        self.close_writer()
        # A grandchild that inherited stderr could hold the pipe open; do not wait on it.
        self._thread.join(timeout=1.0)

    def tail(self) -> str:
        """The last lines the server wrote, joined with `` | ``."""
        self._thread.join(timeout=1.0)
        return " | ".join(self._lines)[-1000:]


async def _list_tools(client: Client) -> tuple[mcp_types.Tool, ...]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(_LIST_PAGES):  # a paginator that never ends cannot hang the start
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tuple(tools)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _ignore_stopped(action: Callable[[], object]) -> None:
    # RuntimeError: the portal already stopped, so there is nothing left to do.
    with contextlib.suppress(RuntimeError):
        action()


def _parley_version() -> str:
    try:
        return metadata.version("parley")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0"
