"""Batches (docs/batches.md): many turns submitted as one, watched as one, and collected
as one file, in the shape of OpenAI's Batch API over Responses or chat completions.

:func:`submit_batch` reads the lines as they come (a malformed one is refused alone) and
has them accepted (:mod:`parley.batch_acceptance`: a chunk per transaction, seen and run
only once whole); then it starts the lines: the fleet's batch window
(src/parley/runtime/batch_window.py) or this process's.  :class:`Batch` is the handle: its
status, its results as its lines end, its cancel.  The output and error files are read
from the store a page at a time (:func:`file_content`), never held whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parley.batch_acceptance import Accepted, Placement, accept
from parley.errors import (
    BatchNotFound,
    FileNotFound,
    InvalidRequest,
    TurnEnded,
    WaitTimeout,
)
from parley.openai_api.batch_lines import read_lines
from parley.openai_api.batch_objects import COMPLETION_WINDOW, batch_object, result_line
from parley.openai_api.jsonl import given_lines, jsonl_stream
from parley.ports.admission import parse_tenant_weights
from parley.runtime.batch_window import fill_batch_window
from parley.schemas.batches import (
    BatchCounts,
    BatchLine,
    BatchRecord,
    Endpoint,
    FileKind,
    FileRecord,
)
from parley.store.batch_acceptance import NewBatch
from parley.store.ids import storable
from parley.turn_handle import TurnHandle
from parley.validation import MAX_REQUEST_ID, check_metadata
from parley.workspaces import check_tenant, workspaces_dir

if TYPE_CHECKING:
    from parley.client_runtime import Runtime

PAGE = 200
"""Lines read (and rendered) per query of an output or error file."""
FILE_PART = 1 << 20
"""Bytes of a JSONL file read at a time."""
ENDED_LAG = timedelta(seconds=5)
"""How far back :meth:`Batch.results` reads again each time: a line's end is stamped
before its transaction commits, so one stamped just before the last read can commit just
after."""


BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")
FILE_ID = re.compile(r"file-[0-9a-f]{32}")


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


@dataclass(frozen=True, kw_only=True)
class BatchState:
    """A batch as :meth:`Batch.status` reads it: the Batch object's fields (times in
    seconds since the epoch, as OpenAI's; ``usage`` OpenAI's, what the ended lines
    spent; ``model`` the one that ran them), and ``counts`` with where the unfinished
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
    model: str | None = None
    usage: dict[str, Any] | None = None

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

    def __init__(self, runtime: Runtime, batch_id: str) -> None:
        self._runtime = runtime
        self.id = batch_id

    def __repr__(self) -> str:
        return f"Batch({self.id!r})"

    def status(self) -> BatchState:
        """Where the batch stands now."""
        return BatchState.of(self._runtime.store.get_batch(self.id))

    def results(
        self,
        *,
        poll: float = 0.5,
        timeout: float | None = None,
        on_wait: Callable[[BatchState], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The output and error lines (dicts, as in the files), each once, as the lines
        end; the iterator ends when the batch has.  :class:`WaitTimeout` after
        ``timeout`` seconds.  ``on_wait`` is told the batch as it stands each time the
        iterator waits ``poll`` seconds for more lines (what it raises ends the
        iteration)."""
        store = self._runtime.store
        deadline = None if timeout is None else time.monotonic() + timeout
        yield from self._refused()
        given: set[int] = set()
        newest = store.get_batch(self.id).created_at
        while True:
            record = store.get_batch(self.id)
            ended = record.ended_at is not None
            # From a little before the newest end read: a line's end is stamped before
            # its transaction commits, so one stamped earlier may show up later.
            after = (newest - ENDED_LAG, 0)
            while page := store.lines_ended_after(self.id, after, PAGE):
                fresh = [line for line in page if line.line not in given]
                yield from _rendered(self._runtime, self.id, fresh)
                given.update(line.line for line in fresh)
                last = page[-1]
                assert last.ended_at is not None
                after, newest = (last.ended_at, last.line), max(newest, last.ended_at)
                if len(page) < PAGE:
                    break
            if ended:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout(f"batch {self.id} has not ended after {timeout}s")
            if on_wait is not None:
                on_wait(BatchState.of(record))
            time.sleep(poll)

    def _refused(self) -> Iterator[dict[str, Any]]:
        """The error file's lines of the lines refused as the batch was accepted."""
        after = 0
        while page := self._runtime.store.refused_lines(self.id, after, PAGE):
            yield from _rendered(self._runtime, self.id, page)
            after = page[-1].line

    def output(self) -> Iterator[dict[str, Any]]:
        """The output file's lines as they stand (the answered lines, in file order)."""
        return batch_file_lines(self._runtime, self.id, FileKind.BATCH_OUTPUT)

    def errors(self) -> Iterator[dict[str, Any]]:
        """The error file's lines as they stand (refused, failed, cancelled)."""
        return batch_file_lines(self._runtime, self.id, FileKind.BATCH_ERROR)

    def cancel(self) -> BatchState:
        """Cancel the batch: lines not started never run, running ones are interrupted
        at their next step boundary (what they committed stays); ends ``cancelled``
        once they have stopped.  Cancelling an ended batch changes nothing."""
        cancel_batch(self._runtime, self.id)
        return self.status()


# ---------------------------------------------------------------------------- submit


def submit_batch(
    runtime: Runtime,
    lines: Iterable[Any] | str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    tenant: str | None = None,
    request_id: str | None = None,
    input_file_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    endpoint: str = Endpoint.RESPONSES,
) -> Batch:
    """See :meth:`parley.client.Client.submit_batch`."""
    check_batch_options(tenant, request_id, metadata)
    given_root = _root(root)
    return submit_numbered(
        runtime,
        _numbered(lines),
        Placement(tenant=tenant, root=given_root, workspaces=workspaces_dir(runtime.settings)),
        request_id=request_id,
        input_file_id=input_file_id,
        metadata=metadata,
        endpoint=_endpoint(endpoint),
    )


def submit_numbered(
    runtime: Runtime,
    lines: Iterable[tuple[int, Any]],
    placement: Placement,
    *,
    request_id: str | None = None,
    input_file_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    endpoint: Endpoint = Endpoint.RESPONSES,
) -> Batch:
    """Submit the numbered lines (``(number, decoded line or its refusal)``), each a
    request to ``endpoint``, as a batch placed as ``placement`` says; the options as
    :func:`submit_batch`'s, checked."""
    runtime.ready()  # a client that cannot run turns says so before any write
    batch = NewBatch(
        batch_id=new_batch_id(),
        tenant=placement.tenant,
        input_file_id=input_file_id,
        output_file_id=new_file_id(),
        error_file_id=new_file_id(),
        endpoint=endpoint.value,
        completion_window=COMPLETION_WINDOW,
        metadata=metadata,
        request_id=request_id,
    )
    accepted = accept(runtime, batch, read_lines(lines, endpoint), placement)
    if accepted.created:
        start_lines(runtime, accepted)
    return Batch(runtime, accepted.record.batch_id)


def check_batch_options(
    tenant: str | None, request_id: str | None, metadata: dict[str, Any] | None
) -> None:
    """:class:`InvalidRequest` unless a batch may be made with these."""
    check_tenant(tenant)  # it is a directory of the workspaces
    if request_id is not None and (
        not isinstance(request_id, str)
        or not 0 < len(request_id) <= MAX_REQUEST_ID
        or not storable(request_id)
    ):
        raise InvalidRequest(f"request_id must be a string of 1 to {MAX_REQUEST_ID} characters")
    if metadata is not None:
        check_metadata(metadata)


def _endpoint(endpoint: Any) -> Endpoint:
    try:
        return Endpoint(endpoint)
    except ValueError:
        raise InvalidRequest(
            f"endpoint must be one of {[e.value for e in Endpoint]}, not {endpoint!r}"
        ) from None


def _numbered(lines: Iterable[Any] | str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """The lines with their numbers: a JSONL file's (a path), or the parsed lines."""
    if isinstance(lines, (str, os.PathLike)):
        path = Path(lines)
        if not path.is_file():
            raise InvalidRequest(f"{os.fspath(lines)!r} is not a file (a JSONL file of lines)")
        return jsonl_stream(_parts_of(path))
    if isinstance(lines, (bytes, dict)):
        raise InvalidRequest("lines must be a list of parsed lines (dicts), or a JSONL file's path")
    return given_lines(lines)


def _parts_of(path: Path) -> Iterator[bytes]:
    """A file's bytes, a MiB at a time."""
    with path.open("rb") as source:
        while data := source.read(FILE_PART):
            yield data


def _root(root: str | os.PathLike[str] | None) -> str | None:
    if root is None:
        return None
    given = os.fspath(root) if isinstance(root, (str, os.PathLike)) else None
    if not isinstance(given, str) or not given or not os.path.isdir(given):
        raise InvalidRequest(f"root must be an existing directory, not {root!r}")
    return os.path.realpath(given)


def start_lines(runtime: Runtime, accepted: Accepted) -> None:
    """Get drivers to a new batch's lines: those continuing a session as a submission
    does, the rest through the batch window."""
    for session_id in accepted.continued:
        runtime.wake(session_id, priority="batch")
    if not runtime.fleet:
        # The embedded kicker's window takes every line kicked into it.
        for session_id in accepted.opened:
            runtime.wake(session_id, priority="batch")
        return
    kicker = runtime.kicker
    fill_batch_window(
        runtime.store,
        runtime.coordinator,
        lambda session_id: kicker.kick(session_id, "batch"),
        window=runtime.settings.batch_window,
        weights=parse_tenant_weights(runtime.settings.tenant_weights),
    )


# ------------------------------------------------------------------------ cancelling


def cancel_batch(runtime: Runtime, batch_id: str) -> None:
    """End the batch's unstarted lines unrun, and interrupt the rest."""
    runtime.check_open()
    cancelled = runtime.store.cancel_batch(batch_id)
    if cancelled.ended:
        runtime.coordinator.publish(list(cancelled.ended))
    for turn_id in cancelled.unfinished:
        with contextlib.suppress(TurnEnded):  # it ended meanwhile
            TurnHandle(runtime, runtime.store.get_turn(turn_id)).interrupt()


# ----------------------------------------------------------------------------- files


def batch_file_lines(runtime: Runtime, batch_id: str, kind: FileKind) -> Iterator[dict[str, Any]]:
    """A batch's output or error file's lines as they stand, a page at a time."""
    after = 0
    while True:
        page = runtime.store.batch_lines(batch_id, kind, after, PAGE)
        if not page:
            return
        yield from _rendered(runtime, batch_id, page)
        after = page[-1].line


def _rendered(runtime: Runtime, batch_id: str, page: list[BatchLine]) -> Iterator[dict[str, Any]]:
    """A page of lines as the files have them.  The batch is read again for each page:
    a cancel may come while a file is read."""
    batch = runtime.store.batch_header(batch_id)
    turns = runtime.store.rendered_turns([line.turn_id for line in page if line.turn_id])
    for line in page:
        yield result_line(batch, line, turns.get(line.turn_id) if line.turn_id else None)


def file_content(runtime: Runtime, record: FileRecord) -> Iterator[bytes]:
    """A file's bytes, a part (or a page of lines) at a time.  A batch's file read
    whole after its batch ended has its size recorded as it goes."""
    if record.kind is FileKind.UPLOAD:
        part = 0
        while (data := runtime.store.file_part(record.file_id, part)) is not None:
            yield data
            part += 1
        return
    assert record.batch_id is not None
    ended = record.bytes is None and runtime.store.get_batch(record.batch_id).ended_at is not None
    size = 0
    for line in batch_file_lines(runtime, record.batch_id, record.kind):
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        size += len(data)
        yield data
    if ended:
        runtime.store.set_file_bytes(record.file_id, size)


def batch_of_tenant(runtime: Runtime, batch_id: str, tenant: str | None) -> BatchRecord:
    """The batch if ``tenant`` owns it; another tenant's answers as an unknown one."""
    if not isinstance(batch_id, str) or not BATCH_ID.fullmatch(batch_id):
        raise BatchNotFound(f"no batch {batch_id!r}")
    record = runtime.store.get_batch(batch_id)
    if record.tenant != tenant:
        raise BatchNotFound(f"no batch {batch_id!r}")
    return record


def file_of_tenant(runtime: Runtime, file_id: str, tenant: str | None) -> FileRecord:
    """The file if ``tenant`` owns it; another tenant's answers as an unknown one."""
    if not isinstance(file_id, str) or not FILE_ID.fullmatch(file_id):
        raise FileNotFound(f"no file {file_id!r}")
    record = runtime.store.get_file(file_id)
    if record.tenant != tenant:
        raise FileNotFound(f"no file {file_id!r}")
    return record
