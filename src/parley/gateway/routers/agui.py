"""``POST /v1/ag-ui``: parley for AG-UI clients (``@ag-ui/client``'s ``HttpAgent``,
CopilotKit), docs/protocols.md.

The body is AG-UI's ``RunAgentInput``; the answer is the run's AG-UI events over SSE.
The ``threadId`` names the session (``threads.py``), the newest user message is the
turn's prompt, and the turn's events are projected by ``projections.agui.AgUiRun``: this
module only validates, submits and wires the projection to the shared feed.

A turn that waits for a person (docs/approvals.md) ends the run with AG-UI's own ``interrupt``
outcome, one interrupt per waiting call (its id the approval id); the next run's
``resume`` entries answer them (``resolved`` approves, ``cancelled`` denies) and that run
streams the same turn on.

What parley does not take from a ``RunAgentInput``, and why: ``tools`` (the host owns the
tools; a client's frontend tools are not offered to the model), ``context``, ``state`` and
``forwardedProps`` (accepted and ignored), earlier ``messages`` (the stored history is
what the model sees).

Refusals before the stream starts (a body that is not a ``RunAgentInput``, no user
message, a prompt parley cannot take) are HTTP errors in the gateway's error form and
change nothing: ``HttpAgent`` rejects ``runAgent()`` with an error carrying the status
and the parsed body.  A turn that fails is ``RUN_ERROR`` inside the stream.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict
from sse_starlette import EventSourceResponse

from parley.errors import InvalidRequest, SessionNotFound
from parley.gateway.dependencies import ClientDep, FeedsDep, SettingsDep, Tenant
from parley.gateway.projection import approval_pause, data_frame, data_stream, projected
from parley.gateway.projections.agui import AgUiRun
from parley.gateway.projections.agui_subagents import AgUiTree
from parley.gateway.resources import ERRORS, NOT_BLANK
from parley.gateway.threads import (
    MAX_EXTERNAL_ID,
    ApprovalAnswer,
    answer_approvals,
    check_prompt,
    find_thread,
    message_request_id,
    open_thread,
)
from parley.gateway.tree_feed import tree_feed
from parley.gateway.work import light
from parley.schemas.events import Event
from parley.schemas.records import TurnRecord

PROTOCOL = "ag-ui"

router = APIRouter(prefix="/v1", responses=ERRORS)

AG_UI_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "AG-UI events over Server-Sent Events (`data: EVENT-JSON`): "
        "RUN_STARTED, STEP_*, TEXT_MESSAGE_*, TOOL_CALL_*, CUSTOM (parley.steer, "
        "parley.refusal, parley.check, parley.step_restarted), MESSAGES_SNAPSHOT after a "
        "restarted step, then RUN_FINISHED or RUN_ERROR.",
        # Before OpenAPI 3.2's itemSchema, an event stream's schema describes each event.
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "required": ["data"],
                    "properties": {
                        "data": {
                            "type": "string",
                            "contentMediaType": "application/json",
                            "contentSchema": {
                                "type": "object",
                                "required": ["type"],
                                "properties": {"type": {"type": "string"}},
                            },
                        }
                    },
                }
            }
        },
    }
}


class AgUiTextPart(BaseModel):
    """A text part of a user message (parley takes text: a media part is refused)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str = Field(json_schema_extra={"pattern": NOT_BLANK})


class AgUiUserMessage(BaseModel):
    """A user message of a ``RunAgentInput``: its text is a prompt (fields parley does not
    read are kept as given)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=1000)
    role: Literal["user"]
    content: (
        Annotated[str, Field(min_length=1, json_schema_extra={"pattern": NOT_BLANK})]
        | Annotated[list[AgUiTextPart], Field(min_length=1)]
    )


class AgUiOtherMessage(BaseModel):
    """Any other message of a ``RunAgentInput`` (AG-UI's ``Message``), kept as given:
    the stored history is what the model sees."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=1000)
    role: Literal["developer", "system", "assistant", "tool", "activity", "reasoning"]
    content: Any = None


AgUiMessage = Annotated[AgUiUserMessage | AgUiOtherMessage, Field(discriminator="role")]
HAS_USER_MESSAGE: JsonDict = {
    "contains": {"type": "object", "properties": {"role": {"const": "user"}}, "required": ["role"]}
}


class ResumeEntry(BaseModel):
    """An answer to one interrupt (AG-UI's ``ResumeEntry``): here, to a call waiting for
    approval.  ``resolved`` approves it unless ``payload.approved`` is false; ``cancelled``
    denies it; ``payload.reason`` is a denial's reason."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    interrupt_id: str = Field(alias="interruptId", min_length=1, max_length=36)
    status: Literal["resolved", "cancelled"]
    payload: Any = None
    metadata: Any = None

    def answer(self) -> ApprovalAnswer:
        """The approval answer this entry gives."""
        given = self.payload if isinstance(self.payload, dict) else {}
        reason = given.get("reason")
        reason = reason if isinstance(reason, str) and reason.strip() else None
        if self.status == "cancelled":
            return ApprovalAnswer(
                approval_id=self.interrupt_id, approved=False, reason=reason or "cancelled"
            )
        approved = given.get("approved") is not False
        return ApprovalAnswer(approval_id=self.interrupt_id, approved=approved, reason=reason)


class RunAgentInput(BaseModel):
    """AG-UI's ``RunAgentInput`` (``@ag-ui/core`` 1.0).  Only ``threadId``, ``runId`` and
    ``messages`` are required, as there."""

    # A run has a user message (its newest one is the prompt), or answers interrupts.
    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
        json_schema_extra={
            "anyOf": [
                {"properties": {"messages": HAS_USER_MESSAGE}},
                {"required": ["resume"], "properties": {"resume": {"minItems": 1}}},
            ]
        },
    )

    thread_id: str = Field(alias="threadId", min_length=1, max_length=MAX_EXTERNAL_ID)
    run_id: str = Field(alias="runId", min_length=1, max_length=MAX_EXTERNAL_ID)
    parent_run_id: str | None = Field(None, alias="parentRunId")
    protocol_version: str | None = Field(None, alias="protocolVersion")
    state: Any = None
    messages: list[AgUiMessage]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    context: list[dict[str, Any]] = Field(default_factory=list)
    forwarded_props: Any = Field(None, alias="forwardedProps")
    resume: list[ResumeEntry] | None = None


def newest_user_message(messages: list[AgUiMessage]) -> tuple[AgUiUserMessage, str]:
    """The newest user message and its text (text parts joined by newlines), or
    :class:`InvalidRequest`: none, or no text."""
    for message in reversed(messages):
        if isinstance(message, AgUiUserMessage):
            return message, check_prompt(_text_of(message.content))
    raise InvalidRequest("the RunAgentInput has no user message: its newest one is the prompt")


def _text_of(content: str | list[AgUiTextPart]) -> str:
    return content if isinstance(content, str) else "\n".join(part.text for part in content)


@router.post(
    "/ag-ui", tags=["protocols"], response_class=EventSourceResponse, responses=AG_UI_STREAM
)
async def ag_ui(
    body: RunAgentInput,
    client: ClientDep,
    feeds: FeedsDep,
    settings: SettingsDep,
    owner: Tenant,
) -> EventSourceResponse:
    """Run an AG-UI agent run as a parley turn: ``threadId`` names the session (a new one
    for a thread the tenant has not used), the newest user message is the prompt (sent
    again, it answers the turn it made), and the turn's events stream as AG-UI events.
    A turn already running on the session is waited for (enqueued).  A run with
    ``resume`` entries answers the calls the thread's waiting turn asked about, and
    streams that turn on."""
    answers = [entry.answer() for entry in body.resume or ()]
    # A run that answers interrupts takes no prompt: it goes on with the turn that asked.
    user = None if answers else newest_user_message(body.messages)
    # Checked before the thread is opened: a refused request makes no session.
    request_id = None if user is None else message_request_id(PROTOCOL, user[0].id, user[1])

    def start() -> tuple[str, str, TurnRecord | None]:
        if user is None:
            session = find_thread(client, owner, body.thread_id)
            if session is None:
                raise SessionNotFound(f"no thread {body.thread_id!r} to resume")
            return session.id, answer_approvals(client, session, answers), None
        _, prompt = user
        thread = open_thread(
            client,
            settings.workspaces,
            owner,
            body.thread_id,
            metadata={"protocol": PROTOCOL, "thread_id": body.thread_id},
        )
        handle = thread.session.submit(prompt, request_id=request_id)
        return thread.session.id, handle.turn_id, handle.submitted

    session_id, turn_id, submitted = await light(start)
    if submitted is not None:
        # Followed from here, while the stream's answer is made: its first token waits
        # for no read of the feed's own.
        feeds.follow_submitted(submitted, owner)
    projection = AgUiRun(
        thread_id=body.thread_id,
        run_id=body.run_id,
        session_id=session_id,
        turn_id=turn_id,
        input_messages=[m.model_dump(mode="json", exclude_unset=True) for m in body.messages],
    )
    # The turn's children are subagents of this run (projections/agui_subagents.py).
    tree = AgUiTree(projection)
    asked = approval_pause(client, turn_id, lambda: projection.asked, projection.interrupt)

    async def pause(event: Event) -> list[dict[str, Any]]:
        return await asked(event) if event.turn_id == turn_id else []

    events = tree_feed(feeds, turn_id)
    frames = projected(feeds, turn_id, tree, data_frame, pause=pause, events=events)
    return data_stream(frames, settings)
