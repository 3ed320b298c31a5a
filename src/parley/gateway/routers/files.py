"""OpenAI's Files API, for batches (``client.files`` of the official ``openai`` package):
``POST /v1/files`` uploads a batch's input (``purpose=batch``), ``GET /v1/files`` lists
the tenant's files, ``GET /v1/files/{id}`` is a file's object, ``GET
/v1/files/{id}/content`` its bytes, streamed, and ``DELETE /v1/files/{id}`` frees it.

An upload is read from the request a MiB at a time into the store (never whole in
memory here), within the tenant's quota (``PARLEY_TENANT_STORAGE``,
docs/security.md#5-storage); a batch's output and error files are read from its lines
a page at a time as they are downloaded (docs/batches.md), so they can be read while
the batch runs and cost the same whatever their size.  A tenant sees only its own files.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import JSONResponse, StreamingResponse

from parley import errors
from parley.batches import file_content, file_of_tenant, new_file_id
from parley.client import Client
from parley.gateway.dependencies import ClientDep, HeavyDep, SettingsDep, Tenant
from parley.gateway.openai_errors import OpenAIRoute
from parley.gateway.ownership import OwnedFile
from parley.gateway.work import light
from parley.openai_api.batch_objects import file_object
from parley.openai_api.errors import OpenAIError, OpenAIErrorBody
from parley.schemas.batches import FileKind, FileRecord
from parley.store.clock import utc_now

UPLOAD_PATH = "/v1/files"
"""The route whose body the upload limits admit (``src/parley/gateway/uploads.py``)."""
PART_BYTES = 1 << 20
MAX_LIST = 10_000
"""The most files one page lists (OpenAI's bound, and its default)."""

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": OpenAIErrorBody, "description": text}
    for status, text in (
        (400, "A parameter is invalid, or one parley does not serve"),
        (401, "No bearer token (API key), or an unknown one"),
        (404, "No such file (or another tenant's)"),
        # Refused before the route reads a byte (``src/parley/gateway/uploads.py``).
        (408, "The upload did not arrive in time"),
        (411, "An upload without its Content-Length"),
        (413, "The file is over PARLEY_GATEWAY_MAX_FILE, or the tenant's quota"),
        (415, "The body is not multipart/form-data"),
        (429, "The tenant has PARLEY_GATEWAY_TENANT_UPLOADS uploads in flight"),
        (503, "The uploads in flight fill PARLEY_GATEWAY_UPLOAD_SPOOL"),
    )
}

router = APIRouter(prefix="/v1", tags=["files"], responses=ERRORS, route_class=OpenAIRoute)


@router.post("/files")
async def upload_file(
    file: Annotated[UploadFile, File(description="The JSONL file of a batch's lines")],
    purpose: Annotated[Literal["batch"], Form(description="The one purpose parley serves")],
    client: ClientDep,
    settings: SettingsDep,
    heavy: HeavyDep,
    owner: Tenant,
) -> JSONResponse:
    """Upload a batch's input file; answers its File object.  ``413`` if the tenant's
    files would then hold more than its quota (``PARLEY_TENANT_STORAGE``)."""
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
    try:
        stored = await heavy.run(
            owner, _store, client, record, _parts(file.file), settings.tenant_storage
        )
    except errors.StorageFull as exc:
        raise OpenAIError(413, str(exc), param="file", code="storage_full") from None
    return JSONResponse(_described(stored))


def _store(client: Client, record: FileRecord, parts: Iterator[bytes], quota: int) -> FileRecord:
    return client.store.create_file(record, parts, quota=quota)


def _parts(source: IO[bytes]) -> Iterator[bytes]:
    while data := source.read(PART_BYTES):
        yield data


@router.get("/files")
async def list_files(
    client: ClientDep,
    owner: Tenant,
    after: Annotated[str | None, Query(max_length=64, description="A file's id")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = MAX_LIST,
    order: Literal["asc", "desc"] = "desc",
    purpose: Annotated[str | None, Query(max_length=40)] = None,
) -> JSONResponse:
    """The tenant's files (of one ``purpose``: ``batch`` for uploads, ``batch_output`` for
    a batch's output and error files), by creation, newest first (``order=desc``):
    ``limit`` of them, after the file ``after``."""

    def read() -> list[FileRecord]:
        since = None
        if after is not None:
            try:
                since = file_of_tenant(client.runtime, after, owner)
            except errors.FileNotFound:
                raise OpenAIError(400, f"No file found with id '{after}'.", param="after") from None
        return client.store.list_files(
            owner, limit=limit + 1, after=since, purpose=purpose, newest_first=order == "desc"
        )

    records = await light(read)
    page = [_described(r) for r in records[:limit]]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(records) > limit,
        }
    )


@router.delete("/files/{file_id}")
async def delete_file(
    record: OwnedFile, client: ClientDep, heavy: HeavyDep, owner: Tenant
) -> JSONResponse:
    """Delete a file: its bytes go at once and it is served no more.  A batch made from
    an upload has every line already and runs on; a batch's output or error file is
    hidden (its lines, and their responses, go when ``parley prune`` removes the
    batch)."""

    file_id = record.file_id

    def delete() -> None:
        if not client.store.delete_file(file_id):
            raise errors.FileNotFound(f"no file {file_id!r}")  # (deleted meanwhile)

    await heavy.run(owner, delete)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


@router.get("/files/{file_id}")
async def retrieve_file(record: OwnedFile) -> JSONResponse:
    """A file's object (a batch's file's ``bytes`` once it has been read whole after its
    batch ended: null until then)."""
    return JSONResponse(_described(record))


@router.get(
    "/files/{file_id}/content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "The bytes"}},
)
async def file_bytes(
    record: OwnedFile, client: ClientDep, heavy: HeavyDep, owner: Tenant
) -> StreamingResponse:
    """A file's bytes, streamed: an upload as it was sent; a batch's output or error file
    as JSONL, its lines that have ended so far, in file order."""
    kind = "application/octet-stream" if record.kind is FileKind.UPLOAD else "application/jsonl"
    # Read a part or a page at a time, each as the tenant's heavy work.
    return StreamingResponse(
        heavy.stream(owner, file_content(client.runtime, record)), media_type=kind
    )


def _described(record: FileRecord) -> dict[str, Any]:
    """OpenAI's File object, its ``bytes`` as the store has them: a batch's output or
    error file is a query over its lines, whose size only reading every line would tell
    (the first GET of a large ended batch's file once rendered the whole file, 11.7 s),
    so it is counted as a download reads it whole (``parley.batches.file_content``), and
    null until then."""
    return {**file_object(record), "bytes": record.bytes}
