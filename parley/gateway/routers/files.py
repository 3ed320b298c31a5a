"""OpenAI's Files API, for batches (``client.files`` of the official ``openai`` package):
``POST /v1/files`` uploads a batch's input (``purpose=batch``), ``GET /v1/files/{id}``
is a file's object and ``GET /v1/files/{id}/content`` its bytes, streamed.

An upload is read from the request a MiB at a time into the store (never whole in
memory here); a batch's output and error files are read from its lines a page at a
time as they are downloaded (docs/batches.md), so they can be read while the batch runs
and cost the same whatever their size.  A tenant sees only its own files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import IO, Annotated, Any, Literal

from fastapi import APIRouter, File, Form, UploadFile
from fastapi.responses import JSONResponse, StreamingResponse

from parley.batches import file_content, file_of_tenant, file_size, new_file_id
from parley.client import Client
from parley.gateway.dependencies import ClientDep, Tenant
from parley.gateway.resources import ErrorBody
from parley.gateway.routers.openai_errors import OpenAIRoute
from parley.openai_api.batch_objects import file_object
from parley.openai_api.errors import OpenAIErrorBody
from schemas.batches import FileKind, FileRecord
from workers.store.clock import utc_now

UPLOAD_PATH = "/v1/files"
"""The route the body limit streams through (multipart, bounded by PARLEY_GATEWAY_MAX_FILE)."""
PART_BYTES = 1 << 20

ERRORS: dict[int | str, dict[str, Any]] = {
    **{
        status: {"model": OpenAIErrorBody, "description": text}
        for status, text in (
            (400, "A parameter is invalid, or one parley does not serve"),
            (401, "No bearer token (API key), or an unknown one"),
            (404, "No such file (or another tenant's)"),
        )
    },
    # Refused before the route, by the gateway's body limit, in the gateway's own form.
    411: {"model": ErrorBody, "description": "An upload without its Content-Length"},
    413: {"model": ErrorBody, "description": "The file is over PARLEY_GATEWAY_MAX_FILE"},
    415: {"model": ErrorBody, "description": "The body is not multipart/form-data"},
}

router = APIRouter(prefix="/v1", tags=["files"], responses=ERRORS, route_class=OpenAIRoute)


@router.post("/files")
async def upload_file(
    file: Annotated[UploadFile, File(description="The JSONL file of a batch's lines")],
    purpose: Annotated[Literal["batch"], Form(description="The one purpose parley serves")],
    client: ClientDep,
    owner: Tenant,
) -> JSONResponse:
    """Upload a batch's input file; answers its File object."""
    record = FileRecord(
        file_id=new_file_id(),
        tenant=owner,
        purpose=purpose,
        filename=(file.filename or "upload.jsonl")[:255],
        kind=FileKind.UPLOAD,
        bytes=None,
        batch_id=None,
        created_at=utc_now(),
    )
    stored = await asyncio.to_thread(client.store.create_file, record, _parts(file.file))
    return JSONResponse(file_object(stored))


def _parts(source: IO[bytes]) -> Iterator[bytes]:
    while data := source.read(PART_BYTES):
        yield data


@router.get("/files/{file_id}")
async def retrieve_file(file_id: str, client: ClientDep, owner: Tenant) -> JSONResponse:
    """A file's object (a batch's file's ``bytes`` once its batch has ended)."""
    record = await asyncio.to_thread(_owned, client, file_id, owner)
    return JSONResponse(file_object(await asyncio.to_thread(file_size, client, record)))


@router.get(
    "/files/{file_id}/content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "The bytes"}},
)
async def file_bytes(file_id: str, client: ClientDep, owner: Tenant) -> StreamingResponse:
    """A file's bytes, streamed: an upload as it was sent; a batch's output or error file
    as JSONL, its lines that have ended so far, in file order."""
    record = await asyncio.to_thread(_owned, client, file_id, owner)
    kind = "application/octet-stream" if record.kind is FileKind.UPLOAD else "application/jsonl"
    # A sync iterator: Starlette reads it on its thread pool, a part or a page at a time.
    return StreamingResponse(file_content(client, record), media_type=kind)


def _owned(client: Client, file_id: str, owner: str) -> FileRecord:
    return file_of_tenant(client, file_id, owner)
