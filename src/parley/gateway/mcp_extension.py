"""The ``io.modelcontextprotocol/tasks`` extension of MCP 2026-07-28 on the gateway's MCP
server (docs/protocols.md#4-mcp), beside the 2025-11-25 tasks of ``mcp_tasks.py``.

A request speaks the extension when its per-request client capabilities
(``_meta["io.modelcontextprotocol/clientCapabilities"].extensions``) name it: then a
``tools/call`` is answered with a task at once (``resultType: "task"``, the task's
fields flat), ``tasks/get`` answers the detailed task (its ``result`` once completed,
its ``inputRequests`` while a call waits for a person: one ``elicitation/create`` per
waiting call, keyed by the approval id, unique for the task's life), ``tasks/update``
takes the answers (``inputResponses``, each an ``ElicitResult``), and ``tasks/cancel``
is an acknowledgement.  The form is chosen per request, not per task: a task made in one
form is read in either.

Every function here blocks on the store: call them from a thread (``work.light``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from parley import errors
from parley.client import Client
from parley.gateway import mcp_tasks as tasks
from parley.schemas.records import TurnRecord

EXTENSION = "io.modelcontextprotocol/tasks"
CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"


def declared(params: dict[str, Any]) -> bool:
    """Whether the request's per-request capabilities name the extension."""
    meta = params.get("_meta")
    capabilities = meta.get(CAPABILITIES) if isinstance(meta, dict) else None
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and EXTENSION in extensions


def flat_task(client: Client, turn: TurnRecord) -> dict[str, Any]:
    """The task in the extension's shape: ``ttlMs`` and ``pollIntervalMs``, and a turn
    that failed ``completed`` with its error result (the extension's ``failed`` is for
    JSON-RPC errors only, and a tool result with ``isError`` is ``completed``)."""
    task = tasks.task_of(client, turn)
    wire: dict[str, Any] = {
        "taskId": task.task_id,
        "status": "completed" if task.status == "failed" else task.status,
        "createdAt": task.created_at,
        "lastUpdatedAt": task.last_updated_at,
        "ttlMs": None,
        "pollIntervalMs": task.poll_interval,
    }
    if task.status_message is not None:
        wire["statusMessage"] = task.status_message
    return wire


def created(client: Client, turn: TurnRecord) -> dict[str, Any]:
    """The ``CreateTaskResult`` a ``tools/call`` answers."""
    return {"resultType": "task", **flat_task(client, turn)}


def detailed(client: Client, turn: TurnRecord) -> dict[str, Any]:
    """The ``GetTaskResult``: the task with what its status carries."""
    wire = {"resultType": "complete", **flat_task(client, turn)}
    if wire["status"] == "completed":
        result = tasks.tool_result(client, turn.turn_id)
        wire["result"] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    elif wire["status"] == "input_required":
        wire["inputRequests"] = {
            approval.approval_id: {
                "method": "elicitation/create",
                "params": tasks.elicitation_params(approval),
            }
            for approval in tasks.pending(client, turn.turn_id)
        }
    return wire


def update(client: Client, turn: TurnRecord, responses: object) -> dict[str, Any]:
    """Take ``inputResponses``: each key a waiting call's approval id, its value the
    ``ElicitResult``; keys not outstanding (unknown, answered already) are ignored, as
    the extension says."""
    if not isinstance(responses, dict):
        raise tasks.McpInvalid("inputResponses must be an object")
    waiting = {a.approval_id for a in tasks.pending(client, turn.turn_id)}
    for key, response in responses.items():
        if key in waiting:
            tasks.apply_answer(client, turn.turn_id, key, response)
    return {"resultType": "complete"}


def cancel(client: Client, turn: TurnRecord) -> dict[str, Any]:
    """Interrupt the turn (cooperative: an ended one is acknowledged as it is)."""
    run = client.run_state(turn.turn_id)
    if not run.status.terminal:
        # An end meanwhile is acknowledged all the same.
        with contextlib.suppress(errors.TurnEnded):
            client.attach(turn.turn_id).interrupt()
    return {"resultType": "complete"}


__all__ = ["EXTENSION", "cancel", "created", "declared", "detailed", "flat_task", "update"]
