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

The walk of the events is the base's, ``base.TurnProjection``; the redo comparison is
this module's own policy, in its hooks: ``on_restart`` starts it, ``on_text`` compares,
and ``reconcile`` (the base's, replaced) settles a committed step with the message item
the client holds, whose text may be an earlier attempt's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, final

from parley.gateway.projections.base import Out, StepView, TurnProjection
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
from parley.schemas.events import (
    AgentEnded,
    AgentStarted,
    ApprovalAnswered,
    ApprovalRequested,
    Checked,
    Compacted,
    Ended,
    Event,
    EventKind,
    Queued,
    Refused,
    Started,
    Steered,
    StepCommitted,
    Throttled,
    ToolAnswered,
    ToolCalled,
    WaitingForEvent,
)
from parley.schemas.records import TurnStatus


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


@final
class ResponsesProjection(TurnProjection[StepView]):
    """Parley events → Responses streaming events, for one response, fed in ``seq``
    order from the turn's first event.  Keeps only what numbering and the redo
    comparison need: a response's items are its own, not the walk's steps."""

    def __init__(self, meta: ResponseMeta) -> None:
        super().__init__()
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
        self._reply_id: str | None = None  # the message item of the last end's reply

    # The Projection protocol (parley.gateway.projection): the router feeds project() an
    # end only once it knows whether the end is the turn's last; feed() is the rest.

    def opening(self) -> Out:
        """Nothing: a response's stream opens with its first event's ``response.created``."""
        return []

    def project(self, event: Event, *, final: dict[str, Any] | None = None) -> Out:
        """The Responses events of ``event``.  An ``end`` that closes the response (the
        turn's last: nothing follows it) takes the stored response object as ``final``
        and ends the stream with it; an ``end`` that a resume goes on from takes None."""
        out = self.feed(event)
        if final is not None and event.kind is EventKind.END:
            self._terminal(out, final)
        assert len(out) <= SLOTS, (event, out)
        return out

    def _emit(self, out: Out, kind: str, **fields: Any) -> None:
        """Add a Responses event, numbered after the parley event's seq."""
        number = sequence_number(self.seq, len(out))
        out.append({"type": kind, "sequence_number": number, **fields})

    # ------------------------------------------------------------------ lifecycle

    def before_event(self, out: Out) -> None:
        """``response.created`` before the first event's own."""
        if self.status is None:
            self._lifecycle(out, "response.created", "queued")

    def on_queued(self, out: Out, queued: Queued) -> None:
        """``response.queued``, unless the response is queued already (and was not just
        created)."""
        if out or self.status != "queued":
            self._lifecycle(out, "response.queued", "queued")

    def on_started(self, out: Out, started: Started) -> None:
        """``response.in_progress``, unless it is."""
        if self.status != "in_progress":
            self._lifecycle(out, "response.in_progress", "in_progress")

    # Steers, refusals, checks, answers to approvals and waits for capacity have no
    # Responses form: a refusal (or a denial) reaches the client as the call's output, a
    # steer as what the model says next.

    def on_steer(self, out: Out, steered: Steered) -> None:
        """Nothing (what the model says next shows it)."""

    def on_refusal(self, out: Out, refused: Refused) -> None:
        """Nothing (the call's output says it)."""

    def on_check(self, out: Out, checked: Checked) -> None:
        """Nothing."""

    def on_throttled(self, out: Out, throttled: Throttled) -> None:
        """Nothing (the response stays ``in_progress``)."""

    def on_waiting(self, out: Out, waiting: WaitingForEvent) -> None:
        """Nothing (the response stays ``in_progress`` until the wait ends and the turn
        goes on)."""

    def on_compacted(self, out: Out, compacted: Compacted) -> None:
        """Nothing: the Responses API has no event for it (the response's input is as
        it was; the session's compactions are listed on their own route)."""

    def on_agent_started(self, out: Out, started: AgentStarted) -> None:
        """Nothing: Responses has no item for work another run does; the agent call's
        output item says what its child replied, once the step goes on."""

    def on_agent_ended(self, out: Out, ended: AgentEnded) -> None:
        """Nothing (the call's output item says it)."""

    def on_approval_answered(
        self, out: Out, answered: ApprovalAnswered, call_id: str | None
    ) -> None:
        """Nothing (the call's output, or its absence, says it)."""

    def on_close(self, out: Out, end: Ended | None, cut: str | None) -> None:
        """Nothing: a Responses stream cut short has no closing event (a reader resumes
        with ``starting_after``)."""

    def on_interrupt(self, out: Out, approval_ids: Sequence[str]) -> None:
        """Nothing: a Responses stream stays open while its response waits."""

    def _lifecycle(self, out: Out, kind: str, status: str) -> None:
        self.status = status
        self._emit(out, kind, response=response_object(self.meta, status=status))

    def on_end(self, out: Out, end: Ended) -> None:
        """The open message closes: as the reply (``final_answer``) if it is the reply,
        else ``incomplete``.  The terminal event waits for :meth:`project`'s ``final``."""
        self._settle_echo(out)
        outcome = TurnStatus(end.outcome)
        message = self._message
        self._reply_id = None
        if message is not None and message.open:
            if outcome.has_reply and end.reply is not None and message.text == end.reply:
                self._close(out, message, "completed", "final_answer")
                self._reply_id = message.item_id
            else:
                self._close(out, message, "incomplete")
        elif message is not None and message.phase == "final_answer":
            self._reply_id = message.item_id
        # The uncommitted step's tool items stay held: a resume that redoes the step
        # with the same calls must not send a second item for one call id.
        self._echo = None
        self.status = STATUS[outcome]

    def _terminal(self, out: Out, final: dict[str, Any]) -> None:
        """The stream's last event, carrying the stored object ``final``."""
        if self._reply_id is not None:
            # The stored object names the reply's message as a stream that opened one
            # per step would; this stream may have opened more (a step redone).
            reply_id = self._reply_id
            final = {**final, "output": [_renamed(i, reply_id) for i in final["output"]]}
        assert self.status is not None
        kind = TERMINAL_EVENT.get(str(final["status"]), TERMINAL_EVENT[self.status])
        self._emit(out, kind, response=final)

    # ------------------------------------------------------------------ text

    def new_step(self, index: int, attempt: int) -> StepView:
        """The walk's record of a step (a response's message items are kept apart)."""
        return StepView(index=index, attempt=attempt)

    def on_step_start(self, out: Out, step: StepView) -> None:
        """Nothing: a message item opens with the step's text."""

    def on_step_finish(self, out: Out, step: StepView) -> None:
        """Nothing: the step's message stays open until other text, a call or the end."""

    def _open(self, out: Out, step: int) -> _Message:
        attempt = self._opened.get(step, 0)
        self._opened[step] = attempt + 1
        message = _Message(
            index=self._items, item_id=message_id(self.meta.response_id, step, attempt), step=step
        )
        self._items += 1
        self._message = message
        self._emit(
            out,
            "response.output_item.added",
            output_index=message.index,
            item=message_item(message.item_id, None, "in_progress"),
        )
        self._emit(
            out,
            "response.content_part.added",
            item_id=message.item_id,
            output_index=message.index,
            content_index=0,
            part=text_part(""),
        )
        return message

    def _delta(self, out: Out, message: _Message, text: str) -> None:
        message.text += text
        self._emit(
            out,
            "response.output_text.delta",
            item_id=message.item_id,
            output_index=message.index,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _close(self, out: Out, message: _Message, status: str, phase: str | None = None) -> None:
        message.open = False
        message.status = status
        message.phase = phase
        common = {"item_id": message.item_id, "output_index": message.index, "content_index": 0}
        self._emit(out, "response.output_text.done", **common, text=message.text, logprobs=[])
        self._emit(out, "response.content_part.done", **common, part=text_part(message.text))
        self._emit(
            out,
            "response.output_item.done",
            output_index=message.index,
            item=message_item(message.item_id, message.text, status, phase),
        )

    def _abandon(self, out: Out, message: _Message) -> None:
        """The client holds text the turn will not commit: mark its item incomplete."""
        if message.open:
            self._close(out, message, "incomplete")
        elif message.status != "incomplete":
            message.status = "incomplete"
            message.phase = None
            self._emit(
                out,
                "response.output_item.done",
                output_index=message.index,
                item=message_item(message.item_id, message.text, "incomplete"),
            )

    def _close_open(self, out: Out) -> None:
        """The step's text is over (a tool call follows, or another step's text)."""
        if self._message is not None and self._message.open:
            self._close(out, self._message, "completed", "commentary")

    def on_text(self, out: Out, step: StepView, text: str) -> None:
        """The step's message item's ``response.output_text.delta``, opening the item if
        none is open for the step; while a redo is compared, only what the client does
        not hold (see the module)."""
        message = self._message
        if message is None or message.step != step.index:
            self._settle_echo(out)
            self._close_open(out)
            message = self._open(out, step.index)
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
                self._abandon(out, message)
                message = self._open(out, step.index)
        if not message.open:  # the redo goes on past a message the client holds closed
            message = self._open(out, step.index)
        self._delta(out, message, text)

    def on_restart(self, out: Out, index: int, reason: str, dropped: StepView | None) -> None:
        """Nothing yet: the redo is compared with what the client holds of the step (not
        with text it was told is incomplete: that one a new item replaces whole)."""
        message = self._message
        held = message is not None and message.step == index and message.status != "incomplete"
        self._echo = 0 if held else None

    def _settle_echo(self, out: Out) -> None:
        """The redo's text ended: if it is shorter than what the client holds, the held
        text is replaced by it."""
        position, self._echo = self._echo, None
        message = self._message
        if position is None or message is None or position >= len(message.text):
            return
        redo = message.text[:position]
        self._abandon(out, message)
        if redo:
            self._delta(out, self._open(out, message.step), redo)

    def reconcile(self, out: Out, step: StepView, committed: StepCommitted) -> None:
        """The step's message item made its committed text: the rest of it if the item
        is open and holds its start, else a new item with all of it (the held one
        abandoned), closed as commentary if the step called tools; the step's tool items
        are let go."""
        self._settle_echo(out)
        message = self._message
        mine = message if message is not None and message.step == committed.step else None
        if mine is not None and mine.text != committed.text:
            if mine.open and committed.text.startswith(mine.text):
                self._delta(out, mine, committed.text[len(mine.text) :])
            else:
                self._abandon(out, mine)
                mine = None
                if committed.text:
                    self._delta(out, self._open(out, committed.step), committed.text)
        elif mine is None and committed.text:
            # No token of the step was seen (they left the replay buffer): the text
            # arrives whole with the commit, after the text of the step before (which
            # its tokens would have closed).
            self._close_open(out)
            self._delta(out, self._open(out, committed.step), committed.text)
        if committed.tool_calls:
            # The text of a step that called tools is commentary: a stream closed it at
            # the step's first call, a replay without its tokens closes it here.
            self._close_open(out)
        for call in committed.tool_calls:
            self._used.setdefault(call.id, committed.step)
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

    def on_tool_call(self, out: Out, call: ToolCalled) -> None:
        """A ``function_call`` item (once per call id while its step is redone: a redo's
        different call updates it)."""
        self._settle_echo(out)
        self._close_open(out)
        self._hold(call.step)
        item_id = call_item_id(self.meta.response_id, call.step, call.call_id)
        shown = shown_call_id(call.call_id, call.step, self._used)
        done = function_call_item(item_id, shown, call.name, call.arguments, "completed")
        held = self._calls.get(call.call_id)
        if held is not None:
            if held.item != done:  # the redo called it otherwise: the item says so
                held.item = done
                self._emit(out, "response.output_item.done", output_index=held.index, item=done)
            return
        index = self._items
        self._items += 1
        self._calls[call.call_id] = _Item(index, done)
        self._emit(
            out,
            "response.output_item.added",
            output_index=index,
            item=function_call_item(item_id, shown, call.name, "", "in_progress"),
        )
        if call.arguments:
            self._emit(
                out,
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=call.arguments,
            )
        self._emit(
            out,
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=index,
            arguments=call.arguments,
        )
        self._emit(out, "response.output_item.done", output_index=index, item=done)

    def on_tool_result(self, out: Out, result: ToolAnswered) -> None:
        """A ``function_call_output`` item (once per call id, as a call's)."""
        self._settle_echo(out)
        self._close_open(out)
        self._hold(result.step)
        item_id = output_item_id(self.meta.response_id, result.step, result.call_id)
        shown = shown_call_id(result.call_id, result.step, self._used)
        done = function_output_item(item_id, shown, result.content, "completed")
        held = self._outputs.get(result.call_id)
        if held is not None:
            if held.item != done:
                held.item = done
                self._emit(out, "response.output_item.done", output_index=held.index, item=done)
            return
        index = self._items
        self._items += 1
        self._outputs[result.call_id] = _Item(index, done)
        self._emit(
            out,
            "response.output_item.added",
            output_index=index,
            item=function_output_item(item_id, shown, result.content, "in_progress"),
        )
        self._emit(out, "response.output_item.done", output_index=index, item=done)

    def on_approval_requested(self, out: Out, asked: ApprovalRequested) -> None:
        """An ``mcp_approval_request`` item (OpenAI's), its id the approval id."""
        self._settle_echo(out)
        self._close_open(out)
        item = approval_item(asked.approval_id, asked.tool, asked.arguments)
        index = self._items
        self._items += 1
        self._emit(out, "response.output_item.added", output_index=index, item=item)
        self._emit(out, "response.output_item.done", output_index=index, item=item)


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
