"""Batches (docs/batches.md): many turns submitted as one, watched as one, and collected
as one file, in the shape of OpenAI's Batch API over Responses.

:func:`submit_batch` reads the lines (a malformed one is refused alone), resolves the
conversations the others continue, makes the workspaces of the sessions the rest open,
and stores it all in one transaction (in bulk); then it starts the lines: the fleet's
batch window (workers/runtime/batch_window.py) or this process's.  :class:`Batch` is
the handle: its status, its results as its lines end, its cancel.  The output and error
files are read from the store a page at a time (:func:`file_content`), never held whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parley.errors import (
    BatchNotFound,
    FileNotFound,
    InvalidRequest,
    SessionNotFound,
    TurnEnded,
    TurnNotFound,
    WaitTimeout,
)
from parley.openai_api.batch_lines import ParsedLine, jsonl_lines, parse_lines
from parley.openai_api.batch_objects import COMPLETION_WINDOW, batch_object, result_line
from parley.validation import MAX_REQUEST_ID, check_metadata
from parley.workspaces import LineRoots, workspaces_dir
from schemas.batches import BatchCounts, BatchRecord, FileKind, FileRecord, LinePlan, LineRefusal
from workers.runtime.batch_window import batch_window, fill_batch_window
from workers.store.batches import NewBatch
from workers.store.ids import new_id, storable, validate_ids

if TYPE_CHECKING:
    from parley.client import Client

PAGE = 200
"""Lines read (and rendered) per query of an output or error file."""
ENDED_LAG = timedelta(seconds=5)
"""How far back :meth:`Batch.results` reads again: a line's end is stamped before its
transaction commits, so one stamped just before the last read can commit just after."""


BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")
FILE_ID = re.compile(r"file-[0-9a-f]{32}")


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


@dataclass(frozen=True, kw_only=True)
class BatchState:
    """A batch as :meth:`Batch.status` reads it: the Batch object's fields (times in
    seconds since the epoch, as OpenAI's), and ``counts`` with where the unfinished
    lines stand."""

    id: str
    status: str
    request_counts: dict[str, int]
    endpoint: str
    input_file_id: str
    output_file_id: str
    error_file_id: str
    completion_window: str
    metadata: dict[str, Any] | None
    errors: dict[str, Any] | None
    created_at: int
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    counts: BatchCounts

    @property
    def ended(self) -> bool:
        return self.status in ("completed", "cancelled", "failed")

    @classmethod
    def of(cls, record: BatchRecord) -> BatchState:
        fields = batch_object(record)
        names = cls.__dataclass_fields__
        return cls(
            **{k: v for k, v in fields.items() if k in names and k != "counts"},
            counts=record.counts,
        )


class Batch:
    """A handle on a batch, from any process (``client.batch(id)``)."""

    def __init__(self, client: Client, batch_id: str) -> None:
        self._client = client
        self.id = batch_id

    def __repr__(self) -> str:
        return f"Batch({self.id!r})"

    def status(self) -> BatchState:
        """Where the batch stands now."""
        return BatchState.of(self._client.store.get_batch(self.id))

    def results(
        self, *, poll: float = 0.5, timeout: float | None = None
    ) -> Iterator[dict[str, Any]]:
        """The output and error lines (dicts, as in the files), each once, as the lines
        end; the iterator ends when the batch has.  :class:`WaitTimeout` after
        ``timeout`` seconds."""
        store = self._client.store
        deadline = None if timeout is None else time.monotonic() + timeout
        given: set[int] = set()
        since = store.get_batch(self.id).created_at - ENDED_LAG
        while True:
            ended = store.get_batch(self.id).ended_at is not None
            while True:
                page = [
                    line
                    for line in store.lines_ended_since(self.id, since, PAGE + len(given))
                    if line.line not in given
                ][:PAGE]
                if not page:
                    break
                yield from _rendered(self._client, self.id, page)
                given.update(line.line for line in page)
                stamped = [line.ended_at for line in page if line.ended_at is not None]
                if stamped:
                    since = max(since, max(stamped) - ENDED_LAG)
            if ended:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout(f"batch {self.id} has not ended after {timeout}s")
            time.sleep(poll)

    def output(self) -> Iterator[dict[str, Any]]:
        """The output file's lines as they stand (the answered lines, in file order)."""
        return batch_file_lines(self._client, self.id, FileKind.BATCH_OUTPUT)

    def errors(self) -> Iterator[dict[str, Any]]:
        """The error file's lines as they stand (refused, failed, cancelled)."""
        return batch_file_lines(self._client, self.id, FileKind.BATCH_ERROR)

    def cancel(self) -> BatchState:
        """Cancel the batch: lines not started never run, running ones are interrupted
        at their next step boundary (what they committed stays); ends ``cancelled``
        once they have stopped.  Cancelling an ended batch changes nothing."""
        cancel_batch(self._client, self.id)
        return self.status()


# ---------------------------------------------------------------------------- submit


def submit_batch(
    client: Client,
    lines: Iterable[Any] | str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    tenant: str | None = None,
    request_id: str | None = None,
    input_file_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Batch:
    """See :meth:`parley.client.Client.submit_batch`."""
    _check_options(tenant, request_id, metadata)
    given_root = _root(root)
    return submit_numbered(
        client,
        _numbered(lines),
        Placement(tenant=tenant, root=given_root, workspaces=workspaces_dir()),
        request_id=request_id,
        input_file_id=input_file_id,
        metadata=metadata,
    )


@dataclass(kw_only=True)
class Placement:
    """Whose a batch is, and where the sessions its lines open keep their files: in
    ``root`` if given, else a directory each under ``workspaces``."""

    tenant: str | None
    root: str | None
    workspaces: Path

    @cached_property
    def roots(self) -> LineRoots:
        """The maker of the lines' own workspaces (its directory made on first use)."""
        return LineRoots(self.workspaces, self.tenant)


def submit_numbered(
    client: Client,
    lines: Iterable[tuple[int, Any]],
    placement: Placement,
    *,
    request_id: str | None = None,
    input_file_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Batch:
    """Submit the numbered lines (``(number, decoded line or its refusal)``) as a batch
    placed as ``placement`` says; the options as :func:`submit_batch`'s, checked."""
    client._check_open()
    client._kicker.ready()  # a client that cannot run turns says so before any write
    tenant = placement.tenant
    parsed, refused = parse_lines(lines)
    plans: list[LinePlan] = []
    for line in parsed:
        plan = _plan(client, line, placement)
        (plans if isinstance(plan, LinePlan) else refused).append(plan)  # type: ignore[arg-type]
    refused.sort(key=lambda refusal: refusal.line)
    batch = NewBatch(
        batch_id=new_batch_id(),
        tenant=tenant,
        input_file_id=input_file_id,
        output_file_id=new_file_id(),
        error_file_id=new_file_id(),
        endpoint="/v1/responses",
        completion_window=COMPLETION_WINDOW,
        metadata=metadata,
        request_id=request_id,
    )
    record, created = client.store.create_batch(batch, plans, refused)
    if created:
        _start(client, plans)
    return Batch(client, record.batch_id)


def _check_options(
    tenant: str | None, request_id: str | None, metadata: dict[str, Any] | None
) -> None:
    if tenant is not None and (not isinstance(tenant, str) or not 0 < len(tenant) <= 64):
        raise InvalidRequest("tenant must be a non-empty string of at most 64 characters")
    if request_id is not None and (
        not isinstance(request_id, str)
        or not 0 < len(request_id) <= MAX_REQUEST_ID
        or not storable(request_id)
    ):
        raise InvalidRequest(f"request_id must be a string of 1 to {MAX_REQUEST_ID} characters")
    if metadata is not None:
        check_metadata(metadata)


def _numbered(lines: Iterable[Any] | str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """The lines with their numbers: a JSONL file's (a path), or the parsed lines."""
    if isinstance(lines, (str, os.PathLike)):
        path = Path(lines)
        if not path.is_file():
            raise InvalidRequest(f"{os.fspath(lines)!r} is not a file (a JSONL file of lines)")
        return jsonl_lines(path.read_bytes())
    if isinstance(lines, (bytes, dict)):
        raise InvalidRequest("lines must be a list of parsed lines (dicts), or a JSONL file's path")
    return enumerate(lines, start=1)


def _root(root: str | os.PathLike[str] | None) -> str | None:
    if root is None:
        return None
    given = os.fspath(root) if isinstance(root, (str, os.PathLike)) else None
    if not isinstance(given, str) or not given or not os.path.isdir(given):
        raise InvalidRequest(f"root must be an existing directory, not {root!r}")
    return os.path.realpath(given)


def _plan(client: Client, line: ParsedLine, placement: Placement) -> LinePlan | LineRefusal:
    """Where the line goes: the session it continues (the tenant's), or a new one."""
    tenant = placement.tenant
    fields: dict[str, Any] = {
        "line": line.line,
        "custom_id": line.custom_id,
        "prompt": line.prompt,
        "contract": line.contract,
        "metadata": line.metadata,
    }
    if line.previous_response_id is not None:
        session_id = _after(client, line, tenant)
    elif line.conversation is not None:
        session_id = _conversation(client, line, tenant)
    else:
        session_id = new_id()
        opened = placement.root or placement.roots.make(session_id)
        return LinePlan(session_id=session_id, root=opened, **fields)
    if isinstance(session_id, LineRefusal):
        return session_id
    return LinePlan(session_id=session_id, root=None, **fields)


def _after(client: Client, line: ParsedLine, tenant: str | None) -> str | LineRefusal:
    """The session a line continues after ``previous_response_id``: it must be the
    tenant's and its conversation's latest response (or one still to end, which will
    be); continuing after an earlier one is a branch, which a batch does not make."""
    previous = line.previous_response_id
    assert previous is not None
    try:
        validate_ids(previous)
        turn, owner = client.store.turn_and_tenant(previous)
    except (InvalidRequest, TurnNotFound):
        turn, owner = None, None
    if turn is None or (tenant is not None and owner != tenant):
        return _refusal(
            line,
            "previous_response_not_found",
            f"Previous response with id '{previous}' not found.",
            "body.previous_response_id",
        )
    head = client.store.get_session(turn.session_id).head_turn_id
    if head != turn.turn_id and turn.status.terminal:
        return _refusal(
            line,
            "previous_response_not_latest",
            f"response '{previous}' is not the latest of its conversation: a batch line "
            "continues a conversation at its end (POST /v1/responses branches from an "
            "earlier response)",
            "body.previous_response_id",
        )
    return turn.session_id


def _conversation(client: Client, line: ParsedLine, tenant: str | None) -> str | LineRefusal:
    conversation = line.conversation
    assert conversation is not None
    try:
        validate_ids(conversation)
        session = client.store.get_session(conversation)
    except (InvalidRequest, SessionNotFound):
        session = None
    if session is None or (tenant is not None and session.tenant != tenant):
        return _refusal(
            line,
            "conversation_not_found",
            f"Conversation with id '{conversation}' not found.",
            "body.conversation",
        )
    return session.session_id


def _refusal(line: ParsedLine, code: str, message: str, param: str) -> LineRefusal:
    return LineRefusal(
        line=line.line, custom_id=line.custom_id, code=code, message=message, param=param
    )


def _start(client: Client, plans: list[LinePlan]) -> None:
    """Get drivers to a new batch's lines: those continuing a session as a submission
    does, the rest through the batch window."""
    coordinator, kicker = client.coordinator, client._kicker
    continued = dict.fromkeys(p.session_id for p in plans if not p.opens_session)
    for session_id in continued:
        if coordinator.mark_work(session_id):
            kicker.kick(session_id, "batch")
    if not client.fleet:
        # This process's kicker keeps its own window: every line is kicked into it.
        for plan in plans:
            if plan.opens_session and coordinator.mark_work(plan.session_id):
                kicker.kick(plan.session_id, "batch")
        return
    fill_batch_window(
        client.store,
        coordinator,  # type: ignore[arg-type]
        lambda session_id: kicker.kick(session_id, "batch"),
        window=batch_window(),
    )


# ------------------------------------------------------------------------ cancelling


def cancel_batch(client: Client, batch_id: str) -> None:
    """End the batch's unstarted lines unrun, and interrupt the rest."""
    client._check_open()
    cancelled = client.store.cancel_batch(batch_id)
    if cancelled.ended:
        client.coordinator.publish(list(cancelled.ended))
    for turn_id in cancelled.unfinished:
        with contextlib.suppress(TurnEnded):  # it ended meanwhile
            client.attach(turn_id).interrupt()


# ----------------------------------------------------------------------------- files


def batch_file_lines(client: Client, batch_id: str, kind: FileKind) -> Iterator[dict[str, Any]]:
    """A batch's output or error file's lines as they stand, a page at a time."""
    after = 0
    while True:
        page = client.store.batch_lines(batch_id, kind, after, PAGE)
        if not page:
            return
        yield from _rendered(client, batch_id, page)
        after = page[-1].line


def _rendered(client: Client, batch_id: str, page: list[Any]) -> Iterator[dict[str, Any]]:
    turns = client.store.rendered_turns([line.turn_id for line in page if line.turn_id])
    for line in page:
        yield result_line(batch_id, line, turns.get(line.turn_id) if line.turn_id else None)


def file_content(client: Client, record: FileRecord) -> Iterator[bytes]:
    """A file's bytes, a part (or a page of lines) at a time.  A batch's file read
    whole after its batch ended has its size recorded as it goes."""
    if record.kind is FileKind.UPLOAD:
        part = 0
        while (data := client.store.file_part(record.file_id, part)) is not None:
            yield data
            part += 1
        return
    assert record.batch_id is not None
    ended = record.bytes is None and client.store.get_batch(record.batch_id).ended_at is not None
    size = 0
    for line in batch_file_lines(client, record.batch_id, record.kind):
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        size += len(data)
        yield data
    if ended:
        client.store.set_file_bytes(record.file_id, size)


def file_size(client: Client, record: FileRecord) -> FileRecord:
    """``record`` with its size: a batch's file is counted (once) when its batch has
    ended; until then it is as big as what has ended so far, which is not recorded."""
    if record.bytes is not None or record.batch_id is None:
        return record
    if client.store.get_batch(record.batch_id).ended_at is None:
        return record
    for _data in file_content(client, record):
        pass  # (counted, and recorded, as it is read)
    return client.store.get_file(record.file_id)


def batch_of_tenant(client: Client, batch_id: str, tenant: str | None) -> BatchRecord:
    """The batch if ``tenant`` owns it; another tenant's answers as an unknown one."""
    if not isinstance(batch_id, str) or not BATCH_ID.fullmatch(batch_id):
        raise BatchNotFound(f"no batch {batch_id!r}")
    record = client.store.get_batch(batch_id)
    if record.tenant != tenant:
        raise BatchNotFound(f"no batch {batch_id!r}")
    return record


def file_of_tenant(client: Client, file_id: str, tenant: str | None) -> FileRecord:
    """The file if ``tenant`` owns it; another tenant's answers as an unknown one."""
    if not isinstance(file_id, str) or not FILE_ID.fullmatch(file_id):
        raise FileNotFound(f"no file {file_id!r}")
    record = client.store.get_file(file_id)
    if record.tenant != tenant:
        raise FileNotFound(f"no file {file_id!r}")
    return record
