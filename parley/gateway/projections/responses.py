"""The OpenAI Responses view of a turn: its response object and its streaming events, as
pure functions of what parley stored and published (no I/O here; ``responses.py`` serves
them).

A response is a turn.  Its ``output`` holds what the turn committed: each step's tool
calls as a ``function_call`` item followed by its ``function_call_output`` item (parley
runs its host's tools itself, so both halves of a round are there), and, for a turn that
ended with a reply, that reply as one assistant ``message`` (``phase: "final_answer"``),
so ``output_text`` is the reply.  Text a step streamed before calling tools is shown
while it streams (a ``message`` item with ``phase: "commentary"``) but is not part of the
object: the reply is the agent's last message, or nothing.

**Sequence numbers.**  The parley event ``seq`` expands into at most :data:`SLOTS`
Responses events, numbered ``seq * SLOTS + k`` for the ``k``-th of them.  The projection
of a turn's events is deterministic, so a reader that saw ``N`` resumes exactly by
projecting the turn again from its first event and sending only what is numbered above
``N``.  (Tokens are ephemeral: while the replay buffer keeps them, every projection of a
turn is the same; one made after the buffer has let them go numbers the same durable
events the same way, but shows each step's text at its commit instead of as it streamed.)

**A restarted step** (a worker died mid-step and the next one redoes it, or the model's
stream was retried) must not leave the client holding its text twice.  The client keeps
what it was sent, so the redo is compared with it: while the redo re-streams text the
client already holds, nothing is sent; once it goes past, only the new text is; and only
if it says something else is the held message closed as ``incomplete`` and a new one
opened with the redo's text.  Tool calls are matched the same way, by call id: a redo
that makes the same call (or gets the same result) sends nothing, a different one updates
the item it replaces.  A deterministic model (and any model whose redone step says what
it said before) therefore shows a crash as nothing at all.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from schemas.events import (
    ApprovalRequested,
    Ended,
    Event,
    EventKind,
    Queued,
    Started,
    StepCommitted,
    StepRestarted,
    ToolAnswered,
    ToolCalled,
)
from schemas.records import Approval, RunState, TurnRecord, TurnStatus, Usage
from workers.ports.backend import CommittedStep

SLOTS = 16
"""Responses events one parley event may expand into; ``sequence_number = seq * SLOTS + k``."""

STATUS: dict[TurnStatus, str] = {
    TurnStatus.QUEUED: "queued",
    TurnStatus.RUNNING: "in_progress",
    # OpenAI has no status for a response that waits for a person: it is in progress,
    # and its output holds an ``mcp_approval_request`` item per call waiting for one.
    TurnStatus.WAITING: "in_progress",
    TurnStatus.FINISHED: "completed",
    TurnStatus.SUCCEEDED: "completed",
    TurnStatus.CHECK_FAILED: "incomplete",
    TurnStatus.BUDGET_EXCEEDED: "incomplete",
    TurnStatus.CANCELLED: "cancelled",
    TurnStatus.FAILED: "failed",
}
"""A turn's status as a response's."""

# The event that ends a stream, by the response's status.  The Responses protocol has no
# event for a cancelled response: ``response.incomplete`` carrying ``status: cancelled``
# is the closest (the response stopped short, and did not fail).
TERMINAL_EVENT = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "cancelled": "response.incomplete",
    "failed": "response.failed",
}


def sequence_number(seq: int, index: int) -> int:
    """The sequence number of the ``index``-th Responses event of parley event ``seq``."""
    assert 0 <= index < SLOTS, index
    return seq * SLOTS + index


# ---------------------------------------------------------------------------- objects


def unix_seconds(moment: datetime) -> int:
    """A time as the Responses objects give it: whole seconds since the epoch."""
    return int(moment.timestamp())


@dataclass(frozen=True, kw_only=True)
class ResponseMeta:
    """What a response object says besides its output and status."""

    response_id: str
    created_at: int
    conversation_id: str
    model: str = ""
    previous_response_id: str | None = None
    background: bool = False
    max_output_tokens: int | None = None


def response_object(
    meta: ResponseMeta,
    *,
    status: str,
    output: Sequence[dict[str, Any]] = (),
    reply: str | None = None,
    usage: Usage | None = None,
    error: str | None = None,
    incomplete_reason: str | None = None,
    completed_at: int | None = None,
) -> dict[str, Any]:
    """A ``Response`` as the Open Responses specification publishes it (its
    ``ResponseResource``: every field it requires, of the type it requires) and OpenAI's
    client parses it (``openai.types.responses.Response``).  The host's model decides
    the sampling, which parley leaves alone: the sampling fields say what OpenAI's
    defaults are (``temperature`` and ``top_p`` 1, no penalties, no log probabilities),
    not what the request asked.  ``output_text`` is not part of either wire form (the
    clients compute it from ``output``); it is sent too, as the reply, for readers
    without such a client."""
    return {
        "id": meta.response_id,
        "object": "response",
        "created_at": meta.created_at,
        "completed_at": completed_at,
        "status": status,
        "model": meta.model,
        "output": list(output),
        "output_text": reply or "",
        "usage": None if usage is None else usage_object(usage),
        "error": None if error is None else {"code": "server_error", "message": error},
        "incomplete_details": (
            None if incomplete_reason is None else {"reason": incomplete_reason}
        ),
        "previous_response_id": meta.previous_response_id,
        "conversation": {"id": meta.conversation_id},
        "background": meta.background,
        "max_output_tokens": meta.max_output_tokens,
        "max_tool_calls": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": 1.0,
        "top_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": 0,
        "reasoning": None,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": True,
        "service_tier": "default",
        "user": None,
        "safety_identifier": None,
        "prompt_cache_key": None,
    }


def usage_object(usage: Usage) -> dict[str, Any]:
    """A ``ResponseUsage``."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total,
    }


def stored_response(
    turn: TurnRecord,
    run: RunState,
    steps: Sequence[CommittedStep],
    *,
    approvals: Sequence[Approval] = (),
    model: str = "",
    previous_response_id: str | None = None,
    background: bool = False,
) -> dict[str, Any]:
    """The response object of a stored turn (``approvals``: its calls that asked for a
    person's answer; those still waiting are shown).  ``model`` is what the request
    named: it is shown until a step records the model the host actually used;
    ``previous_response_id`` likewise until the turn has taken its place under a parent;
    ``background`` is echoed (parley does not store it: a later read says false).
    ``completed_at`` is when a completed response's turn ended."""
    meta = meta_of(
        turn,
        run,
        steps,
        model=model,
        previous_response_id=previous_response_id,
        background=background,
    )
    status = STATUS[run.status]
    reply = turn.reply if run.status.has_reply else None
    waiting = [approval_item(a.approval_id, a.tool, a.arguments) for a in approvals if a.pending]
    return response_object(
        meta,
        status=status,
        output=committed_output(turn.turn_id, steps, reply) + waiting,
        reply=reply,
        usage=run.usage,
        error=(run.error or "the turn failed") if run.status is TurnStatus.FAILED else None,
        incomplete_reason=incomplete_reason(run.status, run.error),
        completed_at=(
            unix_seconds(run.ended_at)
            if status == "completed" and run.ended_at is not None
            else None
        ),
    )


def meta_of(
    turn: TurnRecord,
    run: RunState,
    steps: Sequence[CommittedStep],
    *,
    model: str = "",
    previous_response_id: str | None = None,
    background: bool = False,
) -> ResponseMeta:
    """The meta of a stored turn (see :func:`stored_response` for the hints)."""
    used = next((s.payload.model for s in reversed(steps) if s.payload.model), "")
    contract = run.contract
    return ResponseMeta(
        response_id=turn.turn_id,
        created_at=unix_seconds(turn.created_at),
        conversation_id=turn.session_id,
        model=used or model,
        previous_response_id=turn.parent_id or previous_response_id,
        background=background,
        max_output_tokens=contract.max_tokens if contract is not None else None,
    )


def incomplete_reason(status: TurnStatus, error: str | None) -> str | None:
    """Why an ``incomplete`` response stopped, in OpenAI's words: a step budget is
    ``max_messages`` (a step is one model message), a token budget ``max_output_tokens``."""
    if status is TurnStatus.BUDGET_EXCEEDED:
        return "max_messages" if error and error.startswith("max_steps") else "max_output_tokens"
    if status is TurnStatus.CHECK_FAILED:
        return "max_messages"  # the contract's check still failed when the steps ran out
    return None


def committed_output(
    turn_id: str, steps: Sequence[CommittedStep], reply: str | None
) -> list[dict[str, Any]]:
    """The output items of a turn's committed steps: every tool round, then the reply."""
    output: list[dict[str, Any]] = []
    used: dict[str, int] = {}
    ordered = sorted(steps, key=lambda s: s.index)
    for step in ordered:
        results = {r.call_id: r for r in step.payload.tool_results}
        for call in step.payload.tool_calls:
            shown = shown_call_id(call.id, step.index, used)
            output.append(
                function_call_item(
                    call_item_id(turn_id, step.index, call.id),
                    shown,
                    call.name,
                    call.arguments,
                    "completed",
                )
            )
            result = results.get(call.id)
            if result is not None:
                output.append(
                    function_output_item(
                        output_item_id(turn_id, step.index, call.id),
                        shown,
                        result.content,
                        "completed",
                    )
                )
        for call in step.payload.tool_calls:
            used.setdefault(call.id, step.index)
    if reply is not None:
        last = ordered[-1].index if ordered else 0
        output.append(message_item(message_id(turn_id, last), reply, "completed", "final_answer"))
    return output


def _compact(turn_id: str) -> str:
    return turn_id.replace("-", "")


def message_id(turn_id: str, step: int, attempt: int = 0) -> str:
    """The id of a step's message item (``attempt``: how many the stream opened before it
    for the same step)."""
    suffix = f"_{attempt}" if attempt else ""
    return f"msg_{_compact(turn_id)}_{step}{suffix}"


def call_item_id(turn_id: str, step: int, call_id: str) -> str:
    """The id of a ``function_call`` item."""
    return f"fc_{_compact(turn_id)}_{step}_{call_id}"


def output_item_id(turn_id: str, step: int, call_id: str) -> str:
    """The id of a ``function_call_output`` item."""
    return f"fco_{_compact(turn_id)}_{step}_{call_id}"


def shown_call_id(call_id: str, step: int, used: dict[str, int]) -> str:
    """The call id a client sees: the model's, unless an earlier step of the response
    used it already (OpenAI's client takes a call id to name one call of a response, and
    a model may number each step's calls from 1)."""
    first = used.get(call_id)
    return call_id if first is None or first == step else f"{call_id}_{step}"


def message_item(
    item_id: str, text: str | None, status: str, phase: str | None = None
) -> dict[str, Any]:
    """A ``ResponseOutputMessage`` (``text`` None: no content part yet)."""
    item: dict[str, Any] = {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [] if text is None else [text_part(text)],
    }
    if phase is not None:
        item["phase"] = phase
    return item


def approval_item(approval_id: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An ``McpApprovalRequest``: a call waiting for a person's answer (its ``id`` is the
    approval id the answer names; ``server_label`` says the host's tools asked)."""
    return {
        "id": approval_id,
        "type": "mcp_approval_request",
        "name": tool,
        "arguments": json.dumps(arguments, sort_keys=True),
        "server_label": "parley",
    }


def text_part(text: str) -> dict[str, Any]:
    """A ``ResponseOutputText`` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    """A ``ResponseFunctionToolCall``."""
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def function_output_item(item_id: str, call_id: str, output: str, status: str) -> dict[str, Any]:
    """A ``ResponseFunctionToolCallOutputItem``: the result parley's host gave the model."""
    return {
        "id": item_id,
        "type": "function_call_output",
        "call_id": call_id,
        "output": output,
        "status": status,
    }


# ---------------------------------------------------------------------------- events


@dataclass
class _Message:
    """A message item the client was sent."""

    index: int
    item_id: str
    step: int
    text: str = ""
    open: bool = True
    status: str = "in_progress"
    phase: str | None = None


@dataclass
class _Item:
    """A function_call or function_call_output item the client was sent."""

    index: int
    item: dict[str, Any]


@dataclass
class _Batch:
    """The Responses events of one parley event, numbered as they are added."""

    seq: int
    events: list[dict[str, Any]] = field(default_factory=list)

    def emit(self, kind: str, **fields: Any) -> None:
        number = sequence_number(self.seq, len(self.events))
        self.events.append({"type": kind, "sequence_number": number, **fields})


class Projection:
    """Parley events → Responses streaming events, for one response, fed in ``seq``
    order from the turn's first event.  Keeps only what numbering and the redo
    comparison need."""

    def __init__(self, meta: ResponseMeta) -> None:
        self.meta = meta
        self.status: str | None = None
        """The response's status as the events have told it (None before any)."""
        self._items = 0  # output items sent: the next output_index
        self._message: _Message | None = None  # the newest message item
        self._opened: dict[int, int] = {}  # message items opened per step
        # While a restarted step is redone: how much of the held message's text the
        # redo has re-streamed (None: no redo is being compared).
        self._echo: int | None = None
        # The uncommitted step's tool items, by the model's call id: what a redo of the
        # step is compared with.
        self._held_step: int | None = None
        self._calls: dict[str, _Item] = {}
        self._outputs: dict[str, _Item] = {}
        self._used: dict[str, int] = {}  # call ids of committed steps → first step

    def project(self, event: Event, *, final: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The Responses events of ``event``.  An ``end`` that closes the response (the
        turn's last: nothing follows it) takes the stored response object as ``final``
        and ends the stream with it; an ``end`` that a resume goes on from takes None."""
        batch = _Batch(event.seq)
        if self.status is None:
            self._lifecycle(batch, "response.created", "queued")
        if event.kind is EventKind.TOKEN:
            # The hot path (every reader projects every token): the wire form is read
            # as it is, without validating a payload object per delta.
            self._token(batch, int(event.data["step"]), str(event.data["text"]))
            return batch.events
        payload = event.payload
        if isinstance(payload, Queued):
            if batch.events or self.status != "queued":
                self._lifecycle(batch, "response.queued", "queued")
        elif isinstance(payload, StepRestarted):
            self._restarted(payload.step)
        elif isinstance(payload, ToolCalled):
            self._tool_call(batch, payload)
        elif isinstance(payload, ToolAnswered):
            self._tool_result(batch, payload)
        elif isinstance(payload, StepCommitted):
            self._step(batch, payload)
        elif isinstance(payload, ApprovalRequested):
            self._approval(batch, payload)
        elif isinstance(payload, Ended):
            self._end(batch, payload, final)
        elif isinstance(payload, Started) and self.status != "in_progress":
            self._lifecycle(batch, "response.in_progress", "in_progress")
        # Steers, refusals, checks and answers to approvals have no Responses form: a
        # refusal (or a denial) reaches the client as the call's output, a steer as what
        # the model says next.
        assert len(batch.events) <= SLOTS, (event, batch.events)
        return batch.events

    # ------------------------------------------------------------------ lifecycle

    def _lifecycle(self, batch: _Batch, kind: str, status: str) -> None:
        self.status = status
        batch.emit(kind, response=response_object(self.meta, status=status))

    def _end(self, batch: _Batch, end: Ended, final: dict[str, Any] | None) -> None:
        self._settle_echo(batch)
        outcome = TurnStatus(end.outcome)
        message = self._message
        final_id = None
        if message is not None and message.open:
            if outcome.has_reply and end.reply is not None and message.text == end.reply:
                self._close(batch, message, "completed", "final_answer")
                final_id = message.item_id
            else:
                self._close(batch, message, "incomplete")
        elif message is not None and message.phase == "final_answer":
            final_id = message.item_id
        # The uncommitted step's tool items stay held: a resume that redoes the step
        # with the same calls must not send a second item for one call id.
        self._echo = None
        self.status = STATUS[outcome]
        if final is None:
            return
        if final_id is not None:
            # The stored object names the reply's message as a stream that opened one
            # per step would; this stream may have opened more (a step redone).
            final = {**final, "output": [_renamed(i, final_id) for i in final["output"]]}
        kind = TERMINAL_EVENT.get(str(final["status"]), TERMINAL_EVENT[self.status])
        batch.emit(kind, response=final)

    # ------------------------------------------------------------------ text

    def _open(self, batch: _Batch, step: int) -> _Message:
        attempt = self._opened.get(step, 0)
        self._opened[step] = attempt + 1
        message = _Message(
            index=self._items, item_id=message_id(self.meta.response_id, step, attempt), step=step
        )
        self._items += 1
        self._message = message
        batch.emit(
            "response.output_item.added",
            output_index=message.index,
            item=message_item(message.item_id, None, "in_progress"),
        )
        batch.emit(
            "response.content_part.added",
            item_id=message.item_id,
            output_index=message.index,
            content_index=0,
            part=text_part(""),
        )
        return message

    def _delta(self, batch: _Batch, message: _Message, text: str) -> None:
        message.text += text
        batch.emit(
            "response.output_text.delta",
            item_id=message.item_id,
            output_index=message.index,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _close(
        self, batch: _Batch, message: _Message, status: str, phase: str | None = None
    ) -> None:
        message.open = False
        message.status = status
        message.phase = phase
        common = {"item_id": message.item_id, "output_index": message.index, "content_index": 0}
        batch.emit("response.output_text.done", **common, text=message.text, logprobs=[])
        batch.emit("response.content_part.done", **common, part=text_part(message.text))
        batch.emit(
            "response.output_item.done",
            output_index=message.index,
            item=message_item(message.item_id, message.text, status, phase),
        )

    def _abandon(self, batch: _Batch, message: _Message) -> None:
        """The client holds text the turn will not commit: mark its item incomplete."""
        if message.open:
            self._close(batch, message, "incomplete")
        elif message.status != "incomplete":
            message.status = "incomplete"
            message.phase = None
            batch.emit(
                "response.output_item.done",
                output_index=message.index,
                item=message_item(message.item_id, message.text, "incomplete"),
            )

    def _close_open(self, batch: _Batch) -> None:
        """The step's text is over (a tool call follows, or another step's text)."""
        if self._message is not None and self._message.open:
            self._close(batch, self._message, "completed", "commentary")

    def _token(self, batch: _Batch, step: int, text: str) -> None:
        if not text:
            return
        message = self._message
        if message is None or message.step != step:
            self._settle_echo(batch)
            self._close_open(batch)
            message = self._open(batch, step)
        if self._echo is not None:
            held = message.text
            position = self._echo
            rest = held[position:]
            common = _common_prefix(text, rest)
            if common == len(text):  # still re-streaming what the client holds
                self._echo = position + common
                return
            self._echo = None
            if common == len(rest):  # past it: only the new text is new
                text = text[common:]
            else:  # the redo says something else: its text replaces the held one
                text = held[:position] + text
                self._abandon(batch, message)
                message = self._open(batch, step)
        if not message.open:  # the redo goes on past a message the client holds closed
            message = self._open(batch, step)
        self._delta(batch, message, text)

    def _restarted(self, step: int) -> None:
        message = self._message
        # Compare the redo with what the client holds of this step (not with text it
        # was told is incomplete: that one a new item replaces whole).
        held = message is not None and message.step == step and message.status != "incomplete"
        self._echo = 0 if held else None

    def _settle_echo(self, batch: _Batch) -> None:
        """The redo's text ended: if it is shorter than what the client holds, the held
        text is replaced by it."""
        position, self._echo = self._echo, None
        message = self._message
        if position is None or message is None or position >= len(message.text):
            return
        redo = message.text[:position]
        self._abandon(batch, message)
        if redo:
            self._delta(batch, self._open(batch, message.step), redo)

    def _step(self, batch: _Batch, step: StepCommitted) -> None:
        self._settle_echo(batch)
        message = self._message
        mine = message if message is not None and message.step == step.step else None
        if mine is not None and mine.text != step.text:
            if mine.open and step.text.startswith(mine.text):
                self._delta(batch, mine, step.text[len(mine.text) :])
            else:
                self._abandon(batch, mine)
                mine = None
                if step.text:
                    self._delta(batch, self._open(batch, step.step), step.text)
        elif mine is None and step.text:
            # No token of the step was seen (they left the replay buffer): the text
            # arrives whole with the commit.
            self._delta(batch, self._open(batch, step.step), step.text)
        for call in step.tool_calls:
            self._used.setdefault(call.id, step.step)
        self._release()

    def _release(self) -> None:
        self._held_step = None
        self._calls.clear()
        self._outputs.clear()
        self._echo = None

    # ------------------------------------------------------------------ tools

    def _hold(self, step: int) -> None:
        if self._held_step != step:
            self._release()
            self._held_step = step

    def _tool_call(self, batch: _Batch, call: ToolCalled) -> None:
        self._settle_echo(batch)
        self._close_open(batch)
        self._hold(call.step)
        item_id = call_item_id(self.meta.response_id, call.step, call.call_id)
        shown = shown_call_id(call.call_id, call.step, self._used)
        done = function_call_item(item_id, shown, call.name, call.arguments, "completed")
        held = self._calls.get(call.call_id)
        if held is not None:
            if held.item != done:  # the redo called it otherwise: the item says so
                held.item = done
                batch.emit("response.output_item.done", output_index=held.index, item=done)
            return
        index = self._items
        self._items += 1
        self._calls[call.call_id] = _Item(index, done)
        batch.emit(
            "response.output_item.added",
            output_index=index,
            item=function_call_item(item_id, shown, call.name, "", "in_progress"),
        )
        if call.arguments:
            batch.emit(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=call.arguments,
            )
        batch.emit(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=index,
            arguments=call.arguments,
        )
        batch.emit("response.output_item.done", output_index=index, item=done)

    def _tool_result(self, batch: _Batch, result: ToolAnswered) -> None:
        self._settle_echo(batch)
        self._close_open(batch)
        self._hold(result.step)
        item_id = output_item_id(self.meta.response_id, result.step, result.call_id)
        shown = shown_call_id(result.call_id, result.step, self._used)
        done = function_output_item(item_id, shown, result.content, "completed")
        held = self._outputs.get(result.call_id)
        if held is not None:
            if held.item != done:
                held.item = done
                batch.emit("response.output_item.done", output_index=held.index, item=done)
            return
        index = self._items
        self._items += 1
        self._outputs[result.call_id] = _Item(index, done)
        batch.emit(
            "response.output_item.added",
            output_index=index,
            item=function_output_item(item_id, shown, result.content, "in_progress"),
        )
        batch.emit("response.output_item.done", output_index=index, item=done)

    def _approval(self, batch: _Batch, asked: ApprovalRequested) -> None:
        self._settle_echo(batch)
        self._close_open(batch)
        item = approval_item(asked.approval_id, asked.tool, asked.arguments)
        index = self._items
        self._items += 1
        batch.emit("response.output_item.added", output_index=index, item=item)
        batch.emit("response.output_item.done", output_index=index, item=item)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _renamed(item: dict[str, Any], message_id: str) -> dict[str, Any]:
    if item.get("type") == "message" and item.get("phase") == "final_answer":
        return {**item, "id": message_id}
    return item
