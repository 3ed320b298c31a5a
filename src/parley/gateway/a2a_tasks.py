"""What the gateway's A2A server (``a2a_handler.py``, docs/protocols.md#5-a2a) says about
turns: a turn as an A2A ``Task`` (its id the turn id, its ``contextId`` the session id,
its reply the artifact), a message as a new turn, a steer, or an answer to the calls a
turn waits on, and the Agent Card.

Every function here blocks on the store: call them from a thread (``work.light``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError

# protobuf ships no type stubs (and types-protobuf is not installed: tests/support/otlp.py)
from google.protobuf import json_format  # type: ignore[import-untyped]

from parley import errors
from parley.client import Client
from parley.gateway import threads
from parley.gateway.tenants import owned_session, owned_turn
from parley.schemas.records import Approval, TurnRecord, TurnStatus, Waiting
from parley.session import Session
from parley.store.ids import new_id
from parley.turn_handle import TurnHandle
from parley.workspaces import workspace_root

REPLY = "reply"
"""The id and name of a task's one artifact: the turn's reply."""
PAGE_SESSIONS = 20
"""How many of the tenant's sessions one page of ``ListTasks`` covers."""

STATES = {
    TurnStatus.QUEUED: pb.TASK_STATE_SUBMITTED,
    TurnStatus.RUNNING: pb.TASK_STATE_WORKING,
    TurnStatus.WAITING: pb.TASK_STATE_WORKING,
    TurnStatus.SUCCEEDED: pb.TASK_STATE_COMPLETED,
    TurnStatus.FINISHED: pb.TASK_STATE_COMPLETED,
    TurnStatus.CANCELLED: pb.TASK_STATE_CANCELED,
    TurnStatus.FAILED: pb.TASK_STATE_FAILED,
    TurnStatus.CHECK_FAILED: pb.TASK_STATE_FAILED,
    TurnStatus.BUDGET_EXCEEDED: pb.TASK_STATE_FAILED,
}


@dataclass(frozen=True)
class Sent:
    """What a message did: the turn it concerns, and whether it made that turn."""

    turn_id: str
    created: bool


def owned(client: Client, task_id: str, owner: str) -> TurnRecord:
    """The turn ``task_id`` names if ``owner``'s; another tenant's is an unknown task."""
    try:
        return owned_turn(client, task_id, owner)
    except errors.TurnNotFound:
        raise TaskNotFoundError(message=f"no task {task_id!r}") from None


def state_of(turn: TurnRecord, status: TurnStatus) -> int:
    """The A2A state of a turn whose run has ``status``."""
    if status is TurnStatus.WAITING and turn.waiting_for is Waiting.APPROVAL:
        return pb.TASK_STATE_INPUT_REQUIRED
    return STATES[status]


def task_of(client: Client, turn_id: str) -> pb.Task:
    """The turn as an A2A task, as the store has it now: the prompt as the user's message,
    and once it ended, the reply as the artifact and the agent's message."""
    turn = client.turn_record(turn_id)
    run = client.run_state(turn_id)
    state = state_of(turn, run.status)
    task = pb.Task(id=turn_id, context_id=turn.session_id)
    task.history.append(_message(turn, pb.ROLE_USER, turn.prompt, "prompt"))
    task.status.state = state  # type: ignore[assignment]
    task.status.timestamp.FromDatetime(run.ended_at or turn.created_at)
    if state == pb.TASK_STATE_INPUT_REQUIRED:
        task.status.message.CopyFrom(asking(turn, pending(client, turn_id)))
    elif run.status.terminal:
        if run.reply:
            task.artifacts.append(reply_artifact(run.reply))
            task.history.append(_message(turn, pb.ROLE_AGENT, run.reply, "reply"))
        if state != pb.TASK_STATE_COMPLETED:
            text = f"{run.status}: {run.error}" if run.error else str(run.status)
            task.status.message.CopyFrom(_message(turn, pb.ROLE_AGENT, text, "status"))
    return task


def with_history(task: pb.Task, request: Any) -> pb.Task:
    """``task`` with at most the request's ``historyLength`` newest messages of its
    history (all of them if it gives none; 0: none)."""
    if request.HasField("history_length"):
        keep = max(request.history_length, 0)
        kept = list(task.history)[-keep:] if keep else []
        del task.history[:]
        task.history.extend(kept)
    return task


def reply_artifact(text: str) -> pb.Artifact:
    """The reply (or, while streaming, a chunk of it) as the task's artifact."""
    return pb.Artifact(artifact_id=REPLY, name=REPLY, parts=[pb.Part(text=text)])


def pending(client: Client, turn_id: str) -> list[Approval]:
    """The turn's calls that wait for an answer."""
    return [a for a in client.approvals_of(turn_id) if a.pending]


def asking(turn: TurnRecord, waiting: list[Approval]) -> pb.Message:
    """The agent's message of an ``INPUT_REQUIRED`` task: what each waiting call is, as
    text and as a data part, and how to answer."""
    calls: list[Any] = [
        {"approval_id": a.approval_id, "tool": a.tool, "arguments": a.arguments} for a in waiting
    ]
    names = ", ".join(a.tool for a in waiting)
    message = _message(
        turn,
        pb.ROLE_AGENT,
        f"Waiting for a person: approve or deny the call to {names}. Answer with a data "
        'part {"decision": "approve"|"deny", "reason"?, "approval_id"?}, or the text '
        "approve or deny when one call waits.",
        "asking",
    )
    data = pb.Part()
    data.data.struct_value.update({"pending_approvals": calls})
    message.parts.append(data)
    return message


def send(client: Client, workspaces: Path, owner: str, message: pb.Message) -> Sent:
    """Act on a message: with a ``taskId``, answer the calls that turn waits on (or steer
    it while it runs); else start a turn in ``contextId``'s session (a new one if the
    tenant has none of that id).  Every check is made before any write."""
    if message.task_id:
        turn = owned(client, message.task_id, owner)
        if message.context_id and message.context_id != turn.session_id:
            raise InvalidParamsError(message="the contextId is not the task's")
        _continue(client, turn, message)
        return Sent(turn.turn_id, created=False)
    text = _text(message)
    if not text:
        raise InvalidParamsError(message="a message that starts a task needs a text part")
    try:
        threads.check_prompt(text)
        request_id = (
            threads.message_request_id("a2a", message.message_id, text)
            if message.message_id
            else None
        )
    except errors.InvalidRequest as exc:
        raise InvalidParamsError(message=str(exc)) from None
    session = _session(client, workspaces, owner, message.context_id)
    handle: TurnHandle = session.submit(text, request_id=request_id)
    return Sent(handle.turn_id, created=True)


def _session(client: Client, workspaces: Path, owner: str, context_id: str) -> Session:
    """The session ``context_id`` names: the tenant's session of that id, or the one the
    id names as a thread (``threads.py``: made if need be); a new one without an id."""
    if not context_id:
        new = new_id()
        return client.open_session(
            workspace_root(workspaces, owner, new), tenant=owner, session_id=new
        )
    try:
        owned_session(client, context_id, owner)
    except errors.SessionNotFound:
        try:
            return threads.open_thread(client, workspaces, owner, context_id).session
        except errors.InvalidRequest as exc:
            raise InvalidParamsError(message=str(exc)) from None
    return client.session(context_id)


def _continue(client: Client, turn: TurnRecord, message: pb.Message) -> None:
    """A message on an existing task: answers to the calls it waits on, or a steer."""
    run = client.run_state(turn.turn_id)
    if run.status.terminal:
        raise InvalidParamsError(
            message=f"task {turn.turn_id!r} has ended ({run.status}): start a new one "
            "in its context"
        )
    waiting = pending(client, turn.turn_id)
    if not waiting:
        text = _text(message)
        if not text:
            raise InvalidParamsError(message="a message to a running task needs a text part")
        try:
            client.attach(turn.turn_id).say(text)
        except (errors.InvalidRequest, errors.TurnEnded) as exc:
            raise InvalidParamsError(message=str(exc)) from None
        return
    approval_id, approve, reason = _decision(message, waiting)
    handle = client.attach(turn.turn_id)
    try:
        if approve:
            handle.approve(approval_id, reason=reason)
        else:
            handle.deny(approval_id, reason=reason)
    except (errors.Conflict, errors.InvalidRequest, errors.TurnEnded) as exc:
        raise InvalidParamsError(message=str(exc)) from None


def _decision(message: pb.Message, waiting: list[Approval]) -> tuple[str, bool, str | None]:
    """The answer a message gives: a data part ``{"decision", "reason"?, "approval_id"?}``
    or the bare text ``approve``/``deny`` (naming the call only when one waits)."""
    for part in message.parts:
        if part.HasField("data"):
            data = json_format.MessageToDict(part.data)
            if isinstance(data, dict) and data.get("decision") in ("approve", "deny"):
                reason = data.get("reason")
                return (
                    _which(data.get("approval_id"), waiting),
                    data["decision"] == "approve",
                    reason if isinstance(reason, str) else None,
                )
    word = _text(message).strip().lower()
    if word in ("approve", "deny"):
        return _which(None, waiting), word == "approve", None
    raise InvalidParamsError(
        message='the task waits for a person: answer with a data part {"decision": '
        '"approve"|"deny", "reason"?, "approval_id"?} or the text approve or deny'
    )


def _which(approval_id: object, waiting: list[Approval]) -> str:
    ids = [a.approval_id for a in waiting]
    if approval_id is None:
        if len(ids) != 1:
            raise InvalidParamsError(message=f"{len(ids)} calls wait: name one (approval_id)")
        return ids[0]
    if approval_id not in ids:
        raise InvalidParamsError(message=f"no waiting call {approval_id!r} (waiting: {ids})")
    return str(approval_id)


def tasks_page(client: Client, owner: str, request: pb.ListTasksRequest) -> pb.ListTasksResponse:
    """The tenant's tasks: those of ``contextId``'s session, or every turn of its
    :data:`PAGE_SESSIONS` newest sessions after ``pageToken`` (a session id), newest
    first; ``status`` and ``statusTimestampAfter`` keep those in that state or changed
    since; artifacts only with ``includeArtifacts``, history as ``historyLength`` says."""
    if request.context_id:
        try:
            owned_session(client, request.context_id, owner)
        except errors.SessionNotFound:
            return pb.ListTasksResponse(page_size=0, total_size=0)
        sessions = [request.context_id]
        following = ""
    else:
        before = request.page_token or None
        if before is not None:
            try:
                owned_session(client, before, owner)
            except errors.SessionNotFound:
                raise InvalidParamsError(message="invalid pageToken") from None
        records = client.session_records(
            tenant=owner, limit=PAGE_SESSIONS, before=before, batch_sessions=False
        )
        sessions = [r.session_id for r in records]
        following = sessions[-1] if len(sessions) == PAGE_SESSIONS else ""
    tasks = [
        with_history(task_of(client, turn.turn_id), request)
        for session in sessions
        for turn in reversed(client.tree_of(session))
    ]
    if request.status:
        tasks = [t for t in tasks if t.status.state == request.status]
    if request.HasField("status_timestamp_after"):
        since = request.status_timestamp_after.ToDatetime()
        tasks = [t for t in tasks if t.status.timestamp.ToDatetime() >= since]
    if not request.include_artifacts:
        for task in tasks:
            del task.artifacts[:]
    return pb.ListTasksResponse(
        tasks=tasks, next_page_token=following, page_size=len(tasks), total_size=len(tasks)
    )


def agent_card(base_url: str, *, push: bool, agents: Mapping[str, str]) -> pb.AgentCard:
    """The Agent Card of the gateway at ``base_url``: the host's agent as the skill
    ``ask`` and each agent it declares (``agents``: name → description) as a skill of
    its own, both HTTP bindings, streaming, push notifications if ``push``, bearer
    tokens."""
    card = pb.AgentCard(
        name="parley",
        description="A parley agent: durable, streamable, steerable conversations. A task "
        "is a turn; its context is the session.",
        version="1",
        supported_interfaces=[
            pb.AgentInterface(
                url=f"{base_url}/a2a", protocol_binding="JSONRPC", protocol_version="1.0"
            ),
            pb.AgentInterface(url=base_url, protocol_binding="HTTP+JSON", protocol_version="1.0"),
        ],
        capabilities=pb.AgentCapabilities(streaming=True, push_notifications=push),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain"],
        skills=[
            pb.AgentSkill(
                id="ask",
                name="ask",
                description="Give the agent a task; its reply is the task's artifact.",
                tags=["agent"],
            ),
            *(
                pb.AgentSkill(
                    id=name,
                    name=name,
                    description=f"{description} (one of the agent's sub-agents: a task "
                    "that needs it is handed to it)",
                    tags=["agent", "sub-agent"],
                )
                for name, description in agents.items()
            ),
        ],
    )
    card.security_schemes["bearer"].http_auth_security_scheme.scheme = "bearer"
    card.security_requirements.add().schemes["bearer"].SetInParent()
    return card


def _text(message: pb.Message) -> str:
    return "".join(part.text for part in message.parts if part.HasField("text"))


def _message(turn: TurnRecord, role: int, text: str, what: str) -> pb.Message:
    return pb.Message(
        message_id=f"{turn.turn_id}:{what}",
        context_id=turn.session_id,
        task_id=turn.turn_id,
        role=role,  # type: ignore[arg-type]
        parts=[pb.Part(text=text)],
    )


__all__ = [
    "REPLY",
    "Sent",
    "agent_card",
    "asking",
    "owned",
    "pending",
    "reply_artifact",
    "send",
    "state_of",
    "task_of",
    "tasks_page",
    "with_history",
]
