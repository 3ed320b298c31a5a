"""``POST /v1/chat`` and ``GET /v1/chat/{id}/stream``: parley for the AI SDK's ``useChat``
(the ``ai`` package's ``DefaultChatTransport``), docs/protocols.md.

The body is the one that transport sends (``id``: the chat, ``messages``: its
``UIMessage`` list, ``trigger``, ``messageId``, and whatever the app adds); the answer is
the UI message stream, v1, for one turn, projected by
``projections.aisdk.UiMessageStream``.  ``GET …/stream`` is the transport's
``reconnectToStream``: a replay of the chat's running turn from its start (the transport
expects a replay: ``resumeStreamIsReplay``), following it live, or ``204`` when nothing
runs.

``trigger: regenerate-message`` asks for another answer to the newest user message: the
session branches from above the turn being regenerated (``messageId``, the assistant
message's id, which is its turn id; else the head), so the new answer replaces it in the
history rather than following it.  The first turn of a chat has nothing above it; there a
regenerated answer follows the old one.

A turn that waits for a person (docs/approvals.md) shows each waiting call as a tool part with a
``tool-approval-request`` and ends the message with ``finish`` (``tool-calls``), as the
SDK does; the app answers with ``addToolApprovalResponse``, and the request that carries
the answers (its last message that assistant message, its parts ``approval-responded``)
streams the same turn on into the same message.

Refusals before the stream starts (a body that is not a chat request, no messages, no user
message, a prompt parley cannot take) are HTTP errors in the gateway's error form and
change nothing; the transport throws them with the body as the message.  A turn that
fails is an ``error`` chunk inside the stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict
from sse_starlette import EventSourceResponse, ServerSentEvent

from parley.client import Client
from parley.errors import InvalidRequest, SessionNotFound
from parley.gateway.dependencies import ClientDep, FeedsDep, SettingsDep, Tenant
from parley.gateway.feeds import Feeds
from parley.gateway.projection import approval_pause, data_frame, data_stream, projected
from parley.gateway.projections.aisdk import UiMessageStream
from parley.gateway.resources import ERRORS, NOT_BLANK
from parley.gateway.settings import GatewaySettings
from parley.gateway.threads import (
    MAX_EXTERNAL_ID,
    ApprovalAnswer,
    answer_approvals,
    check_prompt,
    find_thread,
    message_request_id,
    open_thread,
)
from parley.gateway.work import light
from parley.schemas.events import EventKind
from parley.schemas.records import TurnRecord

PROTOCOL = "ai-sdk"
HEADERS = {"x-vercel-ai-ui-message-stream": "v1", "x-accel-buffering": "no"}

router = APIRouter(prefix="/v1", responses=ERRORS)

UI_MESSAGE_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The AI SDK's UI message stream, v1 (`x-vercel-ai-ui-message-stream: "
        "v1`): `data: CHUNK-JSON` lines (start, start-step, text-*, tool-input-available, "
        "tool-output-*, data-parley-*, finish-step, finish | abort | error), then "
        "`data: [DONE]`.",
        # Before OpenAPI 3.2's itemSchema, an event stream's schema describes each event:
        # its data a chunk's JSON object, or the closing [DONE].
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "required": ["data"],
                    "properties": {
                        "data": {"type": "string", "pattern": "^(\\[DONE\\]|\\{.*\\})$"}
                    },
                }
            }
        },
    }
}


class UiTextPart(BaseModel):
    """A text part of a user ``UIMessage``."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str = Field(json_schema_extra={"pattern": NOT_BLANK})


class UiDataPart(BaseModel):
    """An app's data part (``data-*``) of a user ``UIMessage``: it carries no prompt."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(pattern="^data-")


IS_TEXT: JsonDict = {"contains": {"type": "object", "properties": {"type": {"const": "text"}}}}
HAS_USER_MESSAGE: JsonDict = {
    "contains": {"type": "object", "properties": {"role": {"const": "user"}}, "required": ["role"]}
}


class UiUserMessage(BaseModel):
    """A user ``UIMessage``: its text parts are a prompt (parley takes text: a file part is
    refused); fields parley does not read are kept as given."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=1000)
    role: Literal["user"]
    parts: list[UiTextPart | UiDataPart] = Field(min_length=1, json_schema_extra=IS_TEXT)


class UiOtherMessage(BaseModel):
    """A system or assistant ``UIMessage`` (an assistant message's parts may carry the
    app's approval responses)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=1000)
    role: Literal["system", "assistant"]
    parts: list[dict[str, Any]]


UiMessageIn = Annotated[UiUserMessage | UiOtherMessage, Field(discriminator="role")]


class ChatRequest(BaseModel):
    """What ``DefaultChatTransport.sendMessages`` posts (plus any fields the app's own
    ``body`` adds, which are ignored)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: str = Field(min_length=1, max_length=MAX_EXTERNAL_ID, description="The chat's id")
    messages: list[UiMessageIn] = Field(min_length=1, json_schema_extra=HAS_USER_MESSAGE)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    message_id: str | None = Field(None, alias="messageId")


def newest_user_message(messages: list[UiMessageIn]) -> tuple[UiUserMessage, str]:
    """The newest user message and its text (text parts joined by newlines), or
    :class:`InvalidRequest`: none, or no text."""
    for message in reversed(messages):
        if isinstance(message, UiUserMessage):
            texts = [part.text for part in message.parts if isinstance(part, UiTextPart)]
            return message, check_prompt("\n".join(texts))
    raise InvalidRequest("the chat request has no user message: its newest one is the prompt")


def approval_responses(messages: list[UiMessageIn]) -> list[ApprovalAnswer]:
    """The answers ``addToolApprovalResponse`` put in the last (assistant) message: its
    tool parts in state ``approval-responded``."""
    last = messages[-1]
    if not isinstance(last, UiOtherMessage) or last.role != "assistant":
        return []
    answers = []
    for part in last.parts:
        approval = part.get("approval")
        if part.get("state") != "approval-responded" or not isinstance(approval, dict):
            continue
        approval_id, approved = approval.get("id"), approval.get("approved")
        if not isinstance(approval_id, str) or not isinstance(approved, bool):
            continue  # not a response the SDK makes: no answer
        reason = approval.get("reason")
        reason = reason if isinstance(reason, str) and reason.strip() else None
        answers.append(ApprovalAnswer(approval_id=approval_id, approved=approved, reason=reason))
    return answers


@dataclass(frozen=True, kw_only=True)
class _Continuation:
    """Where a message the client holds goes on after its approval responses."""

    session_id: str
    turn_id: str
    step: int
    after: int
    """The seq of the last approval request the client was shown."""
    asked: dict[str, str]
    """The step's approvals (id → call id): tool parts the client holds."""
    waiting: bool
    """Some of the turn's calls still wait for an answer."""


def _continue(
    client: Client, owner: str, chat_id: str, answers: list[ApprovalAnswer]
) -> _Continuation:
    session = find_thread(client, owner, chat_id)
    if session is None:
        raise SessionNotFound(f"no chat {chat_id!r} with calls to answer")
    turn_id = answer_approvals(client, session, answers)
    approvals = client.approvals_of(turn_id)
    ids = {answer.approval_id for answer in answers}
    step = max(a.step for a in approvals if a.approval_id in ids)
    asked = {a.approval_id: a.call_id for a in approvals if a.step == step}
    requested = [
        event.seq
        for event in client.stored_events(turn_id)
        if event.kind is EventKind.APPROVAL_REQUESTED and event.data["approval_id"] in asked
    ]
    return _Continuation(
        session_id=session.id,
        turn_id=turn_id,
        step=step,
        after=max(requested),
        asked=asked,
        waiting=any(a.pending for a in approvals),
    )


def _stream(
    client: Client,
    feeds: Feeds,
    settings: GatewaySettings,
    session_id: str,
    turn_id: str,
    continuation: _Continuation | None = None,
) -> EventSourceResponse:
    if continuation is None:
        projection = UiMessageStream(session_id=session_id, turn_id=turn_id)
    else:
        projection = UiMessageStream(
            session_id=session_id,
            turn_id=turn_id,
            open_step=continuation.step,
            asked=continuation.asked,
        )
    pause = approval_pause(client, turn_id, lambda: projection.asked, projection.interrupt)

    async def frames() -> AsyncIterator[ServerSentEvent]:
        if continuation is not None and continuation.waiting:
            # Not every call has its answer yet: the message stays as it is, waiting.
            for item in [*projection.opening(), *projection.waiting()]:
                yield data_frame(item)
        else:
            after = 0 if continuation is None else continuation.after
            async for frame in projected(
                feeds, turn_id, projection, data_frame, after=after, pause=pause
            ):
                yield frame
        yield data_frame("[DONE]")

    return data_stream(frames(), settings, **HEADERS)


@router.post(
    "/chat", tags=["protocols"], response_class=EventSourceResponse, responses=UI_MESSAGE_STREAM
)
async def chat(
    body: ChatRequest,
    client: ClientDep,
    feeds: FeedsDep,
    settings: SettingsDep,
    owner: Tenant,
) -> EventSourceResponse:
    """Answer a chat's newest user message as a parley turn: ``id`` names the session (a
    new one for a chat the tenant has not used), the message is the prompt (sent again,
    it answers the turn it made), and the turn streams as the UI message stream.  A turn
    already running on the session is waited for (enqueued)."""
    answers = approval_responses(body.messages)
    if answers:
        # The app answered calls the turn waits on: the turn goes on in the same message.
        going_on = await light(_continue, client, owner, body.id, answers)
        return _stream(client, feeds, settings, going_on.session_id, going_on.turn_id, going_on)
    message, prompt = newest_user_message(body.messages)
    # Made (its message id checked) before the chat is opened: a refused request makes
    # no session.
    request_id = message_request_id(PROTOCOL, message.id, prompt)
    regenerate = body.trigger == "regenerate-message"

    def start() -> TurnRecord:
        thread = open_thread(
            client,
            settings.workspaces,
            owner,
            body.id,
            metadata={"protocol": PROTOCOL, "chat_id": body.id},
        )
        session = thread.session
        if regenerate:
            _branch_above(client, session.id, body.message_id)
        # Every regeneration is a new answer.
        handle = session.submit(prompt, request_id=None if regenerate else request_id)
        return handle.submitted

    submitted = await light(start)
    # Followed from here, while the stream's answer is made: its first token waits for no
    # read of the feed's own.
    feeds.follow_submitted(submitted, owner)
    return _stream(client, feeds, settings, submitted.session_id, submitted.turn_id)


def _branch_above(client: Client, session_id: str, message_id: str | None) -> None:
    """Move the head above the turn a regeneration replaces: ``message_id``'s turn if it
    is one of the session's, else the head."""
    session = client.session(session_id)
    turns = {turn.turn_id: turn for turn in session.tree()}
    target = turns.get(message_id or "") or turns.get(session.head or "")
    if target is not None and target.parent_id is not None:
        session.branch_from(target.parent_id)


@router.get(
    "/chat/{chat_id}/stream",
    tags=["protocols"],
    response_class=EventSourceResponse,
    responses={**UI_MESSAGE_STREAM, 204: {"description": "Nothing runs in this chat"}},
)
async def chat_stream(
    chat_id: Annotated[str, Path(min_length=1, max_length=MAX_EXTERNAL_ID)],
    client: ClientDep,
    feeds: FeedsDep,
    settings: SettingsDep,
    owner: Tenant,
) -> Response:
    """The chat's running turn (its newest queued or running one) as the UI message
    stream, replayed from its start and followed live; ``204`` when none runs, or the
    chat is unknown (nothing is created)."""

    def running() -> tuple[str, str] | None:
        session = find_thread(client, owner, chat_id)
        if session is None:
            return None
        live = [turn for turn in session.tree() if not turn.status.terminal]
        return (session.id, live[-1].turn_id) if live else None

    found = await light(running)
    if found is None:
        return Response(status_code=204)
    return _stream(client, feeds, settings, *found)
