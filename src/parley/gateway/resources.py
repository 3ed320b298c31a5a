"""What crosses the gateway's wire (docs/http.md#3-resources), declared with pydantic: request
bodies are validated against these (a field they do not name is refused, so a misspelt
one is not silently ignored) and responses are built from them, which is also what the
OpenAPI document says."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from parley.ports.host import EVENT_NAME
from parley.schemas.compactions import CompactionRecord
from parley.schemas.events import Event
from parley.schemas.records import Approval as ApprovalRecord
from parley.schemas.records import (
    ChildRecord,
    IfBusy,
    RunState,
    SessionRecord,
    TurnRecord,
    TurnStatus,
    TurnUsage,
    Waiting,
)
from parley.store.session_titles import MAX_TITLE_CHARS, title_problem
from parley.validation import (
    JSON_NUMBER,
    MAX_CONTEXT_BYTES,
    MAX_DELAY_SECONDS,
    MAX_PROMPT_BYTES,
    MAX_REQUEST_ID,
    MAX_STEER_BYTES,
)
from parley.workspaces import NAME_PATTERN

MAX_LIST = 200
MAX_WAIT_SECONDS = 60
# A prompt or a steer must have a character that is not white space: the client refuses
# one that strip() empties ("the prompt is empty"), and the document says so with this
# pattern (spelt out, since regex engines differ on what \s is).
WHITE_SPACE = "".join(f"\\u{code:04x}" for code in range(0x3001) if chr(code).isspace())
NOT_BLANK = f"[^{WHITE_SPACE}]"
# What a title may not hold (src/parley/store/session_titles.py): the C0 and C1 controls, the line
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
"""A session's title as a request gives it (src/parley/store/session_titles.py)."""


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


def _a_string(value: Any) -> Any:
    """A time on the wire is RFC 3339 text, never a number of seconds (lax parsing reads
    one as a Unix time)."""
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 time, as a string")
    return value


class TurnCreate(Body):
    """``POST /v1/sessions/{id}/turns``.  Budgets only: a ``check`` command is never
    accepted over HTTP."""

    # (The document says what the route refuses: at and after are one or the other.)
    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"not": {"required": ["at", "after"]}}
    )

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

    at: Annotated[datetime, BeforeValidator(_a_string), Field(strict=False)] | None = Field(
        None,
        description="Start no earlier than this time (RFC 3339, with its offset); the "
        "turn is stored at once, queued, and waits holding nothing (docs/time.md).",
    )
    after: float | None = Field(
        None,
        ge=0,
        le=MAX_DELAY_SECONDS,
        allow_inf_nan=False,
        description="Start no earlier than this many seconds from now (instead of at).",
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


class CompactRequest(Body):
    """``POST /v1/sessions/{id}/compact`` (docs/compaction.md)."""

    strategy: Literal["trim", "summarize", "native"] = "summarize"
    keep_turns: Annotated[int, Field(ge=0, le=1_000_000, strict=False), JSON_NUMBER] = 4
    keep: Annotated[int, Field(ge=0, le=1_000_000, strict=False), JSON_NUMBER] = 2


class Compaction(BaseModel):
    """A compaction of a session's history (docs/compaction.md#the-record)."""

    id: str
    session_id: str
    through_turn_id: str
    strategy: str
    text: str
    tokens_before: int
    tokens_after: int
    created_at: datetime
    made_by_turn_id: str | None
    dropped: bool
    dropped_at: datetime | None
    usage: dict[str, int] | None = Field(
        description="What making it cost (a summary's model call), else null"
    )

    @classmethod
    def of(cls, record: CompactionRecord) -> Compaction:
        return cls(
            id=record.compaction_id,
            session_id=record.session_id,
            through_turn_id=record.through_turn_id,
            strategy=str(record.strategy),
            text=record.text,
            tokens_before=record.tokens_before,
            tokens_after=record.tokens_after,
            created_at=record.created_at,
            made_by_turn_id=record.made_by_turn_id,
            dropped=record.dropped,
            dropped_at=record.dropped_at,
            usage=None if record.usage is None else record.usage.to_json(),
        )


class Compactions(BaseModel):
    """A session's compactions, oldest first, dropped ones too."""

    compactions: list[Compaction]


class SayRequest(Body):
    """``POST /v1/turns/{id}/say``."""

    text: str = Field(
        min_length=1, max_length=MAX_STEER_BYTES, json_schema_extra={"pattern": NOT_BLANK}
    )


class ApprovalDecision(Body):
    """``POST /v1/turns/{id}/approvals/{approval_id}``."""

    decision: Literal["approve", "deny"]
    reason: str | None = Field(None, max_length=10_000)


EVENT_NAME_PATTERN = "^" + EVENT_NAME.pattern + "$"


class SignalBody(Body):
    """``POST /v1/turns/{id}/signals``: the event's ``name`` and its ``payload`` (any JSON
    value; absent: null), which becomes the waiting call's result."""

    name: str = Field(pattern=EVENT_NAME_PATTERN)
    payload: Any = None


class SignalSent(BaseModel):
    """A signal was accepted (committed): ``delivered`` when it woke a call of the turn
    that waited for it, else it is kept until one does."""

    turn_id: str
    name: str
    delivered: bool


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
    batch_id: str | None = Field(
        description="The batch whose line opened the session (null: a conversation)."
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
            batch_id=record.batch_id,
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
    not_before: datetime | None = None
    """The soonest it may start (a delayed turn's time, or capacity's); null: at once."""
    waiting_for: Waiting | None = None
    """While it waits: ``approval``, ``agents``, ``event``, ``time`` or ``capacity``."""
    waiting_event: str | None = None
    """While it waits for an event: the event's name (``not_before``: until when)."""

    @classmethod
    def of(cls, record: TurnRecord) -> Turn:
        """The wire form of a stored turn (its fields are the record's, by name)."""
        return cls.model_validate(record, from_attributes=True)


class Turns(BaseModel):
    """``history`` (root → head) and ``tree`` (every branch)."""

    turns: list[Turn]


class Usage(BaseModel):
    """Tokens a turn has used: its own, and, for a turn with agent calls' child turns
    (docs/sub-agents.md#7-seen), ``total``, which counts its descendants' too."""

    input_tokens: int
    output_tokens: int
    total: int | None = Field(
        default=None,
        description="Only for a turn with child turns: input plus output tokens of the turn "
        "and of every descendant (its agent calls' child turns, and theirs)",
    )

    @model_serializer(mode="wrap")
    def _without_total_unless_a_tree(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A turn without children has exactly its own two counts, as it always had.
        data = handler(self)
        if isinstance(data, dict) and data.get("total") is None:
            data.pop("total", None)
        return data


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
    path: list[dict[str, str]] = Field(
        default_factory=list,
        description="For a descendant's call listed with its parent turn: each agent call "
        "(agent, call_id, turn_id) from that turn down to the child turn that asked; empty "
        "for the turn's own",
    )

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
            path=[dict(step) for step in record.path],
        )


class Child(BaseModel):
    """An agent call's child turn (docs/sub-agents.md): the call, the agent's path, the
    child's turn and session, and its status (its outcome once it ended)."""

    step: int
    call_id: str
    agent: str
    turn_id: str
    session_id: str
    status: TurnStatus

    @classmethod
    def of(cls, record: ChildRecord) -> Child:
        """The wire form of a child turn (its fields are the record's, by name)."""
        return cls.model_validate(record, from_attributes=True)


class TurnDetails(Turn):
    """``GET /v1/turns/{id}``: the turn with its run's details."""

    steps: int
    usage: Usage
    error: str | None
    undelivered: list[str] = Field(
        description="say texts accepted but never delivered: the turn stopped first"
    )
    pending_approvals: list[Approval] = Field(
        description="The calls waiting for an answer: the turn's own (its status is then "
        "waiting), then those of its agent calls' child turns still running, and theirs, "
        "each with its path"
    )
    children: list[Child] = Field(
        default_factory=list, description="Each agent call's child turn, in step and call order"
    )

    @classmethod
    def of_run(
        cls,
        record: TurnRecord,
        run: RunState,
        usage: TurnUsage,
        pending: Sequence[ApprovalRecord] = (),
        children: tuple[ChildRecord, ...] = (),
    ) -> TurnDetails:
        """The wire form of a stored turn, its run, its usage (with its descendants'),
        the pending approvals of it and of its descendants, and its children."""
        return cls(
            **Turn.of(record).model_dump(),
            steps=run.steps,
            usage=Usage(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                total=usage.total if children else None,
            ),
            error=run.error,
            undelivered=list(run.undelivered),
            pending_approvals=[Approval.of(a) for a in pending],
            children=[Child.of(c) for c in children],
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


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in (
        (400, "Malformed JSON"),
        (401, "No bearer token, or an unknown one"),
        (404, "No such resource (or another tenant's)"),
        (409, "The resource's state forbids this"),
        (413, "The body is over PARLEY_GATEWAY_MAX_BODY"),
        (422, "A field is invalid"),
    )
}
"""The refusals every route in the gateway's own form may answer (the OpenAPI document's
list for the native, AG-UI and AI SDK routers)."""
