"""A remote agent reached over MCP (docs/sub-agents.md#8-remote-agents): the child turn's
task sent as a task-augmented ``tools/call`` (MCP 2025-11-25 ``params.task``) to a remote
MCP server's tool, then looked at with ``tasks/get`` (not ended: the child lets go of its
worker until the next look, :class:`ModelPending`) and read with ``tasks/result``;
cancelled with ``tasks/cancel`` when the child is interrupted.

MCP task ids are made by the server, so the id cannot be chosen before the call is sent.
The call instead carries the child turn's id as its idempotency key
(``_meta["parley/request-key"]``): parley's MCP server answers a call it has seen with
the task it made then, so a takeover of the child's run after a crash (between sending
and hearing back, or at any later point) sends the same call and follows the same
task.  The remote side gets the task once, and its answer is not lost.

Requests are plain JSON-RPC over HTTP with :mod:`mcp_types`' models for what comes back:
the official client checks a ``tools/call`` answer as a ``CallToolResult`` whatever the
request asked, so it cannot make a task (docs/protocols.md#4-mcp).  An answer may come
as JSON or as a Server-Sent Events stream; a session id the server hands out
(``Mcp-Session-Id``) goes with every later request.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import mcp_types as mt
from pydantic import ValidationError

from parley.errors import ParleyError
from parley.ports.host import DeltaSink, ModelPending, StreamAborted

__all__ = ["PROTOCOL_VERSION", "REQUEST_KEY", "McpRemote", "RemoteMcpError"]

PROTOCOL_VERSION = "2025-11-25"
"""The version asked for: the first whose core has tasks."""
REQUEST_KEY = "parley/request-key"
"""The ``_meta`` key of a call's idempotency key (parley's MCP server honours it)."""
SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
_ENDED = {"completed", "failed", "cancelled"}
_R = TypeVar("_R", bound=mt.Result)


class RemoteMcpError(ParleyError):
    """The remote MCP server refused a request, answered one with something that is not
    MCP, or ended the task without an answer."""


@dataclass(frozen=True)
class McpRemote:
    """The MCP server at ``url`` (its Streamable HTTP endpoint), reached with
    ``headers``; ``tool`` is the tool a task is given to (its arguments ``{"task"}``)."""

    url: str
    tool: str
    headers: Mapping[str, str]
    poll_seconds: float
    timeout_seconds: float

    def ask(self, task: str, *, key: str, sink: DeltaSink) -> str:
        """The remote tool's answer to ``task`` if its task ended, sent (at most once per
        ``key`` on a server that honours the key) as a task; else :class:`ModelPending`
        for another look in ``poll_seconds``."""
        with httpx.Client(headers=dict(self.headers), timeout=self.timeout_seconds) as http:
            connection = _Connection(http, self.url)
            connection.initialize()
            task_id = connection.create_task(self.tool, task, key)
            return self._look(connection, task_id, sink)

    def abandon(self, task: str, *, key: str) -> None:
        """Cancel the task the call with ``key`` made (sent again, it names it)."""
        with httpx.Client(headers=dict(self.headers), timeout=self.timeout_seconds) as http:
            connection = _Connection(http, self.url)
            connection.initialize()
            connection.cancel(connection.create_task(self.tool, task, key))

    def _look(self, connection: _Connection, task_id: str, sink: DeltaSink) -> str:
        """The task's answer if it ended (its result's text), checking for an interrupt
        first (which cancels it); else :class:`ModelPending`.  A task waiting for input
        is waited for like one that works: nobody here can answer it, its own service's
        people may."""
        status = connection.status(task_id)
        try:
            sink.raise_if_interrupted()
        except StreamAborted:
            connection.cancel(task_id)
            raise
        if status.status not in _ENDED:
            raise ModelPending(
                f"the remote task {task_id} is {status.status}", seconds=self.poll_seconds
            )
        if status.status == "cancelled":
            raise RemoteMcpError(f"the remote task {task_id} was cancelled")
        result = connection.result(task_id)
        text = "".join(c.text for c in result.content if isinstance(c, mt.TextContent))
        if result.is_error or status.status == "failed":
            raise RemoteMcpError(
                f"the remote task {task_id} failed: {text or status.status_message}"
            )
        sink(text)
        return text


class _Connection:
    """One client's requests to one MCP server: JSON-RPC ids, and the session id and
    protocol version the server agreed to."""

    def __init__(self, http: httpx.Client, url: str) -> None:
        self._http = http
        self._url = url
        self._next_id = 0
        self._headers: dict[str, str] = {"Accept": "application/json, text/event-stream"}

    def initialize(self) -> None:
        """The handshake; a server that cannot run ``tools/call`` as a task is refused
        here, before the task is sent."""
        answer = self._request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "parley", "version": "1"},
            },
        )
        initialized = _parsed(mt.InitializeResult, answer)
        self._headers[VERSION_HEADER] = initialized.protocol_version
        tasks = initialized.capabilities.tasks
        calls = tasks.requests.tools if tasks is not None and tasks.requests is not None else None
        if calls is None or calls.call is None:
            raise RemoteMcpError(f"the MCP server at {self._url} does not run tool calls as tasks")
        self._notify("notifications/initialized")

    def create_task(self, tool: str, task: str, key: str) -> str:
        """Send the call as a task; the id the server gave it."""
        params = {
            "name": tool,
            "arguments": {"task": task},
            "task": {},
            "_meta": {REQUEST_KEY: key},
        }
        created = _parsed(mt.CreateTaskResult, self._request("tools/call", params))
        return created.task.task_id

    def status(self, task_id: str) -> mt.GetTaskResult:
        return _parsed(mt.GetTaskResult, self._request("tasks/get", {"taskId": task_id}))

    def result(self, task_id: str) -> mt.CallToolResult:
        return _parsed(mt.CallToolResult, self._request("tasks/result", {"taskId": task_id}))

    def cancel(self, task_id: str) -> None:
        """Ask the server to cancel the task (one that ended meanwhile is refused, which
        is as good)."""
        with contextlib.suppress(RemoteMcpError):
            self._request("tasks/cancel", {"taskId": task_id})

    def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The result of one request (its JSON-RPC error as :class:`RemoteMcpError`)."""
        self._next_id += 1
        message_id = self._next_id
        body = {"jsonrpc": "2.0", "id": message_id, "method": method, "params": params}
        with self._http.stream("POST", self._url, json=body, headers=self._headers) as answer:
            if answer.status_code != 200:
                answer.read()
                raise RemoteMcpError(
                    f"the MCP server at {self._url} answered {method} with HTTP "
                    f"{answer.status_code}: {answer.text[:300]}"
                )
            session = answer.headers.get(SESSION_HEADER)
            if session:
                self._headers[SESSION_HEADER] = session
            reply = _reply(answer, message_id)
        if reply is None:
            raise RemoteMcpError(f"the MCP server at {self._url} did not answer {method}")
        error = reply.get("error")
        if isinstance(error, dict):
            raise RemoteMcpError(
                f"the MCP server at {self._url} refused {method}: "
                f"{error.get('message')} ({error.get('code')})"
            )
        result = reply.get("result")
        if not isinstance(result, dict):
            raise RemoteMcpError(
                f"the MCP server at {self._url} answered {method} without a result"
            )
        return result

    def _notify(self, method: str) -> None:
        body = {"jsonrpc": "2.0", "method": method}
        self._http.post(self._url, json=body, headers=self._headers)


def _reply(answer: httpx.Response, message_id: int) -> dict[str, Any] | None:
    """The response to ``message_id`` in ``answer``: its JSON body, or the message of its
    event stream that answers it (requests the server sends meanwhile, an elicitation
    for one, are left unanswered: the task waits for its own service's people)."""
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        for line in answer.iter_lines():
            if not line.startswith("data:"):
                continue
            message = _json(line.removeprefix("data:").strip())
            if message.get("id") == message_id and "method" not in message:
                return message
        return None
    return _json(answer.read().decode("utf-8", "replace"))


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise RemoteMcpError(
            f"an MCP server answered something that is not JSON: {text[:200]!r}"
        ) from None
    if not isinstance(value, dict):
        raise RemoteMcpError("an MCP server answered a JSON value that is no message")
    return value


def _parsed(model: type[_R], result: dict[str, Any]) -> _R:
    try:
        return model.model_validate(result, by_name=False)
    except ValidationError as exc:
        raise RemoteMcpError(f"an MCP server answered with no {model.__name__}: {exc}") from None
