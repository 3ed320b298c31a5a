"""Records of files and batches (docs/batches.md): what the store keeps and returns.

A batch's counts and usage are read from its lines' runs, never kept on its row: a line
is ``completed`` once its turn ended with a response (finished, succeeded, or incomplete:
a check or a budget stopped it), ``failed`` once it ended failed or cancelled, or if it
was refused at submission.  ``completed + failed == total`` once the batch has ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from parley.schemas.messages import StepPayload
from parley.schemas.records import TaskContract, TurnStatus, Usage


class Endpoint(StrEnum):
    """What a batch's lines are requests to (OpenAI's ``endpoint``, which every line's
    ``url`` names too): each line is a turn either way."""

    RESPONSES = "/v1/responses"
    CHAT_COMPLETIONS = "/v1/chat/completions"


class BatchStatus(StrEnum):
    """OpenAI's batch statuses that parley uses (it validates while it accepts, so a
    batch is never seen ``validating``, and it never expires)."""

    IN_PROGRESS = "in_progress"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def ended(self) -> bool:
        return self in (BatchStatus.COMPLETED, BatchStatus.CANCELLED, BatchStatus.FAILED)


class FileKind(StrEnum):
    UPLOAD = "upload"
    BATCH_OUTPUT = "batch_output"
    BATCH_ERROR = "batch_error"


ANSWERED = frozenset(
    {
        TurnStatus.FINISHED,
        TurnStatus.SUCCEEDED,
        TurnStatus.CHECK_FAILED,
        TurnStatus.BUDGET_EXCEEDED,
    }
)
"""The ends of a line that count as ``completed`` and go to the output file."""

UNANSWERED = frozenset({TurnStatus.FAILED, TurnStatus.CANCELLED})
"""The ends of a line that count as ``failed`` and go to the error file."""


@dataclass(frozen=True, kw_only=True)
class FileRecord:
    """A file: an upload, or a batch's output or error file (``bytes`` None until its
    batch has ended and it was counted)."""

    file_id: str
    tenant: str | None
    purpose: str
    filename: str
    kind: FileKind
    bytes: int | None
    batch_id: str | None
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class BatchCounts:
    """Where a batch's lines stand: ``completed`` and ``failed`` as the module says;
    of the unfinished, ``running`` (a driver has it, or its turn waits for its agent
    calls' child turns), ``waiting`` (for a person's answer), ``throttled`` (waiting for
    provider capacity), ``queued`` (the rest).  ``agents_running`` and
    ``agents_waiting`` count the child turns under the lines (docs/sub-agents.md):
    running, and queued or waiting; they are turns, not lines."""

    total: int
    completed: int = 0
    failed: int = 0
    running: int = 0
    waiting: int = 0
    throttled: int = 0
    queued: int = 0
    agents_running: int = 0
    agents_waiting: int = 0
    awaiting_agents: int = 0
    """Of the ``running`` lines, those whose turn waits for its agents (no driver has
    it: its child turns run, or wait to)."""

    @property
    def ended(self) -> int:
        return self.completed + self.failed

    def to_json(self) -> dict[str, int]:
        """OpenAI's ``request_counts``."""
        return {"total": self.total, "completed": self.completed, "failed": self.failed}


@dataclass(frozen=True, kw_only=True)
class BatchRecord:
    """A batch as stored, with its counts as of the read."""

    batch_id: str
    tenant: str | None
    input_file_id: str | None
    output_file_id: str
    error_file_id: str
    endpoint: Endpoint
    completion_window: str
    metadata: dict[str, Any] | None
    request_id: str | None
    status: BatchStatus
    errors: list[dict[str, Any]] | None
    created_at: datetime
    cancelling_at: datetime | None
    ended_at: datetime | None
    counts: BatchCounts
    usage: Usage = field(default_factory=Usage)
    """What the ended lines' turns spent, summed."""
    model: str | None = None
    """The model that ran the batch's lines, as its first line to run recorded it (None
    until one has)."""


@dataclass(frozen=True, kw_only=True)
class BatchHeader:
    """What rendering a batch's output and error lines needs of the batch: what its
    lines are requests to, and when it was cancelled (None: it was not)."""

    batch_id: str
    endpoint: Endpoint
    cancelling_at: datetime | None


@dataclass(frozen=True, kw_only=True)
class SeededHistory:
    """The conversation a line's new session starts with (a chat-completions line's
    messages before its prompt), stored as ``Session.seed_history`` stores one: the turns
    it makes (each a prompt and its steps), and the messages as given, kept beside them."""

    turns: tuple[tuple[str, tuple[StepPayload, ...]], ...]
    messages: tuple[dict[str, Any], ...]


@dataclass(frozen=True, kw_only=True)
class LinePlan:
    """A line accepted for a batch: the turn it becomes.  ``root`` is set for a line
    that opens a session of its own (its id ``session_id``); without it the line
    continues the session ``session_id``."""

    line: int
    custom_id: str
    prompt: str
    session_id: str
    root: str | None
    contract: TaskContract | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    history: SeededHistory | None = None
    """What the session it opens starts with (None: nothing)."""

    @property
    def opens_session(self) -> bool:
        return self.root is not None


@dataclass(frozen=True, kw_only=True)
class LineRefusal:
    """A line refused at submission, and why (OpenAI's error: ``code``, ``message``,
    ``param``, and ``line``)."""

    line: int
    custom_id: str | None
    code: str
    message: str
    param: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(frozen=True, kw_only=True)
class BatchLine:
    """A line as the output and error files show it: its number and ``custom_id``, and
    its turn with the turn's run status (None for a refused line, with its ``error``)."""

    line: int
    custom_id: str | None
    turn_id: str | None
    session_id: str | None
    status: TurnStatus | None
    error: dict[str, Any] | None
    ended_at: datetime | None
