"""parley's own HTTP interface (docs/http.md#4-routes): sessions and turns as JSON, a turn's
events as Server-Sent Events.

Routes that only touch the store are plain functions, which FastAPI runs on its thread
pool; the event stream and the result's wait are asynchronous, never a thread of their
own: the stream reads the turn through the process's shared feed (``feeds.py``), the wait
through the process's one watcher of ends (``ends_watch.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from parley.client import Client
from parley.errors import InvalidRequest, SessionNotFound
from parley.gateway import resources as r
from parley.gateway.dependencies import ClientDep, EndsDep, FeedsDep, SettingsDep, Tenant
from parley.gateway.feeds import FellBehind
from parley.gateway.sample_files import add_sample_files
from parley.gateway.settings import GatewaySettings
from parley.gateway.tenants import owned_session, owned_turn, plausible_id
from parley.session import Session
from parley.turn_handle import TurnHandle
from parley.validation import MAX_SEQ, check_metadata
from parley.workspaces import workspace_root
from schemas.events import Event
from schemas.records import TaskContract
from workers.store.ids import new_id

log = logging.getLogger("parley.gateway")

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": r.ErrorBody, "description": text}
    for status, text in (
        (400, "Malformed JSON"),
        (401, "No bearer token, or an unknown one"),
        (404, "No such resource (or another tenant's)"),
        (409, "The resource's state forbids this"),
        (413, "The body is over PARLEY_GATEWAY_MAX_BODY"),
        (422, "A field is invalid"),
    )
}
EVENT_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: each `id: SEQ`, `event: KIND`, `data: Event` "
        "(see the ServerSentEvent, Event and *Payload schemas); `: keep-alive` comments "
        "while idle; the stream closes after `end`.",
        # Before OpenAPI 3.2's itemSchema, an event stream's schema describes each event.
        "content": {
            "text/event-stream": {"schema": {"$ref": "#/components/schemas/ServerSentEvent"}}
        },
    }
}

router = APIRouter(prefix="/v1", responses=ERRORS)


@router.post("/sessions", status_code=201, response_model=r.Session, tags=["sessions"])
def create_session(
    client: ClientDep,
    settings: SettingsDep,
    owner: Tenant,
    response: Response,
    body: Annotated[r.SessionCreate | None, Body()] = None,
) -> r.Session:
    """Open a session about a workspace of the tenant's (made if missing).  Every field
    is optional, and so is the body."""
    body = body or r.SessionCreate(workspace=None, metadata=None, title=None)
    session_id = new_id()
    if body.metadata is not None:
        check_metadata(body.metadata)  # refused before the workspace directory is made
    name = body.workspace or session_id
    fresh = not (settings.workspaces / owner / name).exists()
    root = workspace_root(settings.workspaces, owner, name)
    if fresh and settings.sample_files:
        add_sample_files(root)
    session = client.open_session(
        root, metadata=body.metadata, tenant=owner, session_id=session_id, title=body.title
    )
    response.headers["Location"] = f"/v1/sessions/{session.id}"
    return r.Session.of(client.session_record(session.id))


@router.get("/sessions", response_model=r.Sessions, tags=["sessions"])
def list_sessions(
    client: ClientDep,
    owner: Tenant,
    limit: Annotated[int, Query(ge=1, le=r.MAX_LIST)] = 50,
    before: Annotated[str | None, Query(min_length=1, max_length=36)] = None,
) -> r.Sessions:
    """The tenant's sessions, newest first; ``before`` (a session id) pages on."""
    if before is not None and not plausible_id(before):
        raise SessionNotFound(f"no session {before!r}")
    records = client.session_records(tenant=owner, limit=limit, before=before)
    return r.Sessions(sessions=[r.Session.of(record) for record in records])


@router.get("/sessions/{session_id}", response_model=r.Session, tags=["sessions"])
def get_session(session_id: str, client: ClientDep, owner: Tenant) -> r.Session:
    """A session."""
    return r.Session.of(owned_session(client, session_id, owner))


@router.patch("/sessions/{session_id}", response_model=r.Session, tags=["sessions"])
def update_session(
    session_id: str, body: r.SessionUpdate, client: ClientDep, owner: Tenant
) -> r.Session:
    """Change what a session shows: its ``title``."""
    record = owned_session(client, session_id, owner)
    session = Session(client, record)
    session.set_title(body.title)
    return r.Session.of(client.session_record(session.id))


@router.post(
    "/sessions/{session_id}/turns",
    status_code=202,
    response_model=r.Turn,
    tags=["turns"],
    responses={200: {"model": r.Turn, "description": "A repeated request_id: the same turn"}},
)
def submit_turn(
    session_id: str,
    body: r.TurnCreate,
    client: ClientDep,
    response: Response,
    owner: Tenant,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> r.Turn:
    """Queue a turn (``202``); the same ``request_id`` (or ``Idempotency-Key``) again
    answers the turn it made (``200``) and queues nothing."""
    record = owned_session(client, session_id, owner)
    if body.request_id and idempotency_key and body.request_id != idempotency_key:
        raise InvalidRequest("request_id and the Idempotency-Key header differ")
    request_id = body.request_id or idempotency_key or None
    contract = None
    if body.max_steps is not None or body.max_tokens is not None:
        contract = TaskContract(max_steps=body.max_steps, max_tokens=body.max_tokens)
    # The session as owned_session just read it (client.session would read it again).
    handle = Session(client, record).submit(
        body.prompt,
        contract=contract,
        request_id=request_id,
        if_busy=body.if_busy,
        context=body.context,
        priority=body.priority,
    )
    if not handle.created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/turns/{handle.turn_id}"
    # A new turn as submitted (queued: a driver that claimed it since is news the events
    # bring), for one query less on every submission's path; a repeat as it is now.
    return r.Turn.of(handle.submitted if handle.created else handle.record())


@router.get("/sessions/{session_id}/history", response_model=r.Turns, tags=["sessions"])
def history(session_id: str, client: ClientDep, owner: Tenant) -> r.Turns:
    """The turns root → head: what the model sees."""
    owned_session(client, session_id, owner)
    return r.Turns(turns=[r.Turn.of(t) for t in client.history_of(session_id)])


@router.get("/sessions/{session_id}/tree", response_model=r.Turns, tags=["sessions"])
def tree(session_id: str, client: ClientDep, owner: Tenant) -> r.Turns:
    """Every turn of every branch, in submission order."""
    owned_session(client, session_id, owner)
    return r.Turns(turns=[r.Turn.of(t) for t in client.tree_of(session_id)])


@router.post("/sessions/{session_id}/branch", response_model=r.Session, tags=["sessions"])
def branch(session_id: str, body: r.BranchRequest, client: ClientDep, owner: Tenant) -> r.Session:
    """Move the head to one of the session's turns: the next turn hangs under it."""
    owned_session(client, session_id, owner)
    owned_turn(client, body.turn_id, owner)  # another tenant's turn is unknown here
    client.session(session_id).branch_from(body.turn_id)
    return r.Session.of(client.session_record(session_id))


# ---------------------------------------------------------------------------- turns


@router.get("/turns/{turn_id}", response_model=r.TurnDetails, tags=["turns"])
def get_turn(turn_id: str, client: ClientDep, owner: Tenant) -> r.TurnDetails:
    """A turn with its run's details."""
    return _details(client, turn_id, owner)


def _details(client: Client, turn_id: str, owner: str) -> r.TurnDetails:
    record = owned_turn(client, turn_id, owner)
    run = client.run_state(turn_id)
    approvals = client.approvals_of(turn_id) if run.approval_count else ()
    return r.TurnDetails.of_run(record, run, approvals)


@router.get(
    "/turns/{turn_id}/events",
    tags=["turns"],
    response_class=EventSourceResponse,
    responses=EVENT_STREAM,
)
async def events(
    turn_id: str,
    *,
    client: ClientDep,
    feeds: FeedsDep,
    settings: SettingsDep,
    owner: Tenant,
    after: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
    last_event_id: Annotated[
        str | None,
        Header(max_length=20, pattern=r"^\s*[0-9]*\s*$", description="The last seq seen"),
    ] = None,
) -> EventSourceResponse:
    """The turn's events after ``?after=`` or ``Last-Event-ID`` (0 if neither), each once
    and in order, closing after ``end``; for a turn still queued, running, or long over."""
    start = after if after is not None else _last_event_id(last_event_id)
    record = await asyncio.to_thread(owned_turn, client, turn_id, owner)

    async def stream() -> AsyncIterator[bytes]:
        try:
            async for frames in feeds.frames(turn_id, start, encode=sse_bytes, record=record):
                yield frames
        except FellBehind as exc:
            log.info("dropped a slow subscriber: %s", exc)

    return event_stream(stream(), settings)


def _last_event_id(value: str | None) -> int:
    """The seq a ``Last-Event-ID`` names (digits, as its pattern says).  No seq is above
    :data:`MAX_SEQ`, so a larger one asks for what :data:`MAX_SEQ` does: nothing more."""
    if value is None or not value.strip():
        return 0
    try:
        seq = int(value)
    except ValueError:
        raise InvalidRequest("Last-Event-ID must be a seq (a whole number)") from None
    if seq < 0:
        raise InvalidRequest("Last-Event-ID must be a seq (a whole number)")
    return min(seq, MAX_SEQ)


SSE_LINE_END = "\n"
"""What ends an SSE line here.  sse_starlette's response takes a ``sep`` for what it
encodes itself, but a ``ServerSentEvent`` keeps its own (CRLF unless told)."""


def sse_of(event: Event) -> ServerSentEvent:
    """An event as SSE: ``id: SEQ``, ``event: KIND``, ``data: Event.to_json()``."""
    return ServerSentEvent(
        data=json.dumps(event.to_json(), separators=(",", ":")),
        event=str(event.kind),
        id=str(event.seq),
        sep=SSE_LINE_END,
    )


def sse_bytes(event: Event) -> bytes:
    """An event's SSE frame, encoded (what :func:`sse_of` makes, as bytes)."""
    return sse_of(event).encode()


def event_stream(
    frames: AsyncIterator[ServerSentEvent] | AsyncIterator[bytes],
    settings: GatewaySettings,
    **headers: str,
) -> EventSourceResponse:
    """A ``text/event-stream`` response of ``frames`` with ``: keep-alive`` comments while
    idle; lines end in LF (the form every SSE parser takes)."""
    return EventSourceResponse(
        frames,
        ping=settings.keepalive_seconds,
        ping_message_factory=lambda: ServerSentEvent(comment="keep-alive", sep=SSE_LINE_END),
        sep=SSE_LINE_END,
        headers={"Cache-Control": "no-cache", **headers},
    )


@router.get(
    "/turns/{turn_id}/result",
    response_model=r.TurnDetails,
    tags=["turns"],
    responses={202: {"model": r.TurnDetails, "description": "Still running after the wait"}},
)
async def result(
    turn_id: str,
    client: ClientDep,
    ends: EndsDep,
    owner: Tenant,
    wait: Annotated[float, Query(ge=0, le=r.MAX_WAIT_SECONDS)] = 0,
) -> JSONResponse:
    """The turn once it has ended (``200``), waiting up to ``wait`` seconds for it; ``202``
    with the turn as it stands if it is still going."""
    details = await asyncio.to_thread(_details, client, turn_id, owner)
    # The process's one watcher of ends tells when to ask the store again: on an end
    # published, else every so often (the store holds the truth).
    loop = asyncio.get_running_loop()
    deadline, seen = loop.time() + wait, 0
    while not details.status.terminal and (left := deadline - loop.time()) > 0:
        seen = await ends.end_after(turn_id, seen, left) or seen
        details = await asyncio.to_thread(_details, client, turn_id, owner)
    status = 200 if details.status.terminal else 202
    return JSONResponse(details.model_dump(mode="json"), status_code=status)


@router.post("/turns/{turn_id}/say", status_code=202, response_model=r.Accepted, tags=["turns"])
def say(turn_id: str, body: r.SayRequest, client: ClientDep, owner: Tenant) -> r.Accepted:
    """A message for the model at the turn's next step boundary; ``409 TurnEnded`` once
    the turn has ended (the message then goes nowhere, and you are told)."""
    _handle(client, turn_id, owner).say(body.text)
    return r.Accepted(turn_id=turn_id, accepted="say")


@router.post(
    "/turns/{turn_id}/interrupt", status_code=202, response_model=r.Accepted, tags=["turns"]
)
def interrupt(turn_id: str, client: ClientDep, owner: Tenant) -> r.Accepted:
    """Stop the turn at its next step boundary (at once while the model streams); it
    stays resumable.  ``409 TurnEnded`` once it has ended."""
    _handle(client, turn_id, owner).interrupt()
    return r.Accepted(turn_id=turn_id, accepted="interrupt")


@router.post("/turns/{turn_id}/resume", status_code=202, response_model=r.Turn, tags=["turns"])
def resume(turn_id: str, client: ClientDep, owner: Tenant) -> r.Turn:
    """Continue a cancelled, failed or stranded turn from its last committed step (the
    same turn and run)."""
    record = owned_turn(client, turn_id, owner)
    handle = client.session(record.session_id).resume(turn_id)
    return r.Turn.of(handle.record())


@router.post(
    "/turns/{turn_id}/approvals/{approval_id}",
    response_model=r.Approval,
    tags=["turns"],
)
def answer_approval(
    turn_id: str, approval_id: str, body: r.ApprovalDecision, client: ClientDep, owner: Tenant
) -> r.Approval:
    """Answer a call that waits for a person: ``approve`` runs it once the step's last
    answer is in, ``deny`` gives the model a result saying so (with ``reason``).  ``409
    Conflict`` if it has its answer already (the message names it), ``422`` if the turn
    has no such call."""
    handle = _handle(client, turn_id, owner)
    if body.decision == "approve":
        return r.Approval.of(handle.approve(approval_id, reason=body.reason))
    return r.Approval.of(handle.deny(approval_id, reason=body.reason))


def _handle(client: Client, turn_id: str, owner: str) -> TurnHandle:
    owned_turn(client, turn_id, owner)
    return client.attach(turn_id)
