"""Accepting a batch (docs/batches.md#how-the-lines-reach-the-fleet): its lines read as
they come, planned (the session each continues, or a new one), written a chunk at a time
(:mod:`parley.store.batch_acceptance`), the workspace of each session a line opens made
once its chunk has committed, and the batch finished in one last transaction, which
makes it seen and run whole.

A process that stops half-way (an error, Ctrl-C) drops what it wrote and the
directories it made.  A retry of the same request id waits for an acceptance under way
and answers the batch it makes; one that finds it stalled (no line written for
:data:`STALLED_SECONDS`: its process died) drops it, and accepts the batch itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parley.errors import InvalidRequest, SessionNotFound, TurnNotFound
from parley.openai_api.batch_lines import ParsedLine
from parley.openai_api.jsonl import line_refusal
from parley.schemas.batches import BatchRecord, LinePlan, LineRefusal
from parley.store.batch_acceptance import Acceptance, NewBatch
from parley.store.ids import new_id, validate_ids
from parley.workspaces import LineRoots

if TYPE_CHECKING:
    from parley.client_runtime import Runtime

log = logging.getLogger("parley.batches")

CHUNK_LINES = 1_000
"""The most lines written per transaction."""
CHUNK_PROMPT_BYTES = 8 << 20
"""The most prompt bytes written per transaction (and held while a chunk is read)."""
STALLED_SECONDS = 60.0
"""How long an acceptance of the same request id may write no line before a retry
takes it for dead, drops it and accepts the batch itself."""
POLL_SECONDS = 0.2


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


@dataclass(frozen=True, kw_only=True)
class Accepted:
    """A batch as :func:`accept` leaves it: its record, whether this call made it, and
    the sessions its lines opened and continue (to start)."""

    record: BatchRecord
    created: bool
    opened: tuple[str, ...] = ()
    continued: tuple[str, ...] = ()


def accept(
    runtime: Runtime,
    batch: NewBatch,
    lines: Iterable[ParsedLine | LineRefusal],
    placement: Placement,
) -> Accepted:
    """Accept ``batch`` of ``lines`` (read, as :func:`~parley.openai_api.batch_lines.read_lines`
    gives them); or, if its request id made one already, that batch, unchanged."""
    existing = _claim(runtime, batch)
    if existing is not None:
        return Accepted(record=existing, created=False)
    writer = _Writer(runtime, batch, placement)
    try:
        writer.write(lines)
        record = runtime.store.finish_batch(batch.batch_id, writer.continuing)
    except BaseException:
        writer.abandon()
        raise
    continued = tuple(dict.fromkeys(plan.session_id for plan in writer.continuing))
    return Accepted(record=record, created=True, opened=tuple(writer.opened), continued=continued)


def _claim(runtime: Runtime, batch: NewBatch) -> BatchRecord | None:
    """None once ``batch`` is this call's to accept; else the batch its request id made
    (once an acceptance of it under way has finished)."""
    while True:
        found = runtime.store.open_batch(batch)
        if found is None or isinstance(found, BatchRecord):
            return found
        made = _wait_for(runtime, batch, found)
        if made is not None:
            return made


def _wait_for(runtime: Runtime, batch: NewBatch, acceptance: Acceptance) -> BatchRecord | None:
    """The batch an acceptance of the same request id makes, once it has; None once it
    is gone (it failed, or stalled and this call dropped it)."""
    assert batch.request_id is not None
    seen, since = acceptance.lines, time.monotonic()
    while not acceptance.dropping and time.monotonic() - since < STALLED_SECONDS:
        time.sleep(POLL_SECONDS)
        now = runtime.store.batch_by_request(batch.tenant, batch.request_id)
        if not isinstance(now, Acceptance):
            return now
        if now.lines != seen:
            seen, since = now.lines, time.monotonic()
        acceptance = now
    log.warning(
        "batch %s: its acceptance wrote no line for %.0f s; dropping it to accept it again",
        acceptance.batch_id,
        STALLED_SECONDS,
    )
    roots = runtime.store.drop_batch(
        acceptance.batch_id, seen=None if acceptance.dropping else seen
    )
    remove_workspaces(roots or ())
    return None


@dataclass
class _Chunk:
    """Lines read and planned, to be written in one transaction."""

    opening: list[LinePlan] = field(default_factory=list)
    refused: list[LineRefusal] = field(default_factory=list)
    prompt_bytes: int = 0

    @property
    def full(self) -> bool:
        lines = len(self.opening) + len(self.refused)
        return lines >= CHUNK_LINES or self.prompt_bytes >= CHUNK_PROMPT_BYTES


class _Writer:
    """One acceptance's writes: its chunks, the directories made after each, and the
    lines that continue conversations, kept for the last transaction."""

    def __init__(self, runtime: Runtime, batch: NewBatch, placement: Placement) -> None:
        self._runtime, self._batch, self._placement = runtime, batch, placement
        self.opened: list[str] = []
        self.continuing: list[LinePlan] = []
        self._made: list[str] = []

    def write(self, lines: Iterable[ParsedLine | LineRefusal]) -> None:
        chunk = _Chunk()
        for line in lines:
            plan = (
                _plan(self._runtime, line, self._placement)
                if isinstance(line, ParsedLine)
                else line
            )
            if isinstance(plan, LineRefusal):
                chunk.refused.append(plan)
            elif plan.opens_session:
                chunk.opening.append(plan)
                chunk.prompt_bytes += len(plan.prompt)
            else:
                self.continuing.append(plan)
            if chunk.full:
                self._write(chunk)
                chunk = _Chunk()
        self._write(chunk)

    def _write(self, chunk: _Chunk) -> None:
        """Write a chunk; then (it committed) make its sessions' workspaces."""
        if not (chunk.opening or chunk.refused):
            return
        batch = self._batch
        self._runtime.store.accept_lines(batch.batch_id, batch.tenant, chunk.opening, chunk.refused)
        self.opened.extend(plan.session_id for plan in chunk.opening)
        if self._placement.root is None:
            for plan in chunk.opening:
                assert plan.root is not None
                self._placement.roots.make(plan.root)
                self._made.append(plan.root)

    def abandon(self) -> None:
        """Drop what this acceptance wrote, and the directories it made (only once its
        rows are gone: a directory is never missing under a session that stays)."""
        try:
            roots = self._runtime.store.drop_batch(self._batch.batch_id)
        except Exception:  # (the error being raised says what went wrong)
            log.exception("batch %s: dropping its acceptance failed", self._batch.batch_id)
            return
        if roots is not None:
            remove_workspaces([*self._made, *roots])


def remove_workspaces(roots: Iterable[str]) -> None:
    """Remove the workspace directories of a dropped acceptance's sessions: each was made
    for it, and no line of it ever ran (one that holds anything is kept)."""
    for root in dict.fromkeys(roots):
        with contextlib.suppress(OSError):
            os.rmdir(root)


# ------------------------------------------------------------------------ planning


def _plan(runtime: Runtime, line: ParsedLine, placement: Placement) -> LinePlan | LineRefusal:
    """Where the line goes: the session it continues (the tenant's), or a new one."""
    tenant = placement.tenant
    fields: dict[str, Any] = {
        "line": line.line,
        "custom_id": line.custom_id,
        "prompt": line.prompt,
        "contract": line.contract,
        "metadata": line.metadata,
        "history": line.history,
    }
    if line.previous_response_id is not None:
        session_id = _after(runtime, line, tenant)
    elif line.conversation is not None:
        session_id = _conversation(runtime, line, tenant)
    else:
        session_id = new_id()
        opened = placement.root or placement.roots.path(session_id)
        return LinePlan(session_id=session_id, root=opened, **fields)
    if isinstance(session_id, LineRefusal):
        return session_id
    return LinePlan(session_id=session_id, root=None, **fields)


def _after(runtime: Runtime, line: ParsedLine, tenant: str | None) -> str | LineRefusal:
    """The session a line continues after ``previous_response_id``: it must be the
    tenant's and its conversation's latest response (or one still to end, which will
    be); continuing after an earlier one is a branch, which a batch does not make."""
    previous = line.previous_response_id
    assert previous is not None
    try:
        validate_ids(previous)
        turn, owner = runtime.store.turn_and_tenant(previous)
    except (InvalidRequest, TurnNotFound):
        turn, owner = None, None
    if turn is None or (tenant is not None and owner != tenant):
        return _refusal(
            line,
            "previous_response_not_found",
            f"Previous response with id '{previous}' not found.",
            "body.previous_response_id",
        )
    head = runtime.store.get_session(turn.session_id).head_turn_id
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


def _conversation(runtime: Runtime, line: ParsedLine, tenant: str | None) -> str | LineRefusal:
    conversation = line.conversation
    assert conversation is not None
    try:
        validate_ids(conversation)
        session = runtime.store.get_session(conversation)
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
    return line_refusal(line.line, line.custom_id, code, message, param)
