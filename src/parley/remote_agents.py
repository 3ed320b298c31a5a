"""Remote agents (docs/sub-agents.md#8-remote-agents): an agent another service runs,
reached over A2A or MCP, as the model of its calls' child turns.

A remote agent's call is a child turn like any agent's: the parent's step is held
holding nothing, and the child's session and turn are stored in the transaction that
holds it, before anything is sent.  The child turn's one model call sends the task to
the remote service with ids taken from that stored turn (``contextId`` = the child's
session id, ``messageId`` = the child's turn id), so a resend after a crash (a takeover
of the child's run) is the same message to the remote side, which answers with the task
it already made rather than a second one (parley's gateway does: a message id names
its turn).  The child then looks at the remote task: until it ends, the model call raises
:class:`ModelPending`, so the child's run lets go of its worker and is claimed again (by
any worker) for the next look; its reply is the task's artifact text.  An interrupt of
the child (the parent's cancel reaches its children) cancels the remote task: during a
look at once, between looks through :meth:`RemoteAgentModel.abandon`.  Over MCP
(``remote_mcp.py``) the same holds with the child turn's id as the call's idempotency
key, since an MCP task's id is the server's to make.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from a2a.client.client import Client, ClientConfig
from a2a.client.client_factory import ClientFactory
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2AError

from parley.errors import InvalidRequest, ParleyError
from parley.ports.host import DeltaSink, ModelPending, ModelReply, ModelRequest, StreamAborted
from parley.remote_mcp import McpRemote, RemoteMcpError
from parley.schemas.messages import UserMessage

__all__ = ["PROTOCOLS", "RemoteAgentError", "RemoteAgentModel"]

PROTOCOLS = ("a2a", "mcp")
"""The protocols a remote agent is reached over."""

Protocol = Literal["a2a", "mcp"]

_TERMINAL = {
    pb.TASK_STATE_COMPLETED,
    pb.TASK_STATE_FAILED,
    pb.TASK_STATE_CANCELED,
    pb.TASK_STATE_REJECTED,
}


class RemoteAgentError(ParleyError):
    """The remote service ended the task without an answer (failed, cancelled,
    rejected) or could not be reached: the child turn fails with this message, which its
    parent's model hears as the call's result."""


@dataclass(frozen=True)
class RemoteAgentModel:
    """The model of a remote agent's child turns: sends the turn's task to the A2A agent
    at ``url`` (its card read from ``/.well-known/agent-card.json``), or to the tool
    ``tool`` (default ``ask``) of the MCP server whose endpoint is ``url``, with
    ``headers`` (its credentials), polls the task every ``poll_seconds`` until it ends,
    and answers with its reply."""

    url: str
    protocol: Protocol = "a2a"
    headers: Mapping[str, str] = field(default_factory=dict)
    tool: str | None = None
    """The MCP tool given the task (None: ``ask``); an A2A agent takes none."""
    poll_seconds: float = 2.0
    """Between two looks at the remote task (each one claim of the child's run, and one
    ``throttled`` event in its stream)."""
    timeout_seconds: float = 60.0
    """Of each HTTP request (the task itself may run for as long as it runs)."""

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise InvalidRequest(f"a remote agent's url must be an http(s) URL, not {self.url!r}")
        if self.protocol not in PROTOCOLS:
            raise InvalidRequest(
                f"a remote agent's protocol must be one of {list(PROTOCOLS)}, not {self.protocol!r}"
            )
        if not isinstance(self.headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()
        ):
            raise InvalidRequest("a remote agent's headers must map text to text")
        if not self.poll_seconds > 0:
            raise InvalidRequest("a remote agent's poll_seconds must be positive")
        if self.tool is not None and (
            self.protocol != "mcp" or not isinstance(self.tool, str) or not self.tool
        ):
            raise InvalidRequest("a remote agent's tool names an MCP tool (protocol 'mcp' only)")

    @property
    def name(self) -> str:
        return f"{self.protocol}:{self.url}"

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        """Send the child turn's task (once, whatever the number of attempts) and look at
        the remote task: its answer if it ended, else :class:`ModelPending`: the child
        lets go of its worker and looks again in ``poll_seconds`` (each look a call of
        this, on any worker, the send recognised as the same)."""
        context = request.context
        if context is None:
            raise InvalidRequest("a remote agent runs only as a child turn (no turn context)")
        task = _task_text(request)
        if self.protocol == "mcp":
            return ModelReply(text=self._ask_mcp(task, context.turn_id, on_delta), model=self.name)
        reply = asyncio.run(
            self._ask(task, session_id=context.session_id, turn_id=context.turn_id, sink=on_delta)
        )
        return ModelReply(text=reply, model=self.name)

    def _ask_mcp(self, task: str, turn_id: str, sink: DeltaSink) -> str:
        """The MCP tool's answer, the child turn's id its call's idempotency key."""
        try:
            return self._mcp().ask(task, key=turn_id, sink=sink)
        except (RemoteMcpError, httpx.HTTPError, OSError) as exc:
            raise RemoteAgentError(f"the remote agent at {self.url} failed: {exc}") from exc

    def _mcp(self) -> McpRemote:
        return McpRemote(
            url=self.url,
            tool=self.tool or "ask",
            headers=self.headers,
            poll_seconds=self.poll_seconds,
            timeout_seconds=self.timeout_seconds,
        )

    async def _ask(self, task: str, *, session_id: str, turn_id: str, sink: DeltaSink) -> str:
        http = httpx.AsyncClient(headers=dict(self.headers), timeout=self.timeout_seconds)
        config = ClientConfig(httpx_client=http, streaming=False)
        try:
            client = await ClientFactory(config).create_from_url(self.url)
            try:
                remote_id = await _send(client, task, session_id=session_id, turn_id=turn_id)
                return await self._follow(client, remote_id, sink)
            finally:
                await client.close()
        except (A2AError, httpx.HTTPError, OSError) as exc:
            raise RemoteAgentError(f"the remote agent at {self.url} failed: {exc}") from exc
        finally:
            await http.aclose()

    async def _follow(self, client: Client, task_id: str, sink: DeltaSink) -> str:
        """The task's answer if it ended; else :class:`ModelPending`, so that the child
        lets go of its worker until the next look (a task waiting for input, an approval
        on the remote side, is waited for like one that works: nobody here can answer
        it, its own service's people may)."""
        task = await client.get_task(pb.GetTaskRequest(id=task_id))
        try:
            sink.raise_if_interrupted()
        except StreamAborted:
            await client.cancel_task(pb.CancelTaskRequest(id=task_id))
            raise
        state = task.status.state
        if state == pb.TASK_STATE_COMPLETED:
            text = _artifact_text(task)
            sink(text)
            return text
        if state in _TERMINAL:
            raise RemoteAgentError(
                f"the remote task {task_id} ended {pb.TaskState.Name(state)}"
                + (
                    f": {_message_text(task.status.message)}"
                    if task.status.HasField("message")
                    else ""
                )
            )
        raise ModelPending(
            f"the remote task {task_id} is {pb.TaskState.Name(state)}", seconds=self.poll_seconds
        )

    def abandon(self, request: ModelRequest) -> None:
        """Cancel the remote task of a child interrupted while it waited between looks:
        the same request again names the task it made (it is idempotent)."""
        context = request.context
        if context is None:
            return
        task = _task_text(request)
        if self.protocol == "mcp":
            self._mcp().abandon(task, key=context.turn_id)
            return
        asyncio.run(self._cancel_a2a(task, session_id=context.session_id, turn_id=context.turn_id))

    async def _cancel_a2a(self, task: str, *, session_id: str, turn_id: str) -> None:
        http = httpx.AsyncClient(headers=dict(self.headers), timeout=self.timeout_seconds)
        try:
            # Not streaming: a streamed send would follow the task to its end.
            config = ClientConfig(httpx_client=http, streaming=False)
            client = await ClientFactory(config).create_from_url(self.url)
            try:
                remote_id = await _send(client, task, session_id=session_id, turn_id=turn_id)
                await client.cancel_task(pb.CancelTaskRequest(id=remote_id))
            finally:
                await client.close()
        finally:
            await http.aclose()


async def _send(client: Client, task: str, *, session_id: str, turn_id: str) -> str:
    """The remote task of the child turn ``turn_id``: sent with ids of the stored turn,
    so a resend is recognised as the same message."""
    message = pb.Message(
        message_id=turn_id,
        context_id=session_id,
        role=pb.ROLE_USER,
        parts=[pb.Part(text=task)],
    )
    request = pb.SendMessageRequest(
        message=message, configuration=pb.SendMessageConfiguration(return_immediately=True)
    )
    answers = [answer async for answer in client.send_message(request)]
    for answer in answers:
        if answer.HasField("task"):
            return str(answer.task.id)
    raise RemoteAgentError("the remote agent answered without a task")


def _task_text(request: ModelRequest) -> str:
    """The child turn's task: its prompt, the first user message."""
    for message in request.messages:
        if isinstance(message, UserMessage):
            return message.text
    raise InvalidRequest("a remote agent's turn has no task")


def _artifact_text(task: Any) -> str:
    return "".join(part.text for artifact in task.artifacts for part in artifact.parts)


def _message_text(message: Any) -> str:
    return "".join(part.text for part in message.parts)
