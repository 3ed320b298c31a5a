"""OpenAI's Batch API over Responses or chat completions (``client.batches`` of the
official ``openai`` package): ``POST /v1/batches`` makes a batch of an uploaded file's
lines, every line a durable turn whose response id is its turn's; ``GET
/v1/batches/{id}`` and ``GET /v1/batches`` (``limit``, ``after``) read them; ``POST
/v1/batches/{id}/cancel`` stops one.  ``GET /v1/batches/{id}/lines`` (parley's) lists a
batch's lines with their sessions, for the page.  docs/batches.md has the contract; a
tenant sees only its own.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from parley import errors
from parley.batch_acceptance import Placement
from parley.batches import (
    batch_of_tenant,
    cancel_batch,
    file_content,
    file_of_tenant,
    submit_numbered,
)
from parley.client import Client
from parley.gateway.dependencies import ClientDep, HeavyDep, SettingsDep, Tenant
from parley.gateway.openai_errors import OpenAIRoute
from parley.gateway.ownership import OwnedBatch
from parley.gateway.settings import GatewaySettings
from parley.gateway.work import light
from parley.openai_api.batch_objects import batch_object
from parley.openai_api.errors import OpenAIError, OpenAIErrorBody
from parley.openai_api.jsonl import jsonl_stream
from parley.schemas.batches import BatchRecord, Endpoint, FileKind
from parley.validation import MAX_REQUEST_ID, check_metadata

MAX_LIST = 100
MAX_LINE = 2**31 - 1
"""The largest line number a page of lines may start after (a line's number is a 32-bit
integer in the store: a larger one is refused, not a failed query)."""

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": OpenAIErrorBody, "description": text}
    for status, text in (
        (400, "A parameter is invalid, or one parley does not serve"),
        (401, "No bearer token (API key), or an unknown one"),
        (404, "No such batch (or another tenant's)"),
    )
}

router = APIRouter(prefix="/v1", tags=["batches"], responses=ERRORS, route_class=OpenAIRoute)


class BatchCreate(BaseModel):
    """``POST /v1/batches``: OpenAI's parameters."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input_file_id: str = Field(max_length=64, description="An uploaded file (purpose batch)")
    endpoint: Literal["/v1/responses", "/v1/chat/completions"] = Field(
        description="What every line is a request to (each a turn either way)"
    )
    completion_window: Literal["24h"] = Field(description="The one window OpenAI offers")
    metadata: dict[str, Any] | None = None
    output_expires_after: dict[str, Any] | None = Field(
        None, description="Accepted; files are kept until `parley prune`"
    )


@router.post("/batches")
async def create_batch(
    body: BatchCreate,
    client: ClientDep,
    settings: SettingsDep,
    heavy: HeavyDep,
    owner: Tenant,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=MAX_REQUEST_ID)] = None,
) -> JSONResponse:
    """Make a batch of the file's lines: each a turn (``priority="batch"``), in a
    session of its own or the conversation it continues.  A malformed line is refused
    alone (in the error file).  Answers the Batch object, ``in_progress``.  The same
    ``Idempotency-Key`` again (a client retrying an answer it lost) answers the batch it
    made, and makes no other; with another file or other metadata it is ``409``."""
    if body.metadata is not None:
        try:
            check_metadata(body.metadata)
        except errors.InvalidRequest as exc:
            raise OpenAIError(400, str(exc), param="metadata") from None
    record = await heavy.run(owner, _create, client, settings, owner, body, idempotency_key)
    return JSONResponse(batch_object(record))


def _create(
    client: Client,
    settings: GatewaySettings,
    owner: str,
    body: BatchCreate,
    request_id: str | None,
) -> BatchRecord:
    try:
        upload = file_of_tenant(client.runtime, body.input_file_id, owner)
    except errors.FileNotFound:
        raise OpenAIError(
            400,
            f"No file found with id '{body.input_file_id}'.",
            param="input_file_id",
            code="invalid_input_file",
        ) from None
    if upload.kind is not FileKind.UPLOAD or upload.purpose != "batch":
        raise OpenAIError(
            400,
            f"file '{upload.file_id}' is not a batch's input (purpose batch)",
            param="input_file_id",
            code="invalid_input_file",
        )
    try:
        batch = submit_numbered(
            client.runtime,
            # Read a part at a time, a line decoded at a time: never the file whole.
            jsonl_stream(file_content(client.runtime, upload)),
            Placement(tenant=owner, root=None, workspaces=settings.workspaces),
            input_file_id=upload.file_id,
            metadata=body.metadata,
            request_id=request_id,
            endpoint=Endpoint(body.endpoint),
        )
    except errors.InvalidRequest as exc:
        raise OpenAIError(400, f"input file: {exc}", param="input_file_id") from None
    record = client.store.get_batch(batch.id)
    if request_id is not None:
        _same_request(record, request_id, upload.file_id, body.metadata)
    return record


def _same_request(
    record: BatchRecord, key: str, input_file_id: str, metadata: dict[str, Any] | None
) -> None:
    """Refuse a key that made ``record`` from another file or with other metadata: a key
    names one request, and its batch must not stand in for another's."""
    if (record.input_file_id, record.metadata) == (input_file_id, metadata):
        return
    raise OpenAIError(
        409,
        f"Idempotency-Key {key!r} made batch {record.batch_id} from file "
        f"{record.input_file_id} with its metadata: a key names one request; use a new "
        "key for another",
        code="idempotency_key_reused",
    )


@router.get("/batches/{batch_id}")
async def retrieve_batch(record: OwnedBatch) -> JSONResponse:
    """The Batch object, its counts as they stand."""
    return JSONResponse(batch_object(record))


@router.get("/batches")
async def list_batches(
    client: ClientDep,
    owner: Tenant,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 20,
    after: Annotated[str | None, Query(max_length=64)] = None,
) -> JSONResponse:
    """The tenant's batches, newest first: ``limit`` of them, after the batch ``after``."""

    def read() -> list[Any]:
        if after is not None:
            try:
                batch_of_tenant(client.runtime, after, owner)
            except errors.BatchNotFound:
                raise OpenAIError(
                    400, f"No batch found with id '{after}'.", param="after"
                ) from None
        return client.store.list_batches(tenant=owner, limit=limit + 1, after=after)

    records = await light(read)
    page = [batch_object(r) for r in records[:limit]]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(records) > limit,
        }
    )


@router.post("/batches/{batch_id}/cancel")
async def cancel(
    record: OwnedBatch, client: ClientDep, heavy: HeavyDep, owner: Tenant
) -> JSONResponse:
    """Cancel the batch: its lines not started never run, its running ones stop at their
    next boundary; ``cancelling`` until they have, then ``cancelled``.  An ended batch is
    answered as it is."""

    batch_id = record.batch_id

    def stop() -> Any:
        if client.store.get_batch(batch_id).ended_at is None:
            cancel_batch(client.runtime, batch_id)
        return client.store.get_batch(batch_id)

    return JSONResponse(batch_object(await heavy.run(owner, stop)))


@router.get("/batches/{batch_id}/lines")
async def batch_lines(
    record: OwnedBatch,
    client: ClientDep,
    after: Annotated[int, Query(ge=0, le=MAX_LINE)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 50,
) -> JSONResponse:
    """parley's: a page of the batch's lines after line ``after``, each with its session
    and turn (a line is an ordinary session's turn) and where it stands."""

    found = await light(client.store.batch_lines, record.batch_id, None, after, limit + 1)
    lines = found[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "line": line.line,
                    "custom_id": line.custom_id,
                    "session_id": line.session_id,
                    "turn_id": line.turn_id,
                    "status": None if line.status is None else line.status.value,
                    "error": line.error,
                }
                for line in lines
            ],
            "has_more": len(found) > limit,
        }
    )
