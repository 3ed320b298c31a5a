"""A turn's parley events as the AI SDK's UI message stream, v1 (the chunks the ``ai``
package's ``DefaultChatTransport`` parses): the pure half of ``POST /v1/chat`` and
``GET /v1/chat/{id}/stream``.

One assistant ``UIMessage`` is one parley turn (its id is the turn id).  The mapping:

============================  ==========================================================
parley                        UI message stream chunk
============================  ==========================================================
(before anything)             ``start`` (``messageId``: the turn id; ``messageMetadata``:
                              ``{"parley": {sessionId, turnId}}``)
first event of step *k*       ``start-step``
``token``                     ``text-start`` (once per step and attempt), ``text-delta``
``tool_call``                 ``text-end`` (if open), ``tool-input-available`` (``input``:
                              the arguments parsed, or their text if not JSON)
``tool_result``               ``tool-output-available`` (``output``: the tool's text), or
                              ``tool-output-error`` for an error or a refusal
``step`` (committed)          the rest of the step's text if the stream lacked it,
                              ``text-end``, ``finish-step``
``step_restarted``            ``text-end`` (if open) and a ``data-parley-step-restarted``
                              part naming the retracted text part
``steer``                     a ``data-parley-steer`` part
``refusal``                   a ``data-parley-refusal`` part
``check``                     a ``data-parley-check`` part
``throttled``                 a ``data-parley-throttled`` part (``model``, ``seconds``):
                              the turn waits for provider capacity, holding no worker
``waiting``                   a ``data-parley-waiting`` part (``callId``, ``event``,
                              ``until``): a call waits for an event, holding no worker
``compacted``                 a ``data-parley-compacted`` part (``compactionId``,
                              ``throughTurnId``, ``strategy``, ``text``, ``tokensBefore``,
                              ``tokensAfter``): docs/compaction.md
``agent_started``             a ``data-parley-agent`` part (``call_id``, ``agent``,
                              ``turn_id``, ``session_id``, ``status: running``), its id
                              the call's
``agent_ended``               the same part again (same id: it replaces the first), with
                              ``status`` the child's outcome
``approval_requested``        ``tool-input-available`` (once: not again when the call
                              runs), ``tool-approval-request``; once every call the turn
                              waits on is shown, the route ends the message:
                              ``finish`` with ``tool-calls`` (:meth:`UiMessageStream.interrupt`)
``approval_answered``         ``tool-output-denied`` for a denial (the denial's tool result
                              is not shown again)
``end``                       closes what is open; the last ``end`` becomes, at close:
                              ``finish`` (``finishReason`` ``stop`` for ``finished`` and
                              ``succeeded``, ``length`` for ``budget_exceeded``, ``other``
                              for ``check_failed``), ``abort`` for ``cancelled``, or
                              ``error`` then ``finish`` (``error``) for ``failed``
============================  ==========================================================

The route ends the stream with ``data: [DONE]``.

The UI message stream cannot take text back, and a stock client keeps every text part it
was sent: a restarted step's provisional text stays in the message as a part of its own,
and the redone step streams into a new one.  Each text part carries its id in
``providerMetadata.parley.textId``, and the ``data-parley-step-restarted`` part lists
the ids retracted, so a UI hides those parts (docs/protocols.md shows the filter).

The walk (the open step, its streamed text and its commit reconciled with it, restarts,
the last ``end``, the approvals pending) is the base's, ``base.TurnProjection``; this
module formats each of its hooks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, final

from parley.gateway.projections.base import Out, StepView, TurnProjection
from parley.schemas.events import (
    AgentEnded,
    AgentStarted,
    ApprovalAnswered,
    ApprovalRequested,
    Checked,
    Compacted,
    Ended,
    Queued,
    Refused,
    Started,
    Steered,
    Throttled,
    ToolAnswered,
    ToolCalled,
    WaitingForEvent,
)
from parley.schemas.records import Decision, TurnStatus

DATA_STEER = "data-parley-steer"
DATA_REFUSAL = "data-parley-refusal"
DATA_CHECK = "data-parley-check"
DATA_STEP_RESTARTED = "data-parley-step-restarted"
DATA_THROTTLED = "data-parley-throttled"
DATA_WAITING = "data-parley-waiting"
DATA_COMPACTED = "data-parley-compacted"
DATA_AGENT = "data-parley-agent"

FINISH_REASONS = {
    TurnStatus.FINISHED: "stop",
    TurnStatus.SUCCEEDED: "stop",
    TurnStatus.BUDGET_EXCEEDED: "length",
    TurnStatus.CHECK_FAILED: "other",
}


@dataclass(kw_only=True)
class _Step(StepView):
    """What this message has shown of one step since its last restart."""

    text_open: bool = False
    text_ids: list[str] = field(default_factory=list)


@final
class UiMessageStream(TurnProjection[_Step]):
    """The UI message stream chunks of one turn, fed its parley events in seq order."""

    def __init__(
        self,
        *,
        session_id: str,
        turn_id: str,
        open_step: int | None = None,
        asked: Mapping[str, str] | None = None,
    ) -> None:
        """``open_step`` and ``asked`` make a continuation of a message the client holds
        (after its approval responses): that step is open in it, with its text, and the
        calls ``asked`` about (approval id → call id) are tool parts of it already."""
        super().__init__(asked=asked)
        self.session_id = session_id
        self.turn_id = turn_id
        if open_step is not None:
            self._continue_step(open_step)
        # Calls shown as tool parts before they ran (asked about), and those denied.
        self._announced: set[str] = set((asked or {}).values())
        self._denied: set[str] = set()

    def _ids(self) -> dict[str, Any]:
        return {"sessionId": self.session_id, "turnId": self.turn_id}

    def opening(self) -> Out:
        """``start``."""
        return [
            {
                "type": "start",
                "messageId": self.turn_id,
                "messageMetadata": {"parley": self._ids()},
            }
        ]

    def on_queued(self, out: Out, queued: Queued) -> None:
        """Nothing to show."""

    def on_started(self, out: Out, started: Started) -> None:
        """Nothing to show."""

    def on_end(self, out: Out, end: Ended) -> None:
        """Nothing yet: the message ends at :meth:`close`."""

    def on_tool_call(self, out: Out, call: ToolCalled) -> None:
        """``tool-input-available`` (see :meth:`_show_call`)."""
        self._show_call(out, call.step, call.call_id, call.name, _arguments(call.arguments))

    def on_approval_requested(self, out: Out, asked: ApprovalRequested) -> None:
        """The call's ``tool-input-available``, ``tool-approval-request``."""
        self._show_call(out, asked.step, asked.call_id, asked.tool, asked.arguments)
        out.append(
            {
                "type": "tool-approval-request",
                "approvalId": asked.approval_id,
                "toolCallId": asked.call_id,
            }
        )

    def on_approval_answered(
        self, out: Out, answered: ApprovalAnswered, call_id: str | None
    ) -> None:
        """``tool-output-denied`` for a denial of a call this stream showed asked."""
        if call_id is not None and answered.decision == Decision.DENIED:
            # The SDK's own end for a denied call; the result parley gives the
            # model for it (saying why) is not shown again.
            self._denied.add(call_id)
            out.append({"type": "tool-output-denied", "toolCallId": call_id})

    def on_tool_result(self, out: Out, result: ToolAnswered) -> None:
        """``tool-output-available``, or ``tool-output-error`` for an error or a refusal
        (nothing for a denied call)."""
        if result.call_id in self._denied:
            return
        self._open_step(out, result.step)
        if result.is_error:
            out.append(
                {
                    "type": "tool-output-error",
                    "toolCallId": result.call_id,
                    "errorText": result.content,
                }
            )
        else:
            out.append(
                {
                    "type": "tool-output-available",
                    "toolCallId": result.call_id,
                    "output": result.content,
                }
            )

    def waiting(self) -> Out:
        """The message's end while the turn waits for a person, whichever calls it waits
        on (see :meth:`on_interrupt`)."""
        return self._pause(())

    def on_interrupt(self, out: Out, approval_ids: Sequence[str]) -> None:
        """``finish`` with ``finishReason: tool-calls``, as the SDK ends a step whose calls
        wait for approval (each shown asked: ``tool-approval-request``).  The app answers
        them with ``addToolApprovalResponse``, and the next request streams the turn on."""
        metadata = {"parley": {**self._ids(), "outcome": "waiting"}}
        out.append({"type": "finish", "finishReason": "tool-calls", "messageMetadata": metadata})

    def on_close(self, out: Out, end: Ended | None, cut: str | None) -> None:
        """The terminal chunks, from the last ``end`` (an ``error`` with ``cut`` if the
        feed ended without one)."""
        if end is None:
            out.append({"type": "error", "errorText": cut or "the turn's stream ended early"})
            return
        metadata = {"parley": {**self._ids(), "outcome": end.outcome}}
        if end.outcome == TurnStatus.CANCELLED:
            out.append({"type": "message-metadata", "messageMetadata": metadata})
            out.append({"type": "abort", "reason": "cancelled"})
        elif end.outcome == TurnStatus.FAILED:
            out.append({"type": "error", "errorText": end.error or "the turn failed"})
            out.append({"type": "finish", "finishReason": "error", "messageMetadata": metadata})
        else:
            reason = FINISH_REASONS.get(TurnStatus(end.outcome), "other")
            out.append({"type": "finish", "finishReason": reason, "messageMetadata": metadata})

    # ------------------------------------------------------------------ steps

    def new_step(self, index: int, attempt: int) -> _Step:
        """A step's attempt (its text parts are named by it)."""
        return _Step(index=index, attempt=attempt)

    def on_step_start(self, out: Out, step: _Step) -> None:
        """``start-step``."""
        out.append({"type": "start-step"})

    def on_step_finish(self, out: Out, step: _Step) -> None:
        """``text-end`` (if open), ``finish-step``."""
        self._end_text(out, step)
        out.append({"type": "finish-step"})

    def _text_id(self, step: _Step) -> str:
        base = f"{self.turn_id}:{step.index}"
        return base if step.attempt == 0 else f"{base}:{step.attempt}"

    def on_text(self, out: Out, step: _Step, text: str) -> None:
        """``text-start`` (once per opening), ``text-delta``."""
        text_id = self._text_id(step)
        if not step.text_open:
            # A part per opening: after a tool call the step's text goes on in a new part
            # (the SDK keeps parts in order), under an id of its own.
            if step.text_ids:
                text_id = f"{text_id}.{len(step.text_ids)}"
            step.text_ids.append(text_id)
            out.append(
                {
                    "type": "text-start",
                    "id": text_id,
                    "providerMetadata": {"parley": {"textId": text_id, "step": step.index}},
                }
            )
            step.text_open = True
        out.append({"type": "text-delta", "id": step.text_ids[-1], "delta": text})

    def _end_text(self, out: Out, step: _Step) -> None:
        if step.text_open:
            out.append({"type": "text-end", "id": step.text_ids[-1]})
            step.text_open = False

    def _show_call(self, out: Out, index: int, call_id: str, name: str, arguments: Any) -> None:
        """``tool-input-available`` for a call, once (a call asked about is shown before
        it runs, and a continuation's client shows it already)."""
        self._end_text(out, self._open_step(out, index))
        if call_id in self._announced:
            return
        self._announced.add(call_id)
        out.append(
            {
                "type": "tool-input-available",
                "toolCallId": call_id,
                "toolName": name,
                "input": arguments,
            }
        )

    def on_restart(self, out: Out, index: int, reason: str, dropped: _Step | None) -> None:
        """``text-end`` (if open) and a ``data-parley-step-restarted`` part naming the
        retracted text parts."""
        retracted: list[str] = []
        if dropped is not None:
            self._end_text(out, dropped)
            retracted = dropped.text_ids
        data = {"step": index, "reason": reason, "textIds": retracted}
        part_id = f"restart:{index}:{self.restarts(index)}"
        out.append(_data(DATA_STEP_RESTARTED, part_id, data))

    # ------------------------------------------------------------------ notices

    def on_agent_started(self, out: Out, started: AgentStarted) -> None:
        """A ``data-parley-agent`` part: an agent call's child turn runs."""
        data: dict[str, Any] = {**started.to_json(), "status": "running"}
        out.append(_data(DATA_AGENT, f"agent:{started.call_id}", data))

    def on_agent_ended(self, out: Out, ended: AgentEnded) -> None:
        """The call's ``data-parley-agent`` part again, with the child's outcome: a data
        part with the id of an earlier one replaces it in the client's message."""
        data: dict[str, Any] = {
            "call_id": ended.call_id,
            "agent": ended.agent,
            "turn_id": ended.turn_id,
            "status": ended.outcome,
        }
        out.append(_data(DATA_AGENT, f"agent:{ended.call_id}", data))

    def on_throttled(self, out: Out, throttled: Throttled) -> None:
        """A ``data-parley-throttled`` part: waiting for provider capacity, holding no
        worker (not hung)."""
        data: dict[str, Any] = {"model": throttled.model, "seconds": throttled.seconds}
        out.append(_data(DATA_THROTTLED, f"throttled:{self.seq}", data))

    def on_waiting(self, out: Out, waiting: WaitingForEvent) -> None:
        """A ``data-parley-waiting`` part: a call waits for an event (or a time), holding
        no worker (not hung); its tool output comes when the wait ends."""
        data: dict[str, Any] = {
            "callId": waiting.call_id,
            "event": waiting.event,
            "until": waiting.until,
        }
        out.append(_data(DATA_WAITING, f"waiting:{waiting.call_id}", data))

    def on_compacted(self, out: Out, compacted: Compacted) -> None:
        """A ``data-parley-compacted`` part: a compaction now stands for the older turns
        the model sees (docs/compaction.md)."""
        data: dict[str, Any] = {
            "compactionId": compacted.compaction_id,
            "throughTurnId": compacted.through_turn_id,
            "strategy": compacted.strategy,
            "text": compacted.text,
            "tokensBefore": compacted.tokens_before,
            "tokensAfter": compacted.tokens_after,
        }
        out.append(_data(DATA_COMPACTED, f"compacted:{compacted.compaction_id}", data))

    def on_steer(self, out: Out, steered: Steered) -> None:
        """A ``data-parley-steer`` part."""
        data = {"position": steered.position, "text": steered.text}
        out.append(_data(DATA_STEER, f"steer:{steered.position}", data))

    def on_refusal(self, out: Out, refused: Refused) -> None:
        """A ``data-parley-refusal`` part."""
        data = {
            "toolCallId": refused.call_id,
            "tool": refused.tool,
            "rule": refused.rule,
            "reason": refused.reason,
        }
        out.append(_data(DATA_REFUSAL, f"refusal:{refused.call_id}", data))

    def on_check(self, out: Out, checked: Checked) -> None:
        """A ``data-parley-check`` part."""
        data = {"passed": checked.passed, "exitCode": checked.exit_code, "output": checked.output}
        out.append(_data(DATA_CHECK, f"check:{self.seq}", data))


def _arguments(text: str) -> Any:
    """A call's arguments as the model gave them: parsed if JSON, else the text."""
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return text


def _data(kind: str, part_id: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "id": part_id, "data": data}


__all__ = [
    "DATA_AGENT",
    "DATA_CHECK",
    "DATA_REFUSAL",
    "DATA_STEER",
    "DATA_STEP_RESTARTED",
    "DATA_THROTTLED",
    "DATA_WAITING",
    "UiMessageStream",
]
