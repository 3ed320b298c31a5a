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
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.events import (
    ApprovalAnswered,
    ApprovalRequested,
    Checked,
    Ended,
    Event,
    Refused,
    Steered,
    StepCommitted,
    StepRestarted,
    Throttled,
    Token,
    ToolAnswered,
    ToolCalled,
)
from schemas.records import Decision, TurnStatus

DATA_STEER = "data-parley-steer"
DATA_REFUSAL = "data-parley-refusal"
DATA_CHECK = "data-parley-check"
DATA_STEP_RESTARTED = "data-parley-step-restarted"
DATA_THROTTLED = "data-parley-throttled"

FINISH_REASONS = {
    TurnStatus.FINISHED: "stop",
    TurnStatus.SUCCEEDED: "stop",
    TurnStatus.BUDGET_EXCEEDED: "length",
    TurnStatus.CHECK_FAILED: "other",
}


@dataclass
class _Step:
    """What this message has shown of one step since its last restart."""

    index: int
    attempt: int
    text: str = ""
    text_open: bool = False
    text_ids: list[str] = field(default_factory=list)
    settled: bool = False
    """The client holds this step's text already (a continuation opened on it)."""


class UiMessageStream:
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
        self.session_id = session_id
        self.turn_id = turn_id
        self._step: _Step | None = None
        if open_step is not None:
            self._step = _Step(index=open_step, attempt=0, settled=True)
        # Calls shown as tool parts before they ran (asked about), and those denied.
        self._pending: dict[str, str] = dict(asked or {})  # approval id → call id
        self._announced: set[str] = set(self._pending.values())
        self._denied: set[str] = set()
        # Restarts so far, by step: a redone step's text part gets a fresh id.
        self._restarts: dict[int, int] = {}
        self._end: Ended | None = None
        self._closed = False

    def _ids(self) -> dict[str, Any]:
        return {"sessionId": self.session_id, "turnId": self.turn_id}

    def opening(self) -> list[dict[str, Any]]:
        """``start``."""
        return [
            {
                "type": "start",
                "messageId": self.turn_id,
                "messageMetadata": {"parley": self._ids()},
            }
        ]

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """The chunks for the turn's next parley event."""
        if self._closed:
            return []
        out: list[dict[str, Any]] = []
        payload = event.payload
        match payload:
            case Token() if payload.text:
                self._text(out, payload.step, payload.text)
            case ToolCalled():
                arguments = _arguments(payload.arguments)
                self._show_call(out, payload.step, payload.call_id, payload.name, arguments)
            case ApprovalRequested() | ApprovalAnswered():
                self._approval(out, payload)
            case ToolAnswered():
                self._tool_result(out, payload)
            case StepCommitted():
                self._committed(out, payload)
            case StepRestarted():
                self._restarted(out, payload.step, payload.reason)
            case Steered() | Refused() | Checked() | Throttled():
                out.append(_notice(payload, event.seq))
            case Ended():
                # Not the message's end yet: a resumed turn goes on in the same feed.
                self._finish_step(out)
                self._end = payload
        return out  # (queued, started: nothing to show)

    def _approval(
        self, out: list[dict[str, Any]], payload: ApprovalRequested | ApprovalAnswered
    ) -> None:
        if isinstance(payload, ApprovalRequested):
            self._asked(out, payload)
        else:
            self._answered(out, payload)

    def _asked(self, out: list[dict[str, Any]], asked: ApprovalRequested) -> None:
        self._show_call(out, asked.step, asked.call_id, asked.tool, asked.arguments)
        self._pending[asked.approval_id] = asked.call_id
        out.append(
            {
                "type": "tool-approval-request",
                "approvalId": asked.approval_id,
                "toolCallId": asked.call_id,
            }
        )

    def _answered(self, out: list[dict[str, Any]], answered: ApprovalAnswered) -> None:
        call_id = self._pending.pop(answered.approval_id, None)
        if call_id is not None and answered.decision == Decision.DENIED:
            # The SDK's own end for a denied call; the result parley gives the
            # model for it (saying why) is not shown again.
            self._denied.add(call_id)
            out.append({"type": "tool-output-denied", "toolCallId": call_id})

    def _tool_result(self, out: list[dict[str, Any]], result: ToolAnswered) -> None:
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

    @property
    def asked(self) -> set[str]:
        """The approvals this stream has shown asked and not yet answered."""
        return set(self._pending)

    def interrupt(self, approval_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The message's end while the turn waits for ``approval_ids`` (each shown asked:
        ``tool-approval-request``): ``finish`` with ``finishReason: tool-calls``, as the
        SDK ends a step whose calls wait for approval.  The app answers them with
        ``addToolApprovalResponse``, and the next request streams the turn on.  Nothing
        if one of them was not shown."""
        if self._closed or not approval_ids or not set(approval_ids) <= set(self._pending):
            return []
        return self.waiting()

    def waiting(self) -> list[dict[str, Any]]:
        """The message's end while the turn waits for a person (see :meth:`interrupt`)."""
        self._closed = True
        out: list[dict[str, Any]] = []
        self._finish_step(out)
        metadata = {"parley": {**self._ids(), "outcome": "waiting"}}
        out.append({"type": "finish", "finishReason": "tool-calls", "messageMetadata": metadata})
        return out

    def close(self, cut: str | None = None) -> list[dict[str, Any]]:
        """The terminal chunks, from the last ``end`` (an ``error`` with ``cut`` if the
        feed ended without one)."""
        if self._closed:
            return []
        self._closed = True
        out: list[dict[str, Any]] = []
        self._finish_step(out)
        end = self._end
        if end is None:
            out.append({"type": "error", "errorText": cut or "the turn's stream ended early"})
            return out
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
        return out

    # ------------------------------------------------------------------ steps

    def _open_step(self, out: list[dict[str, Any]], index: int) -> _Step:
        step = self._step
        if step is not None and step.index == index:
            return step
        self._finish_step(out)
        step = self._step = _Step(index=index, attempt=self._restarts.get(index, 0))
        out.append({"type": "start-step"})
        return step

    def _finish_step(self, out: list[dict[str, Any]]) -> None:
        step = self._step
        if step is None:
            return
        self._end_text(out, step)
        out.append({"type": "finish-step"})
        self._step = None

    def _text_id(self, step: _Step) -> str:
        base = f"{self.turn_id}:{step.index}"
        return base if step.attempt == 0 else f"{base}:{step.attempt}"

    def _text(self, out: list[dict[str, Any]], index: int, text: str) -> None:
        step = self._open_step(out, index)
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
                    "providerMetadata": {"parley": {"textId": text_id, "step": index}},
                }
            )
            step.text_open = True
        out.append({"type": "text-delta", "id": step.text_ids[-1], "delta": text})
        step.text += text

    def _end_text(self, out: list[dict[str, Any]], step: _Step) -> None:
        if step.text_open:
            out.append({"type": "text-end", "id": step.text_ids[-1]})
            step.text_open = False

    def _show_call(
        self, out: list[dict[str, Any]], index: int, call_id: str, name: str, arguments: Any
    ) -> None:
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

    def _committed(self, out: list[dict[str, Any]], committed: StepCommitted) -> None:
        step = self._open_step(out, committed.step)
        if step.settled:
            step.text = committed.text  # a continuation: the client shows the text it had
        if committed.text != step.text:
            if not committed.text.startswith(step.text):
                self._restarted(out, committed.step, "diverged")
                step = self._open_step(out, committed.step)
            missing = committed.text[len(step.text) :]
            if missing:
                self._text(out, committed.step, missing)
        self._finish_step(out)

    def _restarted(self, out: list[dict[str, Any]], index: int, reason: str) -> None:
        step = self._step if self._step is not None and self._step.index == index else None
        retracted: list[str] = []
        if step is not None:
            self._end_text(out, step)
            retracted = step.text_ids
        self._restarts[index] = self._restarts.get(index, 0) + 1
        if step is not None:
            # The step stays open (no new ``start-step``); its text starts again.
            self._step = _Step(index=index, attempt=self._restarts[index])
        data = {"step": index, "reason": reason, "textIds": retracted}
        part_id = f"restart:{index}:{self._restarts[index]}"
        out.append(_data(DATA_STEP_RESTARTED, part_id, data))


def _arguments(text: str) -> Any:
    """A call's arguments as the model gave them: parsed if JSON, else the text."""
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return text


def _data(kind: str, part_id: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "id": part_id, "data": data}


__all__ = [
    "DATA_CHECK",
    "DATA_REFUSAL",
    "DATA_STEER",
    "DATA_STEP_RESTARTED",
    "DATA_THROTTLED",
    "UiMessageStream",
]


def _notice(payload: Steered | Refused | Checked | Throttled, seq: int) -> dict[str, Any]:
    """The data part of what a UI shows beside the message's text and tools."""
    match payload:
        case Throttled():
            # Waiting for provider capacity, holding no worker: not hung.
            data: dict[str, Any] = {"model": payload.model, "seconds": payload.seconds}
            return _data(DATA_THROTTLED, f"throttled:{seq}", data)
        case Steered():
            data = {"position": payload.position, "text": payload.text}
            return _data(DATA_STEER, f"steer:{payload.position}", data)
        case Refused():
            data = {
                "toolCallId": payload.call_id,
                "tool": payload.tool,
                "rule": payload.rule,
                "reason": payload.reason,
            }
            return _data(DATA_REFUSAL, f"refusal:{payload.call_id}", data)
    data = {"passed": payload.passed, "exitCode": payload.exit_code, "output": payload.output}
    return _data(DATA_CHECK, f"check:{seq}", data)
