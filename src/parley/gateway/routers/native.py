"""parley's own HTTP interface (docs/http.md#4-routes): sessions and turns as JSON, a turn's
events as Server-Sent Events.

Routes that only touch the store are plain functions, which FastAPI runs on its thread
pool; the event stream and the result's wait are asynchronous, never a thread of their
own: the stream reads the turn through the process's shared feed (``feeds.py``), the wait
through the process's one watcher of ends (``ends_watch.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Body, Header, Query, Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from parley.client import Client
from parley.errors import CompactionNotFound, InvalidRequest, SessionNotFound
from parley.gateway import resources as r
from parley.gateway.dependencies import (
    ClientDep,
    EndsDep,
    FeedsDep,
    HeavyDep,
    SettingsDep,
    Tenant,
)
from parley.gateway.event_streams import EVENT_STREAM, event_stream, sse_bytes
from parley.gateway.feeds import Feeds, FellBehind
from parley.gateway.ownership import OwnedSession, OwnedTurn, StreamedTurn
from parley.gateway.sample_files import add_sample_files
from parley.gateway.settings import GatewaySettings
from parley.gateway.tenants import owned_session, owned_turn, plausible_id
from parley.gateway.tree_events import tree_sse_bytes
from parley.gateway.tree_feed import tree_feed
from parley.gateway.work import light
from parley.schemas.records import Approval, TaskContract, TurnRecord
from parley.session import Session
from parley.store.ids import new_id
from parley.tree_stream import check_cursor
from parley.validation import MAX_SEQ, check_metadata
from parley.workspaces import workspace_root

log = logging.getLogger("parley.gateway")

router = APIRouter(prefix="/v1", responses=r.ERRORS)

MAX_SEQ_HEADER = 20
"""The longest ``Last-Event-ID`` a plain stream takes (a seq's digits, padded)."""
MAX_CURSOR_HEADER = 12_000
"""The longest a tree's cursor may be in ``Last-Event-ID`` (some 60 bytes a turn of the
tree: about 200 turns; past it, follow a subtree from its own turn)."""


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
    batch_sessions: Annotated[
        bool,
        Query(
            description="false: only conversations, not the sessions batch lines opened "
            "(GET /v1/batches/{id}/lines lists a batch's)"
        ),
    ] = True,
) -> r.Sessions:
    """The tenant's sessions, newest first; ``before`` (a session id) pages on;
    ``batch_sessions=false`` leaves out those its batches' lines opened."""
    if before is not None and not plausible_id(before):
        raise SessionNotFound(f"no session {before!r}")
    records = client.session_records(
        tenant=owner, limit=limit, before=before, batch_sessions=batch_sessions
    )
    return r.Sessions(sessions=[r.Session.of(record) for record in records])


@router.get("/sessions/{session_id}", response_model=r.Session, tags=["sessions"])
def get_session(record: OwnedSession) -> r.Session:
    """A session."""
    return r.Session.of(record)


@router.patch("/sessions/{session_id}", response_model=r.Session, tags=["sessions"])
def update_session(record: OwnedSession, body: r.SessionUpdate, client: ClientDep) -> r.Session:
    """Change what a session shows: its ``title``."""
    session = Session(client.runtime, record)
    session.set_title(body.title)
    return r.Session.of(client.session_record(session.id))


@router.post(
    "/sessions/{session_id}/turns",
    status_code=202,
    response_model=r.Turn,
    tags=["turns"],
    responses={200: {"model": r.Turn, "description": "A repeated request_id: the same turn"}},
)
async def submit_turn(
    session_id: str,
    body: r.TurnCreate,
    *,
    client: ClientDep,
    feeds: FeedsDep,
    owner: Tenant,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    prefer: Annotated[
        str | None,
        Header(
            max_length=200,
            description="stream: the turn's events will be read next "
            "(GET /v1/turns/{id}/events); the gateway starts following it now, and says "
            "so with Preference-Applied: stream",
        ),
    ] = None,
) -> r.Turn:
    """Queue a turn (``202``); the same ``request_id`` (or ``Idempotency-Key``) again
    answers the turn it made (``200``) and queues nothing.  With ``Prefer: stream``,
    the turn's stream from this gateway starts without a read of its own."""
    if body.request_id and idempotency_key and body.request_id != idempotency_key:
        raise InvalidRequest("request_id and the Idempotency-Key header differ")
    request_id = body.request_id or idempotency_key or None
    contract = None
    if body.max_steps is not None or body.max_tokens is not None:
        contract = TaskContract(max_steps=body.max_steps, max_tokens=body.max_tokens)

    def submitted() -> tuple[TurnRecord, bool]:
        # The tenant's check and the submission on one trip to the thread pool (as a
        # dependency, the check would take one of its own on the turn's way to its
        # kick); the session as the check read it (client.session would read it again).
        record = owned_session(client, session_id, owner)
        handle = Session(client.runtime, record).submit(
            body.prompt,
            contract=contract,
            request_id=request_id,
            if_busy=body.if_busy,
            context=body.context,
            priority=body.priority,
            at=body.at,
            after=body.after,
        )
        # A new turn as submitted (queued: a driver that claimed it since is news the
        # events bring), for one query less on every submission's path; a repeat as it
        # is now.
        return (handle.submitted if handle.created else handle.record()), handle.created

    turn, created = await light(submitted)
    if _prefers_stream(prefer) and feeds.follow_submitted(turn, owner):
        response.headers["Preference-Applied"] = "stream"
    if not created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/turns/{turn.turn_id}"
    return r.Turn.of(turn)


def _prefers_stream(prefer: str | None) -> bool:
    """Whether a ``Prefer`` header (RFC 7240: preferences separated by commas, each with
    its parameters after ``;``) holds ``stream``."""
    if not prefer:
        return False
    return any(
        preference.split(";", 1)[0].split("=", 1)[0].strip().lower() == "stream"
        for preference in prefer.split(",")
    )


@router.get("/sessions/{session_id}/history", response_model=r.Turns, tags=["sessions"])
def history(record: OwnedSession, client: ClientDep) -> r.Turns:
    """The turns root → head: what the model sees."""
    return r.Turns(turns=[r.Turn.of(t) for t in client.history_of(record.session_id)])


@router.get("/sessions/{session_id}/tree", response_model=r.Turns, tags=["sessions"])
def tree(record: OwnedSession, client: ClientDep) -> r.Turns:
    """Every turn of every branch, in submission order."""
    return r.Turns(turns=[r.Turn.of(t) for t in client.tree_of(record.session_id)])


@router.post("/sessions/{session_id}/branch", response_model=r.Session, tags=["sessions"])
def branch(
    record: OwnedSession, body: r.BranchRequest, client: ClientDep, owner: Tenant
) -> r.Session:
    """Move the head to one of the session's turns: the next turn hangs under it."""
    owned_turn(client, body.turn_id, owner)  # another tenant's turn is unknown here
    client.session(record.session_id).branch_from(body.turn_id)
    return r.Session.of(client.session_record(record.session_id))


@router.post(
    "/sessions/{session_id}/compact",
    status_code=201,
    response_model=r.Compaction,
    tags=["sessions"],
)
async def compact(
    record: OwnedSession, body: r.CompactRequest, client: ClientDep, heavy: HeavyDep, owner: Tenant
) -> r.Compaction:
    """Compact the history now, between turns (``409`` while a turn is unfinished):
    from the next turn on, the model sees all but the newest ``keep_turns`` turns as
    the compaction's form of them (docs/compaction.md).  A summary is a model call, as
    long as the provider takes: heavy work (docs/security.md#6-heavy-work), within the
    tenant's share of its threads, never on the pool every route's reads share."""

    def made() -> r.Compaction:
        session = Session(client.runtime, record)
        kept = session.compact(strategy=body.strategy, keep_turns=body.keep_turns, keep=body.keep)
        return r.Compaction.of(kept)

    return await heavy.run(owner, made)


@router.get("/sessions/{session_id}/compactions", response_model=r.Compactions, tags=["sessions"])
def compactions(record: OwnedSession, client: ClientDep) -> r.Compactions:
    """The session's compactions, oldest first, dropped ones too."""
    listed = Session(client.runtime, record).compactions()
    return r.Compactions(compactions=[r.Compaction.of(c) for c in listed])


@router.delete(
    "/sessions/{session_id}/compactions/{compaction_id}",
    response_model=r.Compaction,
    tags=["sessions"],
)
def drop_compaction(record: OwnedSession, compaction_id: str, client: ClientDep) -> r.Compaction:
    """Drop a compaction: from the next turn on the model sees what it covered again
    (the record stays listed, dropped)."""
    if not plausible_id(compaction_id):  # unknown, without a query
        session_id = record.session_id
        raise CompactionNotFound(f"session {session_id!r} has no compaction {compaction_id!r}")
    return r.Compaction.of(Session(client.runtime, record).drop_compaction(compaction_id))


# ---------------------------------------------------------------------------- turns


@router.get("/turns/{turn_id}", response_model=r.TurnDetails, tags=["turns"])
def get_turn(record: OwnedTurn, client: ClientDep) -> r.TurnDetails:
    """A turn with its run's details."""
    return _details(client, record)


def _details(client: Client, record: TurnRecord) -> r.TurnDetails:
    run = client.run_state(record.turn_id)
    approvals = client.approvals_of(record.turn_id) if run.approval_count else ()
    pending: list[Approval] = [a for a in approvals if a.pending]
    children = client.store.children_of_run(run.run_id)
    if any(not child.status.terminal for child in children):
        # Its running descendants' calls too, each with its path (docs/sub-agents.md).
        pending = client.attach(record.turn_id).approvals()
    usage = client.store.turn_usage(run, bool(children))
    return r.TurnDetails.of_run(record, run, usage, pending, children)


@router.get(
    "/turns/{turn_id}/events",
    tags=["turns"],
    response_class=EventSourceResponse,
    responses=EVENT_STREAM,
)
async def events(
    record: StreamedTurn,
    *,
    client: ClientDep,
    feeds: FeedsDep,
    settings: SettingsDep,
    after: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
    children: Annotated[
        bool, Query(description="The turn's tree: every descendant's events too, with path")
    ] = False,
    last_event_id: Annotated[
        str | None,
        Header(
            max_length=MAX_CURSOR_HEADER,
            pattern=r"^\s*[A-Za-z0-9_-]*\s*$",
            description="The last seq seen (with children=1: the last event's id, a cursor)",
        ),
    ] = None,
) -> EventSourceResponse:
    """The turn's events after ``?after=`` or ``Last-Event-ID`` (0 if neither), each once
    and in order, closing after ``end``; for a turn still queued, running, or long over.
    With ``children=1``, the turn's tree (docs/sub-agents.md#one-stream-for-the-tree):
    each event's ``id`` is a cursor to resume after it with ``Last-Event-ID``."""
    if children:
        return _tree_events(record, feeds, settings, after, last_event_id)
    start = after if after is not None else _last_event_id(last_event_id)
    turn_id = record.turn_id

    async def stream() -> AsyncIterator[bytes]:
        try:
            async for frames in feeds.frames(turn_id, start, encode=sse_bytes, record=record):
                yield frames
        except FellBehind as exc:
            log.info("dropped a slow subscriber: %s", exc)

    return event_stream(stream(), settings)


def _tree_events(
    record: TurnRecord,
    feeds: Feeds,
    settings: GatewaySettings,
    after: int | None,
    last_event_id: str | None,
) -> EventSourceResponse:
    """The tree's stream from the cursor ``Last-Event-ID`` names (none: the start),
    refused (422, before any frame) for an ``after`` seq or a cursor of no such tree.
    Read from the shared feeds (``tree_feed``): a reader that falls too far behind is
    dropped, and resumes from its last cursor."""
    if after:
        raise InvalidRequest("with children=1, resume with Last-Event-ID (an event's id)")
    cursor = (last_event_id or "").strip() or None
    check_cursor(record.turn_id, cursor)

    async def stream() -> AsyncIterator[bytes]:
        events = tree_feed(feeds, record.turn_id, cursor)
        try:
            async for event in events:
                yield tree_sse_bytes(event)
        except FellBehind as exc:
            log.info("dropped a slow subscriber: %s", exc)
        except Exception:  # a broken reader: logged, and the stream closes (it resumes)
            log.exception("a turn's tree stream failed")
        finally:
            await events.aclose()

    return event_stream(stream(), settings)


def _last_event_id(value: str | None) -> int:
    """The seq a ``Last-Event-ID`` names (digits: a plain stream's ids are seqs).  No seq
    is above :data:`MAX_SEQ`, so a larger one asks for what :data:`MAX_SEQ` does: nothing
    more."""
    if value is None or not value.strip():
        return 0
    if not value.strip().isdigit() or len(value) > MAX_SEQ_HEADER:
        raise InvalidRequest("Last-Event-ID must be a seq (a whole number)")
    return min(int(value), MAX_SEQ)


@router.get(
    "/turns/{turn_id}/result",
    response_model=r.TurnDetails,
    tags=["turns"],
    responses={202: {"model": r.TurnDetails, "description": "Still running after the wait"}},
)
async def result(
    record: OwnedTurn,
    client: ClientDep,
    ends: EndsDep,
    wait: Annotated[float, Query(ge=0, le=r.MAX_WAIT_SECONDS)] = 0,
) -> JSONResponse:
    """The turn once it has ended (``200``), waiting up to ``wait`` seconds for it; ``202``
    with the turn as it stands if it is still going."""
    turn_id = record.turn_id
    details = await light(_details, client, record)
    # The process's one watcher of ends tells when to ask the store again: on an end
    # published, else every so often (the store holds the truth).
    loop = asyncio.get_running_loop()
    deadline, seen = loop.time() + wait, 0
    while not details.status.terminal and (left := deadline - loop.time()) > 0:
        seen = await ends.end_after(turn_id, seen, left) or seen
        details = await light(_details, client, client.turn_record(turn_id))
    status = 200 if details.status.terminal else 202
    return JSONResponse(details.model_dump(mode="json"), status_code=status)


@router.post("/turns/{turn_id}/say", status_code=202, response_model=r.Accepted, tags=["turns"])
def say(record: OwnedTurn, body: r.SayRequest, client: ClientDep) -> r.Accepted:
    """A message for the model at the turn's next step boundary; ``409 TurnEnded`` once
    the turn has ended (the message then goes nowhere, and you are told)."""
    client.attach(record.turn_id).say(body.text)
    return r.Accepted(turn_id=record.turn_id, accepted="say")


@router.post(
    "/turns/{turn_id}/interrupt", status_code=202, response_model=r.Accepted, tags=["turns"]
)
def interrupt(record: OwnedTurn, client: ClientDep) -> r.Accepted:
    """Stop the turn at its next step boundary (at once while the model streams); it
    stays resumable.  ``409 TurnEnded`` once it has ended."""
    client.attach(record.turn_id).interrupt()
    return r.Accepted(turn_id=record.turn_id, accepted="interrupt")


@router.post("/turns/{turn_id}/resume", status_code=202, response_model=r.Turn, tags=["turns"])
def resume(record: OwnedTurn, client: ClientDep) -> r.Turn:
    """Continue a cancelled, failed or stranded turn from its last committed step (the
    same turn and run)."""
    handle = client.session(record.session_id).resume(record.turn_id)
    return r.Turn.of(handle.record())


@router.post(
    "/turns/{turn_id}/signals", status_code=202, response_model=r.SignalSent, tags=["turns"]
)
def signal(record: OwnedTurn, body: r.SignalBody, client: ClientDep) -> r.SignalSent:
    """Send the event ``name`` to the turn (docs/time.md#waiting-for-an-event): the first
    of its calls waiting for it wakes with ``payload`` as its result, exactly once; with
    none waiting it is kept until one does.  ``409 TurnEnded`` once the turn has ended,
    ``422`` for a bad name or payload (nothing is kept)."""
    delivered = client.attach(record.turn_id).signal(body.name, body.payload)
    return r.SignalSent(turn_id=record.turn_id, name=body.name, delivered=delivered)


@router.post(
    "/turns/{turn_id}/approvals/{approval_id}",
    response_model=r.Approval,
    tags=["turns"],
)
def answer_approval(
    record: OwnedTurn, approval_id: str, body: r.ApprovalDecision, client: ClientDep
) -> r.Approval:
    """Answer a call that waits for a person: ``approve`` runs it once the step's last
    answer is in, ``deny`` gives the model a result saying so (with ``reason``).  ``409
    Conflict`` if it has its answer already (the message names it), ``422`` if the turn
    has no such call."""
    handle = client.attach(record.turn_id)
    if body.decision == "approve":
        return r.Approval.of(handle.approve(approval_id, reason=body.reason))
    return r.Approval.of(handle.deny(approval_id, reason=body.reason))
