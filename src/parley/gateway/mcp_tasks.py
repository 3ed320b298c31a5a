"""What the gateway's MCP server (``routers/mcp.py``, docs/protocols.md#4-mcp) says about
turns: its tools, a turn as an MCP task, a turn's end as a tool result, a pending
approval as an elicitation, and an elicitation's answer as the approval's.

A task *is* a turn: its ``taskId`` is the turn id, so any gateway process answers for
it from the store, and nothing is kept beside the turn.  An elicitation request's
JSON-RPC id names the turn and the approval it asks about (:func:`elicitation_id`), so
the client's answer, which arrives as a POST of its own and may reach another gateway
process, is applied from that id alone.

Every function here blocks on the store: call them from a thread (``work.light``).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import mcp_types as mt

from parley import errors
from parley.client import Client
from parley.gateway import threads
from parley.gateway.declared_agents import ASK, declared_agents
from parley.gateway.tenants import owned_session, owned_turn
from parley.remote_mcp import REQUEST_KEY
from parley.schemas.records import Approval, TurnRecord, TurnStatus, Waiting
from parley.session import Session
from parley.store.ids import new_id, storable
from parley.turn_handle import TurnHandle
from parley.validation import MAX_PROMPT_BYTES, check_text
from parley.workspaces import workspace_root

POLL_INTERVAL_MS = 1000
"""The polling interval a task suggests (a client may instead wait on tasks/result)."""
ELICITATION_PREFIX = "parley-approval:"
RELATED_TASK = "io.modelcontextprotocol/related-task"
LIST_SESSIONS = 20
"""How many of the tenant's sessions one page of ``tasks/list`` covers."""

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {"type": "string", "description": "What to ask the agent (the turn's prompt)"},
        "session_id": {
            "type": "string",
            "description": "Continue this session (from an earlier call's structuredContent); "
            "without it, a new session",
        },
    },
    "required": ["task"],
    "additionalProperties": False,
}
OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"session_id": {"type": "string"}, "turn_id": {"type": "string"}},
    "required": ["session_id", "turn_id"],
}
DECISION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decision": {"type": "string", "enum": ["approve", "deny"], "title": "Decision"},
        "reason": {"type": "string", "title": "Reason"},
    },
    "required": ["decision"],
}


class McpInvalid(Exception):
    """A request this server refuses with JSON-RPC's -32602 (invalid params), changing
    nothing: an unknown tool, bad arguments, an unknown (or another tenant's) task."""


def tools(agents: dict[str, str]) -> list[mt.Tool]:
    """The tools: ``ask``, the host's agent, and one per declared agent (``agents``:
    name → description), each taking a task (and a session to continue)."""
    ask = mt.Tool(
        name=ASK,
        title="Ask the agent",
        description="Give the agent a task; its reply is the result. Continue a "
        "conversation with the session_id of an earlier result.",
        input_schema=INPUT_SCHEMA,
        output_schema=OUTPUT_SCHEMA,
        execution=mt.ToolExecution(task_support="optional"),
    )
    return [ask] + [
        mt.Tool(
            name=name,
            title=f"Ask the agent {name}",
            description=description,
            input_schema=INPUT_SCHEMA,
            output_schema=OUTPUT_SCHEMA,
            execution=mt.ToolExecution(task_support="optional"),
        )
        for name, description in agents.items()
    ]


def start_call(
    client: Client,
    workspaces: Path,
    owner: str,
    name: str,
    arguments: dict[str, Any] | None,
    *,
    request_key: object = None,
    agents: dict[str, str] | None = None,
) -> TurnHandle:
    """Queue the turn a ``tools/call`` asks for (every check made before any write): a
    turn of the host's agent for ``ask``, else of the declared agent ``name`` (its
    session's turns run as that agent, as a child turn of it would).

    ``request_key`` (``_meta`` :data:`REQUEST_KEY`) makes the call idempotent: the same
    key (with the same task) answers the turn the first call made, whatever gateway
    process receives it; without a ``session_id`` the key names the session too.  A
    remote parley agent sends its child turn's id as the key, so a resend after a crash
    is not a second task.  ``agents``: the declared agents offered as tools (else the
    client's host's)."""
    agents = declared_agents(client) if agents is None else agents
    if name != ASK and name not in agents:
        raise McpInvalid(f"Unknown tool: {name!r}")
    agent = None if name == ASK else name
    prompt, request_id = _checked_call(arguments or {}, request_key)
    session_id = (arguments or {}).get("session_id")
    if session_id is not None:
        if not isinstance(session_id, str):
            raise McpInvalid("session_id must be a string")
        try:
            session = owned_session(client, session_id, owner)
        except errors.SessionNotFound:
            raise McpInvalid(f"no session {session_id!r}") from None
        if session.parent_turn_id is not None:
            raise McpInvalid(f"session {session_id!r} is a sub-agent's, its parent turn's to run")
        if session.agent != agent:
            whose = f"the agent {session.agent!r}" if session.agent else "the tool 'ask'"
            raise McpInvalid(f"session {session_id!r} is a conversation of {whose}")
        return _submitted(client.session(session_id), prompt, request_id, request_key)
    if request_key is not None:
        # The key names the session: a resent call finds the one the first call made.
        external = f"mcp:{name}:{request_key}"
        try:
            thread = threads.open_thread(client, workspaces, owner, external, agent=agent)
        except errors.InvalidRequest as exc:
            raise McpInvalid(str(exc)) from None
        return _submitted(thread.session, prompt, request_id, request_key)
    new = new_id()
    root = workspace_root(workspaces, owner, new)
    return client.open_session(root, tenant=owner, session_id=new, agent=agent).submit(prompt)


def _submitted(
    session: Session, prompt: str, request_id: str | None, request_key: object
) -> TurnHandle:
    """The turn ``prompt`` makes in ``session`` (the one its key made already, if any)."""
    try:
        return session.submit(prompt, request_id=request_id)
    except errors.Conflict:
        if request_id is None:
            raise
        # The store keeps a request id to one prompt: the key named a call with another
        # task, and a second turn would continue that call's conversation.
        raise McpInvalid(
            f"_meta[{REQUEST_KEY!r}] {request_key!r} named a call with another task: a key "
            "names one call; use a new key for another"
        ) from None


def _checked_call(arguments: dict[str, Any], request_key: object) -> tuple[str, str | None]:
    """The call's prompt and the ``request_id`` its key gives the turn, checked.  The
    request id is the key alone, not the key and the task (as a protocol's message id
    is): the same key with another task is then refused by the store (:func:`_submitted`)
    instead of being a turn of its own."""
    extra = sorted(set(arguments) - {"task", "session_id"})
    if extra:
        raise McpInvalid(f"unknown arguments: {extra}")
    task = arguments.get("task")
    if not isinstance(task, str):
        raise McpInvalid("the argument 'task' is required: a string, the agent's task")
    try:
        prompt = check_text(task, "task", MAX_PROMPT_BYTES)
        if request_key is None:
            return prompt, None
        return prompt, f"mcp:{_checked_key(request_key)}"
    except errors.InvalidRequest as exc:
        raise McpInvalid(str(exc)) from None


def request_key_of(params: dict[str, Any]) -> object:
    """The call's idempotency key (``_meta`` :data:`REQUEST_KEY`), if it has one."""
    meta = params.get("_meta")
    return meta.get(REQUEST_KEY) if isinstance(meta, dict) else None


def _checked_key(key: object) -> str:
    if (
        not isinstance(key, str)
        or not key
        or len(key) > threads.MAX_EXTERNAL_ID - 64
        or not storable(key)
    ):
        raise errors.InvalidRequest(
            f"_meta[{REQUEST_KEY!r}] must be a non-empty string of at most "
            f"{threads.MAX_EXTERNAL_ID - 64} characters (UTF-8, no NUL)"
        )
    return key


def owned_task(client: Client, task_id: object, owner: str) -> TurnRecord:
    """The turn ``task_id`` names if ``owner``'s; any other is an unknown task."""
    if not isinstance(task_id, str):
        raise McpInvalid("taskId must be a string")
    try:
        return owned_turn(client, task_id, owner)
    except errors.TurnNotFound:
        raise McpInvalid(f"Failed to retrieve task: Task not found: {task_id!r}") from None


def task_of(client: Client, turn: TurnRecord) -> mt.Task:
    """The turn as an MCP task, as the store has it now."""
    run = client.run_state(turn.turn_id)
    status, message = _status(turn, run.status, run.error)
    updated = run.ended_at or turn.created_at
    task = mt.Task(
        task_id=turn.turn_id,
        status=status,
        created_at=_iso(turn.created_at),
        last_updated_at=_iso(max(updated, turn.created_at)),
        ttl=None,  # kept for as long as the store keeps the turn (docs/operations.md#retention)
        poll_interval=POLL_INTERVAL_MS,
    )
    if message is not None:
        task.status_message = message
    return task


def _status(turn: TurnRecord, status: TurnStatus, error: str | None) -> tuple[Any, str | None]:
    if status in (TurnStatus.SUCCEEDED, TurnStatus.FINISHED):
        return "completed", None
    if status is TurnStatus.CANCELLED:
        return "cancelled", "interrupted"
    if status.terminal:
        return "failed", error or str(status)
    if status is TurnStatus.WAITING and turn.waiting_for is Waiting.APPROVAL:
        return "input_required", "a tool call waits for a person's answer"
    return "working", None


def tool_result(client: Client, turn_id: str) -> mt.CallToolResult:
    """An ended turn's reply as the tool's result (an error result for a turn that
    failed, was cancelled or ran out of budget)."""
    turn = client.turn_record(turn_id)
    run = client.run_state(turn_id)
    structured = {"session_id": turn.session_id, "turn_id": turn_id}
    ok = run.status in (TurnStatus.SUCCEEDED, TurnStatus.FINISHED)
    text = (run.reply or "") if ok else f"{run.status}: {run.error or run.reply or ''}".strip()
    return mt.CallToolResult(
        content=[mt.TextContent(text=text)],
        structured_content=structured,
        is_error=not ok,
        _meta={RELATED_TASK: {"taskId": turn_id}},
    )


def tasks_page(client: Client, owner: str, cursor: object) -> mt.ListTasksResult:
    """One page of the tenant's tasks: every turn of its :data:`LIST_SESSIONS` newest
    sessions after ``cursor`` (a session id), newest session first."""
    if cursor is not None and not isinstance(cursor, str):
        raise McpInvalid("cursor must be a string")
    if cursor is not None:
        try:
            owned_session(client, cursor, owner)
        except errors.SessionNotFound:
            raise McpInvalid("Invalid cursor") from None
    sessions = client.session_records(
        tenant=owner, limit=LIST_SESSIONS, before=cursor, batch_sessions=False
    )
    tasks = [
        task_of(client, turn)
        for session in sessions
        for turn in reversed(client.tree_of(session.session_id))
    ]
    following = sessions[-1].session_id if len(sessions) == LIST_SESSIONS else None
    return mt.ListTasksResult(tasks=tasks, next_cursor=following)


def pending(client: Client, turn_id: str) -> list[Approval]:
    """The turn's calls that wait for an answer."""
    return [a for a in client.approvals_of(turn_id) if a.pending]


def elicitation_id(approval: Approval) -> str:
    """The JSON-RPC id of the elicitation that asks about ``approval``."""
    return f"{ELICITATION_PREFIX}{approval.turn_id}:{approval.approval_id}"


def elicitation_params(approval: Approval) -> dict[str, Any]:
    """The ``elicitation/create`` params that ask a person about ``approval`` (form mode:
    a decision, and a reason if they like), related to its task."""
    params = mt.ElicitRequestFormParams(
        message=f"The agent wants to call {approval.tool} with {approval.arguments}: "
        "approve or deny?",
        requested_schema=DECISION_SCHEMA,
    )
    wire = params.model_dump(by_alias=True, mode="json", exclude_none=True)
    wire["_meta"] = {RELATED_TASK: {"taskId": approval.turn_id}}
    return wire


def answer_elicitation(client: Client, owner: str, message_id: str, body: dict[str, Any]) -> None:
    """Apply a client's answer to an elicitation this server sent (a JSON-RPC response
    whose id :func:`elicitation_id` made).  An answer about another tenant's turn
    changes nothing."""
    turn_id, _, approval_id = message_id.removeprefix(ELICITATION_PREFIX).partition(":")
    try:
        owned_turn(client, turn_id, owner)
    except errors.TurnNotFound:
        return
    apply_answer(client, turn_id, approval_id, body.get("result"))


def apply_answer(client: Client, turn_id: str, approval_id: str, result: object) -> None:
    """Answer the call ``approval_id`` of the turn with an ``ElicitResult``: ``accept``
    with a decision answers it, ``decline`` denies it, ``cancel`` (or anything else)
    leaves it waiting; a call answered already (asked again on a second stream, or
    answered twice) or unknown changes nothing."""
    if not isinstance(result, dict):
        return
    action = result.get("action")
    content = result.get("content") if isinstance(result.get("content"), dict) else {}
    assert isinstance(content, dict)
    reason = content.get("reason") if isinstance(content.get("reason"), str) else None
    if action == "accept" and content.get("decision") in ("approve", "deny"):
        approve = content["decision"] == "approve"
    elif action == "decline":
        approve, reason = False, reason or "declined"
    else:
        return
    handle = client.attach(turn_id)
    try:
        if approve:
            handle.approve(approval_id, reason=reason)
        else:
            handle.deny(approval_id, reason=reason)
    except (errors.Conflict, errors.InvalidRequest, errors.TurnEnded):
        pass


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


__all__ = [
    "ASK",
    "REQUEST_KEY",
    "McpInvalid",
    "answer_elicitation",
    "apply_answer",
    "declared_agents",
    "elicitation_id",
    "elicitation_params",
    "owned_task",
    "pending",
    "request_key_of",
    "start_call",
    "task_of",
    "tasks_page",
    "tool_result",
    "tools",
]
