"""The OpenAI Responses streaming events of a turn: :class:`ResponsesProjection`, fed the
turn's parley events in seq order, answers each with the Responses events it makes (no
I/O here; the router ``routers/responses.py`` serves them).

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

from dataclasses import dataclass, field
from typing import Any

from parley.openai_api.response_objects import (
    SLOTS,
    STATUS,
    TERMINAL_EVENT,
    ResponseMeta,
    approval_item,
    call_item_id,
    function_call_item,
    function_output_item,
    message_id,
    message_item,
    output_item_id,
    response_object,
    sequence_number,
    shown_call_id,
    text_part,
)
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
from schemas.records import TurnStatus


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


class ResponsesProjection:
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

    # The Projection protocol (parley.gateway.projection): the router feeds project() an
    # end only once it knows whether the end is the turn's last; these are the rest.

    def opening(self) -> list[dict[str, Any]]:
        """Nothing: a response's stream opens with its first event's ``response.created``."""
        return []

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """The Responses events of ``event`` (an ``end`` without the final object: see
        :meth:`project`)."""
        return self.project(event)

    def close(self, cut: str | None = None) -> list[dict[str, Any]]:
        """Nothing: a Responses stream cut short has no closing event (a reader resumes
        with ``starting_after``)."""
        return []

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
        self._project_payload(batch, event.payload, final)
        assert len(batch.events) <= SLOTS, (event, batch.events)
        return batch.events

    def _project_payload(self, batch: _Batch, payload: Any, final: dict[str, Any] | None) -> None:
        # Steers, refusals, checks and answers to approvals have no Responses form: a
        # refusal (or a denial) reaches the client as the call's output, a steer as what
        # the model says next.
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
