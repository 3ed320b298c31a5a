"""What crosses the gateway's wire (docs/http.md#3-resources), declared with pydantic: request
bodies are validated against these (a field they do not name is refused, so a misspelt
one is not silently ignored) and responses are built from them, which is also what the
OpenAPI document says."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from parley.gateway.settings import NAME_PATTERN
from parley.validation import (
    JSON_NUMBER,
    MAX_CONTEXT_BYTES,
    MAX_PROMPT_BYTES,
    MAX_REQUEST_ID,
    MAX_STEER_BYTES,
)
from schemas.events import Event
from schemas.records import Approval as ApprovalRecord
from schemas.records import IfBusy, RunState, SessionRecord, TurnRecord, TurnStatus
from workers.store.session_titles import MAX_TITLE_CHARS, title_problem

MAX_LIST = 200
MAX_WAIT_SECONDS = 60
# A prompt or a steer must have a character that is not white space: the client refuses
# one that strip() empties ("the prompt is empty"), and the document says so with this
# pattern (spelt out, since regex engines differ on what \s is).
WHITE_SPACE = "".join(f"\\u{code:04x}" for code in range(0x3001) if chr(code).isspace())
NOT_BLANK = f"[^{WHITE_SPACE}]"
# What a title may not hold (workers/store/session_titles.py): the C0 and C1 controls, the line
# and paragraph separators; and it must not be blank.  (Lone surrogates are refused too,
# but a range of them is a pattern Rust's regex engine, and so schemathesis, cannot read.)
UNPRINTABLE = "\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029"
ONE_LINE = f"^[^{UNPRINTABLE}]*[^{UNPRINTABLE}{WHITE_SPACE}][^{UNPRINTABLE}]*$"


class Body(BaseModel):
    """A request body: a field it does not declare is an error, and a field is the JSON
    type it declares (``"max_steps": "5"`` is refused, not read as 5; ``true`` is not 1)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _title(value: str) -> str:
    problem = title_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


SessionTitle = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_TITLE_CHARS,
        description="One line of text: no control characters.",
        json_schema_extra={"pattern": ONE_LINE},
    ),
    AfterValidator(_title),
]
"""A session's title as a request gives it (workers/store/session_titles.py)."""


class SessionCreate(Body):
    """``POST /v1/sessions``."""

    workspace: Annotated[str, Field(pattern=f"^{NAME_PATTERN}$")] | None = Field(
        None,
        description="The workspace directory's name under the tenant's; "
        "default: the new session's id. Sessions may share one.",
    )
    metadata: dict[str, Any] | None = Field(None, description="Any JSON object, kept as given.")
    title: SessionTitle | None = Field(
        None, description="What a list of sessions shows; default: the first prompt's."
    )


class SessionUpdate(Body):
    """``PATCH /v1/sessions/{id}``."""

    title: SessionTitle


class TurnCreate(Body):
    """``POST /v1/sessions/{id}/turns``.  Budgets only: a ``check`` command is never
    accepted over HTTP."""

    prompt: str = Field(
        min_length=1, max_length=MAX_PROMPT_BYTES, json_schema_extra={"pattern": NOT_BLANK}
    )
    request_id: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_REQUEST_ID,
        description="Repeated on the same session, answers the turn it made (200).",
    )
    # (strict=False: in strict mode an enum takes only its members, and JSON has strings)
    if_busy: IfBusy = Field(IfBusy.ENQUEUE, strict=False)
    priority: Literal["interactive", "batch"] = Field(
        "interactive",
        description="The turn's lane: interactive (someone waits for it; its kick and its "
        "model calls go first) or batch (docs/admission.md).",
    )
    max_steps: Annotated[int, Field(ge=1, le=10_000, strict=False), JSON_NUMBER] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=2**31 - 1, strict=False), JSON_NUMBER] | None = None
    context: dict[str, Any] | None = Field(
        None,
        description="The host context of this turn (a JSON object of at most "
        f"{MAX_CONTEXT_BYTES} bytes): it reaches the host's hooks, tools and model "
        "request, never the conversation.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_check(cls, data: Any) -> Any:
        if isinstance(data, dict) and "check" in data:
            raise ValueError("a check command is never accepted over HTTP: budgets only")
        return data


class BranchRequest(Body):
    """``POST /v1/sessions/{id}/branch``."""

    turn_id: str = Field(min_length=1, max_length=36)


class SayRequest(Body):
    """``POST /v1/turns/{id}/say``."""

    text: str = Field(
        min_length=1, max_length=MAX_STEER_BYTES, json_schema_extra={"pattern": NOT_BLANK}
    )


class ApprovalDecision(Body):
    """``POST /v1/turns/{id}/approvals/{approval_id}``."""

    decision: Literal["approve", "deny"]
    reason: str | None = Field(None, max_length=10_000)


class Session(BaseModel):
    """A session (docs/http.md#3-resources)."""

    id: str
    workspace: str
    metadata: dict[str, Any]
    head_turn_id: str | None
    created_at: datetime
    title: str | None = Field(
        description="What a list of sessions shows: the one given, else the first "
        "prompt's (null before the first turn)."
    )

    @classmethod
    def of(cls, record: SessionRecord) -> Session:
        """The wire form of a stored session."""
        return cls(
            id=record.session_id,
            workspace=Path(record.root).name,
            metadata=record.metadata,
            head_turn_id=record.head_turn_id,
            created_at=record.created_at,
            title=record.title,
        )


class Sessions(BaseModel):
    """``GET /v1/sessions``: newest first."""

    sessions: list[Session]


class Turn(BaseModel):
    """A turn (docs/http.md#3-resources): ``status`` is ``queued``, ``running``, ``waiting`` or its
    outcome."""

    turn_id: str
    session_id: str
    parent_id: str | None
    run_id: str
    prompt: str
    status: TurnStatus
    reply: str | None
    created_at: datetime

    @classmethod
    def of(cls, record: TurnRecord) -> Turn:
        """The wire form of a stored turn."""
        return cls(
            turn_id=record.turn_id,
            session_id=record.session_id,
            parent_id=record.parent_id,
            run_id=record.run_id,
            prompt=record.prompt,
            status=record.status,
            reply=record.reply,
            created_at=record.created_at,
        )


class Turns(BaseModel):
    """``history`` (root → head) and ``tree`` (every branch)."""

    turns: list[Turn]


class Usage(BaseModel):
    """Tokens a turn has used."""

    input_tokens: int
    output_tokens: int


class Approval(BaseModel):
    """A tool call that asked for a person's answer (docs/approvals.md), and the answer once given
    (``decision`` null while it waits)."""

    approval_id: str
    turn_id: str
    step: int
    call_id: str
    tool: str
    arguments: dict[str, Any]
    accesses: list[dict[str, str]]
    requested_at: datetime
    expires_at: datetime | None
    decision: Literal["approved", "denied"] | None
    reason: str | None
    decided_at: datetime | None

    @classmethod
    def of(cls, record: ApprovalRecord) -> Approval:
        """The wire form of a stored approval."""
        return cls(
            approval_id=record.approval_id,
            turn_id=record.turn_id,
            step=record.step,
            call_id=record.call_id,
            tool=record.tool,
            arguments=record.arguments,
            accesses=[dict(a) for a in record.accesses],
            requested_at=record.requested_at,
            expires_at=record.expires_at,
            decision=record.decision.value if record.decision else None,
            reason=record.reason,
            decided_at=record.decided_at,
        )


class TurnDetails(Turn):
    """``GET /v1/turns/{id}``: the turn with its run's details."""

    steps: int
    usage: Usage
    error: str | None
    undelivered: list[str] = Field(
        description="say texts accepted but never delivered: the turn stopped first"
    )
    pending_approvals: list[Approval] = Field(
        description="The calls waiting for an answer (the turn's status is then waiting)"
    )

    @classmethod
    def of_run(
        cls, record: TurnRecord, run: RunState, approvals: tuple[ApprovalRecord, ...] = ()
    ) -> TurnDetails:
        """The wire form of a stored turn, its run and its approvals."""
        return cls(
            **Turn.of(record).model_dump(),
            steps=run.steps,
            usage=Usage(input_tokens=run.usage.input_tokens, output_tokens=run.usage.output_tokens),
            error=run.error,
            undelivered=list(run.undelivered),
            pending_approvals=[Approval.of(a) for a in approvals if a.pending],
        )


class Accepted(BaseModel):
    """A steer or an interrupt was accepted (committed): it reaches the turn at its next
    step boundary."""

    turn_id: str
    accepted: Literal["say", "interrupt"]


class EventOut(BaseModel):
    """An event (``Event.to_json()``); ``data`` is its kind's payload (see the
    ``*Payload`` schemas)."""

    turn_id: str
    seq: int
    kind: str
    data: dict[str, Any]

    @classmethod
    def of(cls, event: Event) -> EventOut:
        """The wire form of an event."""
        return cls.model_validate(event.to_json())


class Health(BaseModel):
    """``/healthz`` and ``/readyz``."""

    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(default_factory=dict)


class ErrorDetail(BaseModel):
    """What went wrong."""

    type: str = Field(description="The parley.errors class, or Unauthorized, NotFound, …")
    message: str


class ErrorBody(BaseModel):
    """Every refusal: ``{"error": {"type", "message"}}``."""

    error: ErrorDetail
