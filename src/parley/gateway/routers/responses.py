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
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.responses import Response

from parley import errors
from parley.client import Client
from parley.gateway.dependencies import ClientDep, FeedsDep, StreamsDep, Tenant, TurnStreams
from parley.gateway.event_streams import event_stream
from parley.gateway.feeds import Feeds, FellBehind
from parley.gateway.openai_errors import OpenAIRoute
from parley.gateway.projections.responses import ResponsesProjection
from parley.gateway.resources import ErrorBody
from parley.gateway.tenants import owned_session, owned_turn
from parley.gateway.work import light
from parley.openai_api.errors import OpenAIError, OpenAIErrorBody
from parley.openai_api.response_objects import (
    SLOTS,
    ResponseMeta,
    meta_of,
    response_object,
    stored_response,
    unix_seconds,
)
from parley.openai_api.response_requests import (
    ApprovalResponseItem,
    ResponseCreate,
    answers_of,
    check_supported,
    conversation_id,
    prompt_of,
)
from parley.schemas.events import EventKind
from parley.schemas.records import TaskContract, TurnRecord, TurnStatus
from parley.store.ids import new_id
from parley.turn_handle import TurnHandle
from parley.workspaces import workspace_root

log = logging.getLogger("parley.gateway")

CANCEL_WAIT_SECONDS = 10.0
"""How long a cancel waits for the turn to stop before answering (it stops at its next
step boundary, at once while the model streams): the object it answers then says
``cancelled``; a turn inside a slow tool call is still ``in_progress``."""
MAX_SEQUENCE_NUMBER = (2**31 - 1) * SLOTS + SLOTS - 1


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


def response_of_tenant(response_id: str, client: ClientDep, owner: Tenant) -> TurnRecord:
    """The path's response (a turn), if the tenant owns its conversation: a route's
    dependency (``OwnedResponse``), run on the routes' shared thread pool."""
    try:
        return owned_turn(client, response_id, owner)
    except errors.TurnNotFound:
        raise OpenAIError(
            404, f"Response with id '{response_id}' not found.", code="not_found"
        ) from None


OwnedResponse = Annotated[TurnRecord, Depends(response_of_tenant)]
"""A route parameter: the response ``{response_id}`` names, the tenant's (else 404)."""


# ---------------------------------------------------------------------------- routes


@router.post("/responses", response_model=None, responses=RESPONSE_OR_STREAM)
async def create_response(
    body: ResponseCreate, client: ClientDep, streams: StreamsDep, owner: Tenant
) -> Response:
    """Start a response (a turn): in a new conversation (a session), in ``conversation``'s,
    or after ``previous_response_id``.  Answers the response once it has ended; with
    ``background``, at once (``queued``); with ``stream``, its events as they come."""
    check_supported(body)
    answers = answers_of(body.input)
    if answers:
        # Answers to a waiting response's approval requests: the same response (the
        # same turn) goes on; it is answered in the mode asked, as it stands.
        handle = await light(_answer_approvals, client, owner, body, answers)
        if body.stream:
            meta = await light(_meta, client, handle.turn_id)
            return _event_stream(client, streams, handle.turn_id, meta, 0, {})
        if not body.background:
            await _until_ended(client, streams.feeds, handle.turn_id, None)
        return JSONResponse(await light(_stored, client, handle.turn_id, {}))
    prompt = prompt_of(body.input)
    handle = await light(_submit, client, streams.settings.workspaces, owner, body, prompt)
    hints = {
        "model": body.model or "",
        "previous_response_id": body.previous_response_id,
        "background": bool(body.background),
    }
    if body.stream:
        # Followed from here, while the stream's answer is made: its first token waits
        # for no read of the feed's own.
        streams.feeds.follow_submitted(handle.submitted, owner)
    if body.stream or body.background:
        # A new turn as submitted (its id, session and time are all the meta needs); a
        # repeat as it is now.
        turn = handle.submitted if handle.created else await light(handle.record)
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
            return _event_stream(client, streams, handle.turn_id, meta, 0, hints)
        # The response as created (OpenAI's answer to a background create), however far
        # the turn has gone since: retrieve it, or stream it, for the rest.
        return JSONResponse(response_object(meta, status="queued"))
    await _until_ended(client, streams.feeds, handle.turn_id, None)
    return JSONResponse(await light(_stored, client, handle.turn_id, hints))


def _previous(client: Client, body: ResponseCreate, owner: str) -> TurnRecord:
    assert body.previous_response_id is not None
    try:
        return owned_turn(client, body.previous_response_id, owner)
    except errors.TurnNotFound:
        raise OpenAIError(
            400,
            f"Previous response with id '{body.previous_response_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        ) from None


def _answer_approvals(
    client: Client, owner: str, body: ResponseCreate, answers: list[ApprovalResponseItem]
) -> TurnHandle:
    """Answer calls of the response ``previous_response_id`` that wait for a person:
    every answer is checked (its call waits, and is named once) before any is given."""
    if body.previous_response_id is None:
        raise OpenAIError(
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
            raise OpenAIError(
                400,
                f"response '{previous.turn_id}' {what}: {answer.approval_id!r}",
                param=where,
            )
        if not approval.pending:
            decision = approval.decision.value if approval.decision else "answered"
            raise OpenAIError(
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
        conversation = conversation_id(body.conversation)
        try:
            owned_session(client, conversation, owner)
        except errors.SessionNotFound:
            raise OpenAIError(
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
        raise OpenAIError(
            409,
            f"a response of conversation {session_id!r} is in progress: continuing after "
            "an earlier response (a branch) waits until it ends",
            param="previous_response_id",
            code="conversation_busy",
        )
    client.session(session_id).branch_from(previous)


@router.get("/responses/{response_id}", response_model=None, responses=RESPONSE_OR_STREAM)
async def retrieve_response(
    record: OwnedResponse,
    *,
    client: ClientDep,
    streams: StreamsDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=0, le=MAX_SEQUENCE_NUMBER)] = None,
    last_event_id: Annotated[
        str | None,
        Header(
            max_length=24, pattern=r"^\s*[0-9]*\s*$", description="The last sequence_number seen"
        ),
    ] = None,
) -> Response:
    """The response; with ``stream=true`` its events after ``starting_after`` (or the
    ``Last-Event-ID`` header), from its start if neither, closing after its end."""
    response_id = record.turn_id
    if not stream:
        return JSONResponse(await light(_stored, client, response_id, {}))
    after = starting_after if starting_after is not None else _last_event_id(last_event_id)
    meta = await light(_meta, client, response_id)
    return _event_stream(client, streams, response_id, meta, after, {})


@router.post("/responses/{response_id}/cancel", response_model=None)
async def cancel_response(
    record: OwnedResponse, client: ClientDep, feeds: FeedsDep
) -> JSONResponse:
    """Interrupt the response (it stops at its next step boundary, at once while the model
    streams, and stays resumable through the native API) and answer its object; one that
    has ended is answered as it is."""
    response_id = record.turn_id
    try:
        await light(lambda: client.attach(response_id).interrupt())
    except errors.TurnEnded:
        pass  # cancelling twice, or after the end, answers the response as it is (OpenAI)
    else:
        await _until_ended(client, feeds, response_id, CANCEL_WAIT_SECONDS)
    return JSONResponse(await light(_stored, client, response_id, {}))


def _last_event_id(value: str | None) -> int:
    if value is None or not value.strip():
        return 0
    try:
        number = int(value)
    except ValueError:
        raise OpenAIError(400, "Last-Event-ID must be a sequence number") from None
    if not 0 <= number <= MAX_SEQUENCE_NUMBER:
        raise OpenAIError(400, "Last-Event-ID is not a sequence number of this API")
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
                        run = await light(client.run_state, turn_id)
                        if run.status is TurnStatus.WAITING:
                            return
            except FellBehind:
                # A turn longer than a feed lets one reader lag behind: ask the store.
                while True:
                    status = (await light(client.run_state, turn_id)).status
                    if status.terminal or status is TurnStatus.WAITING:
                        return
                    await asyncio.sleep(0.5)
    except TimeoutError:
        pass


def _event_stream(
    client: Client,
    streams: TurnStreams,
    turn_id: str,
    meta: ResponseMeta,
    after: int,
    hints: dict[str, Any],
) -> EventSourceResponse:
    """The response's events numbered above ``after``.  The turn is projected from its
    first event every time, so the numbering (and what follows ``after``) is the same on
    every read, from any gateway process."""

    async def frames() -> AsyncIterator[ServerSentEvent]:
        projection = ResponsesProjection(meta)
        held = None  # an end: the turn's last only if nothing follows it
        try:
            async for event in streams.feeds.subscribe(turn_id, 0):
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
                final = await light(_stored, client, turn_id, hints)
                for frame in _frames(projection.project(held, final=final), after):
                    yield frame
        except FellBehind as exc:
            log.info("dropped a slow subscriber: %s", exc)

    return event_stream(frames(), streams.settings)


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
