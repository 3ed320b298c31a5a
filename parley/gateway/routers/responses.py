"""The OpenAI Responses API on parley (``client.responses`` of the official ``openai``
package, with ``base_url`` the gateway's ``/v1`` and a gateway token as the API key).

A response is a turn: its id is the turn id.  ``POST /v1/responses`` starts one (in a new
session, in the session ``conversation`` names, or after ``previous_response_id``),
answering when it ends, at once (``background``), or as a stream (``stream``);
``GET /v1/responses/{id}`` is its object, or (``stream=true``) its event stream resumed
after ``starting_after``; ``POST /v1/responses/{id}/cancel`` interrupts it.  Every
response is durable, whether or not it was created in the background: its stream can be
resumed for as long as the store keeps the turn.  The events are a projection of the
turn's own (``projections/responses.py``), read through the process's shared feed.

Refusals are in OpenAI's error form, ``{"error": {"message", "type", "param", "code"}}``,
with OpenAI's statuses, and change nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from parley import errors
from parley.client import Client
from parley.gateway.dependencies import ClientDep, FeedsDep, SettingsDep, Tenant
from parley.gateway.errors import GatewayError, status_of
from parley.gateway.feeds import Feeds, FellBehind
from parley.gateway.projections.responses import (
    SLOTS,
    Projection,
    ResponseMeta,
    meta_of,
    response_object,
    stored_response,
    unix_seconds,
)
from parley.gateway.resources import JSON_NUMBER, ErrorBody
from parley.gateway.routers.native import event_stream, workspace_root
from parley.gateway.settings import GatewaySettings
from parley.gateway.tenants import owned_session, owned_turn
from parley.turn_handle import TurnHandle
from parley.validation import MAX_PROMPT_BYTES, MAX_STEER_BYTES
from schemas.events import EventKind
from schemas.records import TaskContract, TurnRecord, TurnStatus
from workers.store.sql_store import new_id

log = logging.getLogger("parley.gateway")

CANCEL_WAIT_SECONDS = 10.0
"""How long a cancel waits for the turn to stop before answering (it stops at its next
step boundary, at once while the model streams): the object it answers then says
``cancelled``; a turn inside a slow tool call is still ``in_progress``."""
MAX_SEQUENCE_NUMBER = (2**31 - 1) * SLOTS + SLOTS - 1


# ---------------------------------------------------------------------------- errors


class OpenAIErrorDetail(BaseModel):
    """What went wrong, as OpenAI says it."""

    message: str
    type: str = Field(description="invalid_request_error, or server_error")
    param: str | None = None
    code: str | None = None


class OpenAIErrorBody(BaseModel):
    """Every refusal of the Responses routes."""

    error: OpenAIErrorDetail


class Refusal(Exception):
    """A request refused in OpenAI's terms."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type_name: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = OpenAIErrorBody(
            error=OpenAIErrorDetail(message=message, type=type_name, param=param, code=code)
        )
        self.headers = headers

    def response(self) -> JSONResponse:
        """The refusal as an answer."""
        return JSONResponse(self.body.model_dump(), status_code=self.status, headers=self.headers)


def refusal_of(exc: Exception) -> Refusal:
    """Any error of a Responses route as OpenAI would answer it (a 5xx names no internals)."""
    if isinstance(exc, Refusal):
        return exc
    if isinstance(exc, RequestValidationError):
        return _invalid(exc)
    if isinstance(exc, GatewayError):
        code = "invalid_api_key" if exc.status == 401 else None
        return Refusal(exc.status, exc.message, code=code, headers=exc.headers)
    if isinstance(exc, StarletteHTTPException):  # FastAPI's own: a body it cannot parse
        if exc.status_code == 400:
            return Refusal(400, "the body is not valid JSON", code="invalid_json")
        detail = exc.detail if isinstance(exc.detail, str) else "refused"
        return Refusal(exc.status_code, detail, headers=dict(exc.headers or {}))
    if isinstance(exc, errors.TurnNotFound):
        return Refusal(404, str(exc), code="not_found")
    if isinstance(exc, errors.SessionNotFound):
        return Refusal(404, str(exc), param="conversation", code="not_found")
    if isinstance(exc, errors.ParleyError):
        status = status_of(exc)
        if status >= 500:
            log.error("%s: %s", type(exc).__name__, exc)
            return Refusal(
                status, "the service is unavailable; retry later", type_name="server_error"
            )
        # parley's 422 (a field it refuses) is OpenAI's 400; its 409s stay conflicts.
        return Refusal(400 if status == 422 else status, str(exc), code=type(exc).__name__)
    log.exception("unexpected error", exc_info=exc)
    return Refusal(500, "the gateway failed; retry later", type_name="server_error")


def _invalid(exc: RequestValidationError) -> Refusal:
    """The first of pydantic's complaints, with the parameter it concerns."""
    items = exc.errors()
    if any(item.get("type") == "json_invalid" for item in items):
        return Refusal(400, "the body is not valid JSON", code="invalid_json")
    item = items[0] if items else {}
    where = [str(p) for p in item.get("loc", ()) if p not in ("body", "query", "path")]
    param = where[0] if where else None
    name = ".".join(where)
    kind = item.get("type")
    if kind == "extra_forbidden":
        return Refusal(400, f"Unknown parameter: '{name}'.", param=param, code="unknown_parameter")
    if kind == "missing":
        message, code = f"Missing required parameter: '{name}'.", "missing_required_parameter"
        return Refusal(400, message, param=param, code=code)
    detail = str(item.get("msg", "invalid"))
    return Refusal(400, f"Invalid '{name}': {detail}", param=param, code="invalid_value")


class OpenAIRoute(APIRoute):
    """A route whose refusals (auth, validation, parley's errors) are in OpenAI's form,
    not the rest of the gateway's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                return refusal_of(exc).response()

        return route


ERRORS: dict[int | str, dict[str, Any]] = {
    **{
        status: {"model": OpenAIErrorBody, "description": text}
        for status, text in (
            (400, "A parameter is invalid, or one parley does not serve"),
            (401, "No bearer token (API key), or an unknown one"),
            (404, "No such response or conversation (or another tenant's)"),
            (409, "The conversation's state forbids this"),
        )
    },
    # Refused before any route, by the gateway's body limit, in the gateway's own form.
    413: {"model": ErrorBody, "description": "The body is over PARLEY_GATEWAY_MAX_BODY"},
    415: {"model": ErrorBody, "description": "The body is not declared as JSON"},
}
RESPONSE_OR_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The Response object, or with stream=true its Server-Sent Events "
        "(`event: TYPE`, `data: event JSON`; `: keep-alive` comments while idle)",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}

router = APIRouter(prefix="/v1", tags=["responses"], responses=ERRORS, route_class=OpenAIRoute)


# ---------------------------------------------------------------------------- requests


class ResponseCreate(BaseModel):
    """``POST /v1/responses``: OpenAI's parameters.  The host chooses the model, the
    system prompt and the tools: ``model`` is recorded, ``instructions`` and the sampling
    parameters are accepted and have no effect, and ``tools`` (functions the client would
    run) are refused.  A parameter OpenAI does not define is refused, and so is one of
    another JSON type than OpenAI's (``"stream": "true"`` is not true)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input: (
        Annotated[str, Field(min_length=1, pattern=r"\S")]
        | Annotated[list[dict[str, Any]], Field(min_length=1)]
    ) = Field(
        description="The prompt, or a message list whose newest user message is the prompt "
        "(earlier messages are not replayed: the stored history is what the model sees)"
    )
    model: str | None = Field(None, max_length=200)
    previous_response_id: str | None = Field(
        None, description="Continue after this response, in its conversation"
    )
    conversation: str | dict[str, Any] | None = Field(
        None, description="A conversation (a session id, or {'id': …}) to continue"
    )
    background: bool | None = Field(None, description="Answer at once, status queued")
    stream: bool | None = Field(None, description="Answer with the response's event stream")
    max_output_tokens: (
        Annotated[int, Field(ge=1, le=2**31 - 1, strict=False), JSON_NUMBER] | None
    ) = Field(None, description="The turn's token budget (input and output)")
    store: bool | None = None
    tools: list[dict[str, Any]] | None = None
    text: dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    # Accepted, and without effect: the host decides these.
    instructions: str | None = None
    metadata: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: Annotated[int, Field(strict=False), JSON_NUMBER] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: Annotated[int, Field(strict=False), JSON_NUMBER] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: str | None = None
    include: list[str] | None = None
    stream_options: dict[str, Any] | None = None
    service_tier: str | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    background_options: dict[str, Any] | None = None
    context_management: list[dict[str, Any]] | None = None
    access_programs: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None


def prompt_of(value: str | list[dict[str, Any]]) -> str:
    """The prompt of a request's ``input``: the string, or the text of the newest user
    message, which must come last (parley runs its host's tools itself: there is no
    ``function_call_output`` of the client's to take)."""
    if isinstance(value, str):
        text = value
    else:
        users = [
            n
            for n, item in enumerate(value)
            if item.get("role") == "user" and item.get("type", "message") == "message"
        ]
        if not users:
            raise Refusal(
                400, "input has no user message (its newest one is the prompt)", param="input"
            )
        last = users[-1]
        if last != len(value) - 1:
            kind = value[last + 1].get("type") or value[last + 1].get("role")
            raise Refusal(
                400,
                f"input[{last + 1}] ({kind}) follows the newest user message: the prompt "
                "must come last (parley runs its host's tools; it takes no tool outputs)",
                param=f"input[{last + 1}]",
            )
        text = _text_of(value[last].get("content"), f"input[{last}].content")
    if not text.strip():
        raise Refusal(400, "input is empty: there is no prompt", param="input", code="empty")
    if "\x00" in text:
        raise Refusal(400, "input contains a NUL character", param="input")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise Refusal(400, "input is not valid UTF-8", param="input") from None
    if size > MAX_PROMPT_BYTES:
        raise Refusal(400, f"input is {size} bytes; the limit is {MAX_PROMPT_BYTES}", param="input")
    return text


@dataclass(frozen=True, kw_only=True)
class ApprovalAnswer:
    """An ``mcp_approval_response`` input item: a person's answer to a waiting call."""

    position: int
    approval_id: str
    approve: bool
    reason: str | None


def answers_of(value: str | list[dict[str, Any]]) -> list[ApprovalAnswer]:
    """The ``mcp_approval_response`` items of ``input``, which come last (the items
    before them, like earlier messages, are not replayed); none for any other input."""
    if isinstance(value, str):
        return []
    kinds = [item.get("type") for item in value]
    if "mcp_approval_response" not in kinds:
        return []
    first = kinds.index("mcp_approval_response")
    answers = []
    for n in range(first, len(value)):
        item = value[n]
        if kinds[n] != "mcp_approval_response":
            raise Refusal(
                400,
                f"input[{n}] follows an mcp_approval_response: answers to approval requests "
                "come last, and alone (a steer for the response goes through the native API)",
                param=f"input[{n}]",
            )
        approval_id, approve, reason = (
            item.get("approval_request_id"),
            item.get("approve"),
            item.get("reason"),
        )
        if not isinstance(approval_id, str) or not approval_id or len(approval_id) > 36:
            raise Refusal(
                400, "approval_request_id must be an id", param=f"input[{n}].approval_request_id"
            )
        if not isinstance(approve, bool):
            raise Refusal(400, "approve must be true or false", param=f"input[{n}].approve")
        if reason is not None and (
            not isinstance(reason, str)
            or not _echoable(reason)
            or len(reason.encode("utf-8")) > MAX_STEER_BYTES
        ):
            raise Refusal(
                400,
                f"reason must be text of at most {MAX_STEER_BYTES} bytes",
                param=f"input[{n}].reason",
            )
        reason = reason if reason and reason.strip() else None
        answers.append(
            ApprovalAnswer(position=n, approval_id=approval_id, approve=approve, reason=reason)
        )
    return answers


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Refusal(400, f"{where} must be a string or a list of parts", param=where)
    texts = []
    for n, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "text") or not isinstance(part.get("text"), str):
            raise Refusal(
                400,
                f"{where}[{n}] is {kind or 'not a part'}: parley takes text input only",
                param=f"{where}[{n}]",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def _check_supported(body: ResponseCreate) -> None:
    """Refuse what parley cannot do as asked, before anything is written."""
    if body.tools:
        raise Refusal(
            400,
            "tools are the host's: parley runs its host's tools itself and calls none of "
            "the client's; leave tools out",
            param="tools",
        )
    if body.store is False:
        raise Refusal(400, "parley stores every response (a response is a turn)", param="store")
    if body.prompt is not None:
        raise Refusal(400, "prompt templates are not served; send input", param="prompt")
    text_format = (body.text or {}).get("format")
    if isinstance(text_format, dict) and text_format.get("type", "text") != "text":
        raise Refusal(400, "only text output is served", param="text.format")
    if body.model is not None and not _echoable(body.model):
        raise Refusal(400, "model must be text (UTF-8, no NUL)", param="model")
    if body.previous_response_id is not None and body.conversation is not None:
        raise Refusal(
            400,
            "previous_response_id and conversation cannot be used together",
            param="previous_response_id",
        )


def _echoable(text: str) -> bool:
    """Whether ``text`` can be sent back in a JSON answer (UTF-8 has no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def _conversation_id(value: str | dict[str, Any]) -> str:
    given = value.get("id") if isinstance(value, dict) else value
    if not isinstance(given, str) or not given:
        raise Refusal(400, "conversation must be an id or {'id': …}", param="conversation")
    return given


# ---------------------------------------------------------------------------- routes


@router.post("/responses", response_model=None, responses=RESPONSE_OR_STREAM)
async def create_response(
    body: ResponseCreate,
    client: ClientDep,
    feeds: FeedsDep,
    settings: SettingsDep,
    owner: Tenant,
) -> Response:
    """Start a response (a turn): in a new conversation (a session), in ``conversation``'s,
    or after ``previous_response_id``.  Answers the response once it has ended; with
    ``background``, at once (``queued``); with ``stream``, its events as they come."""
    _check_supported(body)
    answers = answers_of(body.input)
    if answers:
        # Answers to a waiting response's approval requests: the same response (the
        # same turn) goes on; it is answered in the mode asked, as it stands.
        handle = await asyncio.to_thread(_answer_approvals, client, owner, body, answers)
        if body.stream:
            meta = await asyncio.to_thread(_meta, client, handle.turn_id)
            return _event_stream(client, feeds, settings, handle.turn_id, meta, 0, {})
        if not body.background:
            await _until_ended(client, feeds, handle.turn_id, None)
        return JSONResponse(await asyncio.to_thread(_stored, client, handle.turn_id, {}))
    prompt = prompt_of(body.input)
    handle = await asyncio.to_thread(_submit, client, settings.workspaces, owner, body, prompt)
    hints = {
        "model": body.model or "",
        "previous_response_id": body.previous_response_id,
        "background": bool(body.background),
    }
    if body.stream or body.background:
        turn = await asyncio.to_thread(handle.record)
        meta = ResponseMeta(
            response_id=turn.turn_id,
            created_at=unix_seconds(turn.created_at),
            conversation_id=turn.session_id,
            model=body.model or "",
            previous_response_id=body.previous_response_id,
            background=bool(body.background),
            max_output_tokens=body.max_output_tokens,
        )
        if body.stream:
            return _event_stream(client, feeds, settings, handle.turn_id, meta, 0, hints)
        # The response as created (OpenAI's answer to a background create), however far
        # the turn has gone since: retrieve it, or stream it, for the rest.
        return JSONResponse(response_object(meta, status="queued"))
    await _until_ended(client, feeds, handle.turn_id, None)
    return JSONResponse(await asyncio.to_thread(_stored, client, handle.turn_id, hints))


def _previous(client: Client, body: ResponseCreate, owner: str) -> TurnRecord:
    assert body.previous_response_id is not None
    try:
        return owned_turn(client, body.previous_response_id, owner)
    except errors.TurnNotFound:
        raise Refusal(
            400,
            f"Previous response with id '{body.previous_response_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        ) from None


def _answer_approvals(
    client: Client, owner: str, body: ResponseCreate, answers: list[ApprovalAnswer]
) -> TurnHandle:
    """Answer calls of the response ``previous_response_id`` that wait for a person:
    every answer is checked (its call waits, and is named once) before any is given."""
    if body.previous_response_id is None:
        raise Refusal(
            400,
            "an mcp_approval_response answers the response that asked: give its id as "
            "previous_response_id",
            param="previous_response_id",
        )
    previous = _previous(client, body, owner)
    approvals = {a.approval_id: a for a in client.approvals_of(previous.turn_id)}
    named: set[str] = set()
    for answer in answers:
        where = f"input[{answer.position}].approval_request_id"
        approval = approvals.get(answer.approval_id)
        if approval is None or answer.approval_id in named:
            what = "names it twice" if approval is not None else "has no such approval request"
            raise Refusal(
                400,
                f"response '{previous.turn_id}' {what}: {answer.approval_id!r}",
                param=where,
            )
        if not approval.pending:
            decision = approval.decision.value if approval.decision else "answered"
            raise Refusal(
                409,
                f"approval request {answer.approval_id!r} has its answer already ({decision})",
                param=where,
                code="already_answered",
            )
        named.add(answer.approval_id)
    handle = client.attach(previous.turn_id)
    for answer in answers:
        if answer.approve:
            handle.approve(answer.approval_id, reason=answer.reason)
        else:
            handle.deny(answer.approval_id, reason=answer.reason)
    return handle


def _submit(
    client: Client, workspaces: Path, owner: str, body: ResponseCreate, prompt: str
) -> TurnHandle:
    """Queue the turn where the request says (every check made before any write); a new
    conversation's workspace is made under ``workspaces``."""
    contract = None
    if body.max_output_tokens is not None:
        contract = TaskContract(max_tokens=body.max_output_tokens)
    if body.previous_response_id is not None:
        previous = _previous(client, body, owner)
        session = client.session(previous.session_id)
        _follow(client, session.id, previous.turn_id)
        return session.submit(prompt, contract=contract)
    if body.conversation is not None:
        conversation = _conversation_id(body.conversation)
        try:
            owned_session(client, conversation, owner)
        except errors.SessionNotFound:
            raise Refusal(
                404,
                f"Conversation with id '{conversation}' not found.",
                param="conversation",
                code="not_found",
            ) from None
        return client.session(conversation).submit(prompt, contract=contract)
    session_id = new_id()
    root = workspace_root(workspaces, owner, session_id)
    session = client.open_session(root, tenant=owner, session_id=session_id)
    return session.submit(prompt, contract=contract)


def _follow(client: Client, session_id: str, previous: str) -> None:
    """Make the next turn of the session hang under ``previous``.  A turn queued or
    running will head the session when it ends, and a new turn waits for it anyway; an
    ended one that is not the head is branched from (as OpenAI continues from any earlier
    response), which only an idle session can do without a race."""
    record = client.session_record(session_id)
    run = client.run_state(previous)
    if not run.status.terminal or record.head_turn_id == previous:
        return
    if any(not turn.status.terminal for turn in client.tree_of(session_id)):
        raise Refusal(
            409,
            f"a response of conversation {session_id!r} is in progress: continuing after "
            "an earlier response (a branch) waits until it ends",
            param="previous_response_id",
            code="conversation_busy",
        )
    client.session(session_id).branch_from(previous)


@router.get("/responses/{response_id}", response_model=None, responses=RESPONSE_OR_STREAM)
async def retrieve_response(
    response_id: str,
    client: ClientDep,
    feeds: FeedsDep,
    settings: SettingsDep,
    owner: Tenant,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=0, le=MAX_SEQUENCE_NUMBER)] = None,
    last_event_id: Annotated[str | None, Header(max_length=24)] = None,
) -> Response:
    """The response; with ``stream=true`` its events after ``starting_after`` (or the
    ``Last-Event-ID`` header), from its start if neither, closing after its end."""
    await asyncio.to_thread(_owned, client, response_id, owner)
    if not stream:
        return JSONResponse(await asyncio.to_thread(_stored, client, response_id, {}))
    after = starting_after if starting_after is not None else _last_event_id(last_event_id)
    meta = await asyncio.to_thread(_meta, client, response_id)
    return _event_stream(client, feeds, settings, response_id, meta, after, {})


@router.post("/responses/{response_id}/cancel", response_model=None)
async def cancel_response(
    response_id: str, client: ClientDep, feeds: FeedsDep, owner: Tenant
) -> JSONResponse:
    """Interrupt the response (it stops at its next step boundary, at once while the model
    streams, and stays resumable through the native API) and answer its object; one that
    has ended is answered as it is."""
    await asyncio.to_thread(_owned, client, response_id, owner)
    try:
        await asyncio.to_thread(lambda: client.attach(response_id).interrupt())
    except errors.TurnEnded:
        pass  # cancelling twice, or after the end, answers the response as it is (OpenAI)
    else:
        await _until_ended(client, feeds, response_id, CANCEL_WAIT_SECONDS)
    return JSONResponse(await asyncio.to_thread(_stored, client, response_id, {}))


def _owned(client: Client, response_id: str, owner: str) -> None:
    try:
        owned_turn(client, response_id, owner)
    except errors.TurnNotFound:
        raise Refusal(
            404, f"Response with id '{response_id}' not found.", code="not_found"
        ) from None


def _last_event_id(value: str | None) -> int:
    if value is None or not value.strip():
        return 0
    try:
        number = int(value)
    except ValueError:
        raise Refusal(400, "Last-Event-ID must be a sequence number") from None
    if not 0 <= number <= MAX_SEQUENCE_NUMBER:
        raise Refusal(400, "Last-Event-ID is not a sequence number of this API")
    return number


def _stored(client: Client, turn_id: str, hints: dict[str, Any]) -> dict[str, Any]:
    run = client.run_state(turn_id)
    return stored_response(
        client.turn_record(turn_id),
        run,
        client.steps_of(turn_id),
        approvals=client.approvals_of(turn_id) if run.approval_count else (),
        **hints,
    )


def _meta(client: Client, turn_id: str) -> ResponseMeta:
    return meta_of(client.turn_record(turn_id), client.run_state(turn_id), client.steps_of(turn_id))


async def _until_ended(client: Client, feeds: Feeds, turn_id: str, timeout: float | None) -> None:
    """Wait (at most ``timeout`` seconds, if given) for the turn's last ``end`` (the
    shared feed's reading of the turn stops there), or until it waits for a person: an
    OpenAI client is answered then, with the approval requests in the output."""
    try:
        async with asyncio.timeout(timeout):
            try:
                async for event in feeds.subscribe(turn_id, 0):
                    if event.kind is EventKind.APPROVAL_REQUESTED:
                        run = await asyncio.to_thread(client.run_state, turn_id)
                        if run.status is TurnStatus.WAITING:
                            return
            except FellBehind:
                # A turn longer than a feed lets one reader lag behind: ask the store.
                while True:
                    status = (await asyncio.to_thread(client.run_state, turn_id)).status
                    if status.terminal or status is TurnStatus.WAITING:
                        return
                    await asyncio.sleep(0.5)
    except TimeoutError:
        pass


def _event_stream(
    client: Client,
    feeds: Feeds,
    settings: GatewaySettings,
    turn_id: str,
    meta: ResponseMeta,
    after: int,
    hints: dict[str, Any],
) -> EventSourceResponse:
    """The response's events numbered above ``after``.  The turn is projected from its
    first event every time, so the numbering (and what follows ``after``) is the same on
    every read, from any gateway process."""

    async def frames() -> AsyncIterator[ServerSentEvent]:
        projection = Projection(meta)
        held = None  # an end: the turn's last only if nothing follows it
        try:
            async for event in feeds.subscribe(turn_id, 0):
                if held is not None:  # a resume went on after that end
                    for frame in _frames(projection.project(held), after):
                        yield frame
                    held = None
                if event.kind is EventKind.END:
                    held = event
                    continue
                for frame in _frames(projection.project(event), after):
                    yield frame
            if held is not None:
                final = await asyncio.to_thread(_stored, client, turn_id, hints)
                for frame in _frames(projection.project(held, final=final), after):
                    yield frame
        except FellBehind as exc:
            log.info("dropped a slow subscriber: %s", exc)

    return event_stream(frames(), settings)


def _frames(events: list[dict[str, Any]], after: int) -> list[ServerSentEvent]:
    """The events numbered above ``after``, as SSE: ``event: TYPE`` and ``data``, as OpenAI
    sends them, and no ``id``.  The official client's decoder keeps the last id it saw and
    makes every blank line after it an event, so a keep-alive comment following an id would
    reach it as an event of no data, which it fails to parse; a reader resumes with the
    ``sequence_number`` of the data instead (``starting_after``)."""
    return [
        ServerSentEvent(data=json.dumps(event, separators=(",", ":")), event=event["type"])
        for event in events
        if event["sequence_number"] > after
    ]
