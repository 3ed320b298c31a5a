"""The gateway's MCP server (docs/protocols.md#4-mcp): ``POST /mcp`` speaks MCP 2025-11-25
over Streamable HTTP, behind the gateway's bearer tokens and tenants.

Its tool ``ask`` runs a turn of the tenant's (in a new session, or in ``session_id``'s),
and each agent the host declares is a tool of the same shape whose turns run as that
agent.  A call with an idempotency key (``_meta["parley/request-key"]``) sent again
answers the turn (the task) the first one made.
A plain call answers as a stream that ends with the turn's reply; a call that asks for a
task (``params.task``) is answered at once with the task, whose id is the turn id, and
``tasks/get``, ``tasks/result``, ``tasks/cancel`` and ``tasks/list`` follow it.  While a
tool call of the turn waits for a person, the task is ``input_required`` and the stream
(the call's, or ``tasks/result``'s) carries an ``elicitation/create`` request for each
waiting call; the client's answer arrives as a POST of its own and is applied on
whichever gateway process receives it.  Text the model streams goes out as progress
notifications when the request carries a ``progressToken``.

The server is stateless (no ``Mcp-Session-Id``): everything a request needs is in the
store, so every gateway process answers every request, and a task outlives the process
that created it.  Messages are JSON-RPC 2.0; a refusal is a JSON-RPC error and changes
nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as mt
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sse_starlette import ServerSentEvent
from starlette.responses import Response

from parley import errors
from parley.client import Client
from parley.gateway import mcp_extension as extension
from parley.gateway import mcp_tasks as tasks
from parley.gateway.dependencies import ClientDep, StreamsDep, Tenant, TurnStreams
from parley.gateway.event_streams import event_stream
from parley.gateway.feeds import FellBehind
from parley.gateway.work import light
from parley.schemas.events import Event, EventKind
from parley.schemas.records import TurnRecord

log = logging.getLogger("parley.gateway.mcp")

PROTOCOL_VERSION = "2025-11-25"
"""The version this server speaks (the one whose core has tasks)."""
PATH = "/mcp"
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
MISSING_CAPABILITY = -32021
CANCEL_WAIT_SECONDS = 10.0
"""How long ``tasks/cancel`` waits for the turn to stop before answering its task (it
stops at its next step boundary, at once while the model streams or a call waits)."""
STREAMED = frozenset({"tools/call", "tasks/result"})
TASK_METHODS = frozenset({"tasks/get", "tasks/cancel", "tasks/update"})
STATUS_EVENTS = frozenset({EventKind.APPROVAL_REQUESTED, EventKind.APPROVAL_ANSWERED})
"""The events after which a task's status may have changed while it runs."""

router = APIRouter(tags=["mcp"])


class _Refused(Exception):
    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.data = data


@router.post(PATH, response_model=None, include_in_schema=False)
async def post(request: Request, client: ClientDep, streams: StreamsDep, owner: Tenant) -> Response:
    """One JSON-RPC message from an MCP client: a request (answered as JSON, or as a
    stream for a call that runs a turn), or a notification or response (202)."""
    message = _message(await request.body())
    if isinstance(message, Response):
        return message
    method, message_id = message.get("method"), message.get("id")
    if method is None:
        # A client's response: to an elicitation this server sent (or anything else).
        if isinstance(message_id, str) and message_id.startswith(tasks.ELICITATION_PREFIX):
            await light(tasks.answer_elicitation, client, owner, message_id, message)
        return Response(status_code=202)
    if "id" not in message:
        return Response(status_code=202)  # a notification: nothing to do for any
    params = message.get("params") or {}
    if not isinstance(method, str) or not isinstance(params, dict):
        return _error(message_id, INVALID_REQUEST, "Invalid Request: method or params")
    try:
        if method in STREAMED:
            return await _streamed(client, streams, owner, method, message_id, params)
        result = await _answer(client, streams, owner, method, params)
    except _Refused as exc:
        return _error(message_id, exc.code, str(exc), data=exc.data)
    except tasks.McpInvalid as exc:
        return _error(message_id, INVALID_PARAMS, str(exc))
    return _result(message_id, result)


def _message(body: bytes) -> dict[str, Any] | Response:
    """The body's JSON-RPC message, or the refusal of a body that is none (one message
    per POST: batches left the protocol in 2025-06-18)."""
    try:
        message = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return _error(None, PARSE_ERROR, "Parse error: the body is not JSON", status=400)
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return _error(None, INVALID_REQUEST, "Invalid Request: one JSON-RPC 2.0 object", 400)
    return message


@router.get(PATH, include_in_schema=False)
async def get(_owner: Tenant) -> Response:
    """No stream the server opens on its own: everything goes out on a request's."""
    return Response(status_code=405, headers={"Allow": "POST"})


@router.delete(PATH, include_in_schema=False)
async def delete(_owner: Tenant) -> Response:
    """No session to end (the server keeps none)."""
    return Response(status_code=405, headers={"Allow": "POST"})


async def _answer(
    client: Client, streams: TurnStreams, owner: str, method: str, params: dict[str, Any]
) -> BaseModel | dict[str, Any]:
    """The result of a request answered as JSON."""
    if method == "initialize":
        return _initialized(params)
    if method == "ping":
        return {}
    if method == "tools/list":
        agents = await light(tasks.declared_agents, client, streams.settings.agents_host)
        return mt.ListToolsResult(tools=tasks.tools(agents))
    if method == "tasks/list":
        return await light(tasks.tasks_page, client, owner, params.get("cursor"))
    if method in TASK_METHODS:
        if method == "tasks/update" and not extension.declared(params):
            # Only the extension has tasks/update, and it asks for this refusal.
            raise _Refused(
                MISSING_CAPABILITY,
                "Missing required client capability",
                {"requiredCapabilities": {"extensions": {extension.EXTENSION: {}}}},
            )
        turn = await light(tasks.owned_task, client, params.get("taskId"), owner)
        if extension.declared(params):
            return await _extension(client, method, turn, params)
        if method == "tasks/get":
            return await light(tasks.task_of, client, turn)
        return await _cancel(client, streams, turn)
    raise _Refused(METHOD_NOT_FOUND, f"Method not found: {method}")


async def _extension(
    client: Client, method: str, turn: TurnRecord, params: dict[str, Any]
) -> dict[str, Any]:
    """A tasks method in the 2026-07-28 extension's form (``mcp_extension.py``)."""
    if method == "tasks/get":
        return await light(extension.detailed, client, turn)
    if method == "tasks/update":
        return await light(extension.update, client, turn, params.get("inputResponses"))
    return await light(extension.cancel, client, turn)


def _initialized(params: dict[str, Any]) -> mt.InitializeResult:
    asked = params.get("protocolVersion")
    handshake = ("2025-03-26", "2025-06-18", PROTOCOL_VERSION)
    version = asked if asked in handshake else PROTOCOL_VERSION
    return mt.InitializeResult(
        protocol_version=version,
        capabilities=mt.ServerCapabilities(
            tools=mt.ToolsCapability(list_changed=False),
            tasks=mt.ServerTasksCapability.model_validate(
                {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
            ),
        ),
        server_info=mt.Implementation(name="parley", version="1"),
        instructions="Ask parley's agent with the tool 'ask'; long calls may run as tasks.",
    )


async def _cancel(client: Client, streams: TurnStreams, turn: TurnRecord) -> mt.Task:
    """Interrupt the turn, wait a little for it to stop, and answer its task."""
    try:
        await light(lambda: client.attach(turn.turn_id).interrupt())
    except errors.TurnEnded:
        status = (await light(tasks.task_of, client, turn)).status
        raise tasks.McpInvalid(f"Cannot cancel task: already in terminal status {status}") from None
    try:
        async with asyncio.timeout(CANCEL_WAIT_SECONDS):
            async for _ in streams.feeds.subscribe(turn.turn_id, 0):
                pass
    except (TimeoutError, FellBehind):
        pass
    return await light(tasks.task_of, client, turn)


async def _streamed(
    client: Client,
    streams: TurnStreams,
    owner: str,
    method: str,
    message_id: Any,
    params: dict[str, Any],
) -> Response:
    """``tools/call`` (its task at once if it asks for one, else a stream that ends with
    the turn's result) or ``tasks/result`` (a stream that ends with it)."""
    if method == "tools/call":
        name, arguments = params.get("name"), params.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, dict | None):
            raise tasks.McpInvalid("tools/call needs a tool name and an arguments object")
        if not isinstance(params.get("task"), dict | None):
            # (Refused before the turn is queued: a refusal changes nothing.)
            raise tasks.McpInvalid("params.task must be an object (the task's metadata)")
        agents = await light(tasks.declared_agents, client, streams.settings.agents_host)
        key = tasks.request_key_of(params)
        where = streams.settings.workspaces
        handle = await light(
            lambda: tasks.start_call(
                client, where, owner, name, arguments, request_key=key, agents=agents
            )
        )
        if extension.declared(params):
            turn = await light(handle.record)
            return _result(message_id, await light(extension.created, client, turn))
        if params.get("task") is not None:
            turn = await light(handle.record)
            task = await light(tasks.task_of, client, turn)
            return _result(message_id, mt.CreateTaskResult(task=task))
        turn_id, related = handle.turn_id, False
    else:
        turn = await light(tasks.owned_task, client, params.get("taskId"), owner)
        turn_id, related = turn.turn_id, True
    token = (params.get("_meta") or {}).get("progressToken")
    frames = _until_end(client, streams, turn_id, message_id, token, related=related)
    return event_stream(frames, streams.settings)


async def _until_end(
    client: Client,
    streams: TurnStreams,
    turn_id: str,
    message_id: Any,
    token: object,
    *,
    related: bool,
) -> AsyncIterator[ServerSentEvent]:
    """The turn's stream: progress with its text (if ``token``), an elicitation for each
    call that waits for a person, then the response with its result.  A ``tasks/result``
    stream (``related``) also says each change of the task's status as
    ``notifications/tasks/status``: ``input_required`` when a call asks a person,
    ``working`` once answered, and the status it ended with, just before the result."""
    said = _Said(client, turn_id, token, related=related)
    try:
        async for event in streams.feeds.subscribe(turn_id, 0):
            for message in await said.after(event):
                yield _frame(message)
    except FellBehind:
        # A turn longer than a feed lets one reader lag behind: wait on the store.
        while not (await light(client.run_state, turn_id)).status.terminal:
            await asyncio.sleep(0.5)
    result = await light(tasks.tool_result, client, turn_id)
    if related:
        for message in await said.status():
            yield _frame(message)
    else:
        result.meta = None
    yield _frame({"jsonrpc": "2.0", "id": message_id, "result": _wire(result)})


class _Said:
    """What a turn's stream has said so far: the progress's characters, the
    elicitations sent, the task status last said."""

    def __init__(self, client: Client, turn_id: str, token: object, *, related: bool) -> None:
        self._client, self._turn_id, self._token, self._related = client, turn_id, token, related
        self._asked: set[str] = set()
        self._sent = 0
        self._status: str | None = None

    async def after(self, event: Event) -> list[dict[str, Any]]:
        """The messages ``event`` makes the stream send."""
        messages: list[dict[str, Any]] = []
        if event.kind is EventKind.TOKEN and self._token is not None:
            text = str(event.data.get("text", ""))
            self._sent += len(text)
            messages.append(_progress(self._token, self._sent, text))
        elif event.kind is EventKind.APPROVAL_REQUESTED:
            for approval in await light(tasks.pending, self._client, self._turn_id):
                key = tasks.elicitation_id(approval)
                if key not in self._asked:
                    self._asked.add(key)
                    messages.append(_elicitation(key, tasks.elicitation_params(approval)))
        if self._related and event.kind in STATUS_EVENTS:
            messages += await self.status()
        return messages

    async def status(self) -> list[dict[str, Any]]:
        """The task's ``notifications/tasks/status`` as the store has it now, unless its
        status is the one last said."""
        turn = await light(self._client.turn_record, self._turn_id)
        task = await light(tasks.task_of, self._client, turn)
        if task.status == self._status:
            return []
        self._status = task.status
        return [{"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": _wire(task)}]


def _progress(token: object, progress: int, text: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": token, "progress": progress, "message": text},
    }


def _elicitation(key: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": key, "method": "elicitation/create", "params": params}


def _frame(message: dict[str, Any]) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(message, separators=(",", ":")), event="message")


def _wire(result: BaseModel | dict[str, Any]) -> dict[str, Any]:
    """The result's JSON, without the fields it leaves unset, but with every task's
    ``ttl`` (required, null for no limit)."""
    if isinstance(result, dict):
        return result
    wire = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    inner = wire.get("task")
    for task in [wire, *([inner] if isinstance(inner, dict) else []), *wire.get("tasks", [])]:
        if "taskId" in task:
            task.setdefault("ttl", None)
    return wire


def _result(message_id: Any, result: BaseModel | dict[str, Any]) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": message_id, "result": _wire(result)})


def _error(
    message_id: Any, code: int, message: str, status: int = 200, data: Any = None
) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return JSONResponse({"jsonrpc": "2.0", "id": message_id, "error": error}, status_code=status)


__all__ = ["PATH", "PROTOCOL_VERSION", "router"]
