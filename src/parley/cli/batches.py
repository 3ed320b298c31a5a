"""``parley batch submit|list|status|results|cancel`` (docs/batches.md#on-the-command-line).

``submit`` stores the JSONL file it reads as the batch's input file (an upload, as
``POST /v1/files`` makes one), prints the batch's id as the first line of its standard
output, so a script can take it with ``head -1``, and on a terminal then shows a live
progress bar until the batch ends.  Embedded, this process runs the lines, so it waits
for them; Ctrl-C stops it, and it says what is left and what runs it
(:mod:`parley.cli.batch_runners`).  On a fleet it waits with ``--wait`` (or on a
terminal, for the bar)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from rich.console import Console
from rich.text import Text

import parley
from parley.batches import Batch, check_batch_options, new_file_id, submit_batch
from parley.cli.batch_progress import follow, summary, wait
from parley.cli.batch_runners import (
    NothingRunsIt,
    UnrunWatch,
    left_line,
    stopping_line,
    unrun_line,
)
from parley.cli.connecting import client_for, default_tenant, names_a_host
from parley.cli.output import notice
from parley.openai_api.batch_objects import batch_object
from parley.schemas.batches import BatchRecord, Endpoint, FileKind, FileRecord
from parley.store.clock import utc_now

PART_BYTES = 1 << 20
"""How much of the input file is read at a time into its upload's parts."""


def submit(args: argparse.Namespace, console: Console) -> int:
    source = Path(args.file)
    if not source.is_file():
        raise parley.errors.InvalidRequest(f"no file {args.file!r} (a JSONL file of lines)")
    client = client_for(args, runs_turns=True)
    stopping = False
    try:
        batch = _submitted(client, args, source)
        print(batch.id, flush=True)
        live = sys.stdout.isatty()
        if client.fleet and not (args.wait or live):
            return 0  # the workers run it: `parley batch status ID` follows it
        if not (client.fleet or args.wait or live):
            notice("this process runs the batch's lines: waiting for them")
        try:
            state = follow(batch, console) if live else wait(batch)
        except KeyboardInterrupt:
            stopping = True
            return _stop(client, args, batch)
        summary(state)
        return 0 if state.status == "completed" else 1
    finally:
        if not stopping:
            client.close()


def _stop(client: parley.Client, args: argparse.Namespace, batch: Batch) -> int:
    """Ctrl-C while the batch runs: let go of it (embedded, no line starts from now on
    and the running ones end first, unless Ctrl-C comes again: then they are left
    mid-step, to the next process), then say how many lines are left and what runs
    them."""
    fleet = client.fleet
    try:
        if not fleet:
            notice(stopping_line(batch.status()), "magenta")
        client.close()
    except KeyboardInterrupt:
        pass  # (Ctrl-C again: the process ends without waiting for its drivers)
    return _left(args, batch.id, fleet=fleet)


def _left(args: argparse.Namespace, batch_id: str, *, fleet: bool) -> int:
    """With this process's hold on the batch let go: how many lines are left and what
    runs them (or, if none is left, the batch's end)."""
    with client_for(args) as reader:
        state = reader.batch(batch_id).status()
    if state.ended:
        summary(state)
        return 0 if state.status == "completed" else 1
    notice(left_line(args, state, fleet=fleet), "magenta")
    return 130


def _submitted(client: parley.Client, args: argparse.Namespace, source: Path) -> Batch:
    """The batch of ``source``'s lines, the file stored as its input (the upload is
    deleted again if the batch is refused, or if ``--request-id`` names an earlier
    submission, which has its own)."""
    tenant = args.tenant or default_tenant(client)
    check_batch_options(tenant, args.request_id, None)  # (the upload is the tenant's)
    upload = _stored_input(client, source, tenant)
    try:
        batch = submit_batch(
            client.runtime,
            source,
            root=args.root,
            tenant=tenant,
            request_id=args.request_id,
            input_file_id=upload.file_id,
            endpoint=_endpoint_of(source),
        )
    except BaseException:
        client.store.delete_upload(upload.file_id)  # (none if the batch was made)
        raise
    if batch.status().input_file_id != upload.file_id:
        client.store.delete_upload(upload.file_id)
    return batch


def _endpoint_of(source: Path) -> Endpoint:
    """The endpoint a file's lines are requests to, as its first line that names a known
    one says (OpenAI's batches name it beside the file; a file of chat completions is
    a chat-completions batch here): ``/v1/responses`` if none does."""
    known = {endpoint.value: endpoint for endpoint in Endpoint}
    with source.open("rb") as lines:
        for raw in lines:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict) and line.get("url") in known:
                return known[line["url"]]
    return Endpoint.RESPONSES


def _stored_input(client: parley.Client, source: Path, tenant: str | None) -> FileRecord:
    record = FileRecord(
        file_id=new_file_id(),
        tenant=tenant,
        purpose="batch",
        filename=source.name[:255],
        kind=FileKind.UPLOAD,
        bytes=None,
        batch_id=None,
        created_at=utc_now(),
    )
    with source.open("rb") as file:
        return client.store.create_file(record, _parts(file))


def _parts(file: BinaryIO) -> Iterator[bytes]:
    while data := file.read(PART_BYTES):
        yield data


def list_batches(args: argparse.Namespace, console: Console) -> int:
    if not 1 <= args.limit <= 100:
        raise parley.errors.InvalidRequest("--limit takes a number from 1 to 100")
    with client_for(args) as client:
        store = client.store
        if args.tenant is not None:
            records = store.list_batches(tenant=args.tenant, limit=args.limit + 1, after=args.after)
        else:
            records = store.all_batches(limit=args.limit + 1, after=args.after)
    page = [batch_object(record) for record in records[: args.limit]]
    if args.json:
        listing = {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(records) > args.limit,
        }
        print(json.dumps(listing))
        return 0
    for record in records[: args.limit]:
        console.print(_listed(record), soft_wrap=True)
    if not page:
        notice("no batch yet: `parley batch submit FILE.jsonl` makes one")
    elif len(records) > args.limit:
        notice(f"more: `parley batch list --after {page[-1]['id']}`")
    return 0


def _listed(record: BatchRecord) -> Text:
    """One batch on one line: id, status, counts, when it was made (local time), whose."""
    counts = record.counts
    made = record.created_at.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    line = Text.assemble(
        (record.batch_id, "bold"),
        f"  {record.status.value:<11}  {counts.completed} completed, {counts.failed} "
        f"failed, of {counts.total}  {made}",
    )
    if record.tenant is not None:
        line.append(f"  tenant {record.tenant}", "dim")
    return line


def status(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        batch = client.batch(args.batch_id)
        if args.json:
            print(json.dumps(batch_object(client.store.get_batch(batch.id))))
            return 0
        state = batch.status()
    counts = state.request_counts
    console.print(f"batch {state.id}: {state.status}")
    console.print(
        f"  {counts['completed']} completed, {counts['failed']} failed, of {counts['total']}"
    )
    unfinished = state.counts
    console.print(
        f"  {unfinished.running} running, {unfinished.waiting} waiting for an answer, "
        f"{unfinished.throttled} waiting for capacity, {unfinished.queued} queued"
    )
    if unfinished.agents_running or unfinished.agents_waiting:
        # The lines' agent calls' child turns (docs/sub-agents.md#9-counts): turns, not lines.
        console.print(
            f"  child turns of the lines' agents: {unfinished.agents_running} running, "
            f"{unfinished.agents_waiting} waiting"
        )
    console.print(f"  input {state.input_file_id or 'none'}")
    console.print(f"  output {state.output_file_id}, errors {state.error_file_id}")
    return 0


def results(args: argparse.Namespace, console: Console) -> int:
    # Embedded with a host named, this process drives what no process drives (lines a
    # submission that stopped left); without one it reads what others run, and says so
    # if nothing does.
    runs = names_a_host(args)
    with client_for(args, runs_turns=runs) as client:
        batch = client.batch(args.batch_id)
        watch = None if (runs or client.fleet) else UnrunWatch(client)
        try:
            if args.output:
                with open(args.output, "w", encoding="utf-8") as out:
                    _write(batch.results(on_wait=watch), out)
            else:
                _write(batch.results(on_wait=watch), sys.stdout)
        except NothingRunsIt as stalled:
            notice(unrun_line(args, stalled.state), "yellow")
            return 1
    return 0


def cancel(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        state = client.batch(args.batch_id).cancel()
    counts = state.request_counts
    console.print(
        f"batch {state.id}: {state.status} ({counts['completed']} completed, "
        f"{counts['failed']} failed, of {counts['total']})"
    )
    return 0


def _write(rows: Iterator[dict[str, object]], out: TextIO) -> None:
    for row in rows:
        out.write(json.dumps(row, separators=(",", ":")) + "\n")
        out.flush()
