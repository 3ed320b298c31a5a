"""The gateway's A2A v1.0 server (docs/protocols.md#5-a2a): ``a2a-sdk``'s JSON-RPC (at
``/a2a``, with the v0.3 method names too) and HTTP+JSON bindings (``/message:send``,
``/message:stream``, ``/tasks``, ``/tasks/{id}``, ``/tasks/{id}:cancel``,
``/tasks/{id}:subscribe``) over :class:`TurnRequests`, parley's own request handler, and
the Agent Card at ``/.well-known/agent-card.json``.

The SDK parses, validates and answers each binding; what a request does is here: a task
is a turn (``a2a_tasks.py``), read from the store and followed through the process's
shared feed, so any gateway process answers for any task.  The bearer token is checked
before the SDK sees the request (``authentication.py``) and its tenant reaches each
method in the call's context: another tenant's task is an unknown one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from urllib.parse import urlsplit

from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes.common import DefaultServerCallContextBuilder, ServerCallContextBuilder
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.routes.rest_routes import create_rest_routes
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    UnsupportedOperationError,
)
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from parley import errors
from parley.client import Client
from parley.gateway import a2a_tasks as tasks
from parley.gateway.authentication import tenant_of
from parley.gateway.declared_agents import declared_agents
from parley.gateway.feeds import Feeds, FellBehind
from parley.gateway.settings import GatewaySettings
from parley.gateway.work import light
from parley.schemas.events import EventKind
from parley.schemas.records import TurnStatus
from parley.store.outbox import PushConfig
from parley.webhooks import check_webhook_url

JSONRPC_PATH = "/a2a"
TENANT = "parley.tenant"
MAX_PUSH_TOKEN = 512
CANCEL_WAIT_SECONDS = 10.0
"""How long a cancel waits for the turn to stop before answering its task."""


class TenantContext(DefaultServerCallContextBuilder):
    """The SDK's call context, with the tenant of the request's bearer token."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[TENANT] = tenant_of(request.scope)
        # The SDK reads the A2A-Version header from here; the token stays out of it.
        context.state.get("headers", {}).pop("authorization", None)
        return context


def _tenant(context: ServerCallContext) -> str:
    tenant = context.state.get(TENANT)
    assert isinstance(tenant, str), "authentication.py lets no A2A request in without one"
    return tenant


class TurnRequests(RequestHandler):
    """Each A2A method on parley's turns (see the module docstring)."""

    def __init__(
        self, client: Client, feeds: Feeds, workspaces: Path, push_hosts: frozenset[str]
    ) -> None:
        self.client = client
        self.feeds = feeds
        self.workspaces = workspaces
        self.push_hosts = push_hosts

    async def on_get_task(self, params: pb.GetTaskRequest, context: ServerCallContext) -> pb.Task:
        await light(tasks.owned, self.client, params.id, _tenant(context))
        return tasks.with_history(await light(tasks.task_of, self.client, params.id), params)

    async def on_list_tasks(
        self, params: pb.ListTasksRequest, context: ServerCallContext
    ) -> pb.ListTasksResponse:
        return await light(tasks.tasks_page, self.client, _tenant(context), params)

    async def on_cancel_task(
        self, params: pb.CancelTaskRequest, context: ServerCallContext
    ) -> pb.Task:
        await light(tasks.owned, self.client, params.id, _tenant(context))
        try:
            await light(lambda: self.client.attach(params.id).interrupt())
        except errors.TurnEnded:
            raise TaskNotCancelableError(message=f"task {params.id!r} has ended") from None
        await self._until_stops(params.id, CANCEL_WAIT_SECONDS)
        return await light(tasks.task_of, self.client, params.id)

    async def on_message_send(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> pb.Task:
        sent = await self._send(params, context)
        if not params.configuration.return_immediately:
            await self._until_stops(sent.turn_id, None)
        task = await light(tasks.task_of, self.client, sent.turn_id)
        return tasks.with_history(task, params.configuration)

    async def on_message_send_stream(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        sent = await self._send(params, context)
        async for event in self._follow(sent.turn_id):
            yield event

    async def on_subscribe_to_task(
        self, params: pb.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        await light(tasks.owned, self.client, params.id, _tenant(context))
        run = await light(self.client.run_state, params.id)
        if run.status.terminal:
            raise UnsupportedOperationError(message=f"task {params.id!r} has ended")
        async for event in self._follow(params.id):
            yield event

    async def on_create_task_push_notification_config(
        self, params: pb.TaskPushNotificationConfig, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        await light(tasks.owned, self.client, params.task_id, _tenant(context))
        return await self._add_push(params.task_id, params)

    async def on_get_task_push_notification_config(
        self, params: pb.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        await light(tasks.owned, self.client, params.task_id, _tenant(context))
        configs = await light(self.client.store.push_configs, params.task_id)
        found = next((c for c in configs if c.config_id == params.id), None)
        if found is None:
            raise InvalidParamsError(message=f"no push configuration {params.id!r}")
        return _push_config(found)

    async def on_list_task_push_notification_configs(
        self, params: pb.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> pb.ListTaskPushNotificationConfigsResponse:
        await light(tasks.owned, self.client, params.task_id, _tenant(context))
        configs = await light(self.client.store.push_configs, params.task_id)
        return pb.ListTaskPushNotificationConfigsResponse(
            configs=[_push_config(c) for c in configs]
        )

    async def on_delete_task_push_notification_config(
        self, params: pb.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        await light(tasks.owned, self.client, params.task_id, _tenant(context))
        deleted = await light(self.client.store.delete_push_config, params.task_id, params.id)
        if not deleted:
            raise InvalidParamsError(message=f"no push configuration {params.id!r}")

    async def _add_push(
        self, task_id: str, params: pb.TaskPushNotificationConfig
    ) -> pb.TaskPushNotificationConfig:
        """Store a push configuration for the task (checked first: :meth:`_push_target`)."""
        url, token = self._push_target(params)
        config = await light(self.client.store.add_push_config, task_id, url, token)
        # An end already committed was posted to it just now, outside any drive: an
        # embedded client's deliverer is told (started if need be); a fleet's beat looks.
        await light(self.client.runtime.kicker.housekeeping_wanted)
        return _push_config(config)

    def _push_target(self, params: pb.TaskPushNotificationConfig) -> tuple[str, str | None]:
        """The configuration's URL and token, the URL's host one ``PARLEY_A2A_PUSH_HOSTS``
        names (none: no push at all); else the refusal."""
        if not self.push_hosts:
            raise PushNotificationNotSupportedError()
        try:
            url = check_webhook_url(params.url, "the push notification url")
        except errors.InvalidRequest as exc:
            raise InvalidParamsError(message=str(exc)) from None
        host = (urlsplit(url or "").hostname or "").lower()
        if url is None or host not in self.push_hosts:
            raise InvalidParamsError(
                message=f"push notifications may go to {sorted(self.push_hosts)} only "
                f"(PARLEY_A2A_PUSH_HOSTS), not {host!r}"
            )
        token = params.token or None
        if token is not None and (len(token) > MAX_PUSH_TOKEN or not token.isprintable()):
            raise InvalidParamsError(
                message=f"the token must be printable, {MAX_PUSH_TOKEN} characters at most"
            )
        return url, token

    async def on_get_extended_agent_card(
        self, params: pb.GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> pb.AgentCard:
        raise ExtendedAgentCardNotConfiguredError()

    async def _send(self, params: pb.SendMessageRequest, context: ServerCallContext) -> tasks.Sent:
        push = params.configuration.HasField("task_push_notification_config")
        if push:
            # Checked before the message acts: a refused configuration changes nothing.
            self._push_target(params.configuration.task_push_notification_config)
        owner = _tenant(context)
        sent = await light(tasks.send, self.client, self.workspaces, owner, params.message)
        if push:
            # Stored after the turn exists; an end before that is posted all the same
            # (OutboxStore.add_push_config).
            await self._add_push(sent.turn_id, params.configuration.task_push_notification_config)
        return sent

    async def _until_stops(self, turn_id: str, timeout: float | None) -> None:
        """Wait (at most ``timeout`` seconds, if given) until the turn has ended or waits
        for a person."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    # The seq first: whatever happens after the look, the wait sees.
                    seq = await light(self._seq, turn_id)
                    if await light(self._stopped, turn_id):
                        return
                    await self._next_change(turn_id, seq)
        except TimeoutError:
            pass

    def _stopped(self, turn_id: str) -> bool:
        turn = self.client.turn_record(turn_id)
        run = self.client.run_state(turn_id)
        state = tasks.state_of(turn, run.status)
        return run.status.terminal or state == pb.TASK_STATE_INPUT_REQUIRED

    async def _next_change(self, turn_id: str, after: int) -> None:
        """Until the turn's next ``end`` or approval request after ``after`` (or half a
        second, on a feed this reader fell behind)."""
        try:
            async for event in self.feeds.subscribe(turn_id, after):
                if event.kind in (EventKind.END, EventKind.APPROVAL_REQUESTED):
                    return
        except FellBehind:
            await asyncio.sleep(0.5)

    def _seq(self, turn_id: str) -> int:
        return self.client.stored_seq(turn_id)

    async def _follow(self, turn_id: str) -> AsyncGenerator[Event]:
        """The task's stream: the task as it is, the reply as an artifact streamed from
        the turn's start, and a status update when it waits for a person (the stream's
        end: the answer is a new message) or ends."""
        client = self.client
        task = await light(tasks.task_of, client, turn_id)
        del task.artifacts[:]
        yield task
        streamed = ""
        try:
            async for event in self.feeds.subscribe(turn_id, 0):
                if event.kind is EventKind.STARTED:
                    yield _status(task, pb.TASK_STATE_WORKING)
                elif event.kind is EventKind.TOKEN:
                    text = str(event.data.get("text", ""))
                    yield _chunk(task, text, append=bool(streamed))
                    streamed += text
                elif event.kind is EventKind.STEP_RESTARTED:
                    streamed = ""
                elif event.kind is EventKind.APPROVAL_REQUESTED:
                    asking = await light(self._asking, turn_id)
                    if asking is not None:
                        yield _status(task, pb.TASK_STATE_INPUT_REQUIRED, asking)
                        return
        except FellBehind:
            while not (await light(client.run_state, turn_id)).status.terminal:
                await asyncio.sleep(0.5)
        async for update in self._ending(task, streamed):
            yield update

    def _asking(self, turn_id: str) -> pb.Message | None:
        waiting = tasks.pending(self.client, turn_id)
        if not waiting:
            return None
        return tasks.asking(self.client.turn_record(turn_id), waiting)

    async def _ending(self, task: pb.Task, streamed: str) -> AsyncGenerator[Event]:
        """The whole reply, if the stream's chunks are not it (tokens a client missed, a
        step redone), and the final status."""
        final = await light(tasks.task_of, self.client, task.id)
        run = await light(self.client.run_state, task.id)
        if run.reply and run.reply != streamed:
            yield _chunk(task, run.reply, append=False)
        if run.status is not TurnStatus.WAITING:
            message = final.status.message if final.status.HasField("message") else None
            yield _status(task, final.status.state, message)


def _status(
    task: pb.Task, state: int, message: pb.Message | None = None
) -> pb.TaskStatusUpdateEvent:
    update = pb.TaskStatusUpdateEvent(task_id=task.id, context_id=task.context_id)
    update.status.state = state  # type: ignore[assignment]
    update.status.timestamp.GetCurrentTime()
    if message is not None:
        update.status.message.CopyFrom(message)
    return update


def _chunk(task: pb.Task, text: str, *, append: bool) -> pb.TaskArtifactUpdateEvent:
    return pb.TaskArtifactUpdateEvent(
        task_id=task.id,
        context_id=task.context_id,
        artifact=tasks.reply_artifact(text),
        append=append,
    )


def a2a_routes(client: Client, feeds: Feeds, settings: GatewaySettings) -> list[BaseRoute]:
    """Every A2A route: the Agent Card, the JSON-RPC binding at :data:`JSONRPC_PATH` and
    the HTTP+JSON binding at the root (without the SDK's ``/{tenant}/…`` copies: a
    tenant is its token's)."""
    push = settings.push_hosts
    handler = TurnRequests(client, feeds, settings.workspaces, push)
    context: ServerCallContextBuilder = TenantContext()

    async def agent_card(request: Request) -> JSONResponse:
        """The Agent Card, its interfaces' URLs those of the address the request reached."""
        base = str(request.base_url).rstrip("/")
        agents = await asyncio.to_thread(declared_agents, client, settings.agents_host)
        card = tasks.agent_card(base, push=bool(push), agents=agents)
        return JSONResponse(agent_card_to_dict(card))

    routes: list[BaseRoute] = [Route(AGENT_CARD_WELL_KNOWN_PATH, agent_card, methods=["GET"])]
    routes += create_jsonrpc_routes(
        handler, JSONRPC_PATH, context_builder=context, enable_v0_3_compat=True
    )
    routes += [
        r for r in create_rest_routes(handler, context_builder=context) if isinstance(r, Route)
    ]
    return routes


def _push_config(config: PushConfig) -> pb.TaskPushNotificationConfig:
    # (The token is the receiver's own: it is not read back.)
    return pb.TaskPushNotificationConfig(
        id=config.config_id, task_id=config.turn_id, url=config.url
    )


__all__ = ["JSONRPC_PATH", "TurnRequests", "a2a_routes"]
