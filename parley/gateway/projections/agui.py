"""A turn's parley events as AG-UI events (the Agent-User Interaction protocol, 1.0, as
``@ag-ui/core`` declares it): the pure half of ``POST /v1/ag-ui``.

One AG-UI *run* is one parley turn.  The mapping:

============================  ==========================================================
parley                        AG-UI
============================  ==========================================================
(before anything)             ``RUN_STARTED`` (``metadata.parley``: session and turn ids)
first event of step *k*       ``STEP_STARTED`` (``stepName`` ``"step k"``)
``token``                     ``TEXT_MESSAGE_START`` (once; the step's assistant message,
                              id ``<turn>:<k>``), ``TEXT_MESSAGE_CONTENT``
``tool_call``                 ``TEXT_MESSAGE_END`` (if open), ``TOOL_CALL_START`` (parent:
                              the step's message), ``TOOL_CALL_ARGS``, ``TOOL_CALL_END``
``tool_result``               ``TOOL_CALL_RESULT`` (a tool message)
``step`` (committed)          the rest of the step's text if the stream lacked it (a
                              replay whose tokens aged out), ``TEXT_MESSAGE_END``,
                              ``STEP_FINISHED``
``step_restarted``            ``TEXT_MESSAGE_END`` (if open), ``CUSTOM``
                              ``parley.step_restarted``, and a ``MESSAGES_SNAPSHOT``
                              without the step's provisional messages (see below)
``steer``                     ``CUSTOM`` ``parley.steer``
``refusal``                   ``CUSTOM`` ``parley.refusal``
``check``                     ``CUSTOM`` ``parley.check``
``throttled``                 ``CUSTOM`` ``parley.throttled`` (``model``, ``seconds``): the
                              turn waits for provider capacity, holding no worker
``approval_requested``        ``TOOL_CALL_START``/``ARGS``/``END`` for the waiting call (once:
                              not again when it runs), ``CUSTOM``
                              ``parley.approval_requested``; once every call the turn waits
                              on is shown, the route ends the run: ``RUN_FINISHED`` with
                              ``outcome: interrupt`` (:meth:`AgUiRun.interrupt`)
``approval_answered``         ``CUSTOM`` ``parley.approval_answered``
``end``                       closes what is open; the last ``end`` becomes, at close:
                              ``RUN_ERROR`` for ``failed``, ``RUN_FINISHED`` with
                              ``outcome: cancelled`` for ``cancelled``, ``RUN_FINISHED``
                              (``outcome: success``, ``result``: outcome and reply)
                              for the rest
``queued``, ``started``       nothing
============================  ==========================================================

AG-UI has no way to take text back, and a redone step (a crash, a failed or diverged
stream: ``step_restarted``) retracts what its step streamed.  A ``MESSAGES_SNAPSHOT``
is AG-UI's way to say which messages the client holds: the one sent at a restart lists
the run's input messages and every message of this run except the restarted step's, so a
stock client drops the provisional text (and any tool call the dead attempt announced),
and the redone step streams into fresh messages under the same ids.  The ``CUSTOM``
event before it names what was dropped, for a client that renders events itself.

Ids are unique across a thread (a client keeps every run's messages): message ids and
tool-call ids are prefixed with the turn id.  Only fields ``@ag-ui/core`` declares are
sent (a stock client strips, and warns about, any other).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from parley.gateway.projections.agui_events import (
    CUSTOM_APPROVAL_ANSWERED,
    CUSTOM_APPROVAL_REQUESTED,
    CUSTOM_REFUSAL,
    CUSTOM_STEP_RESTARTED,
    approval_interrupt,
    custom_event,
    notice_event,
    step_name,
)
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
from schemas.records import TurnStatus


@dataclass
class _Step:
    """What this run has shown of one step since its last restart."""

    index: int
    message_id: str
    text: str = ""
    held: str = ""
    """The text the client already holds under ``message_id`` (a replay's input)."""
    shown: int = 0
    """How much of ``text`` the client holds (sent now, or held already)."""
    text_open: bool = False
    message_ids: list[str] = field(default_factory=list)
    """This step's messages in the snapshot list (its assistant message, tool results)."""
    tool_call_ids: list[str] = field(default_factory=list)


class AgUiRun:
    """The AG-UI events of one turn, fed its parley events in seq order.

    ``input_messages`` are the ``RunAgentInput``'s messages as the client sent them: a
    restart's ``MESSAGES_SNAPSHOT`` repeats them, since a snapshot lists every message the
    client is to keep."""

    def __init__(
        self,
        *,
        thread_id: str,
        run_id: str,
        session_id: str,
        turn_id: str,
        input_messages: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.session_id = session_id
        self.turn_id = turn_id
        self._input = [dict(m) for m in input_messages]
        # What the client holds already: a request that repeats a message answers the
        # turn that message made, replayed, and a stock client appends a replayed
        # message's text to the message it holds under that id.  So the replay sends only
        # what the client lacks (the rest of a reply it saw cut, say).
        self._held_text: dict[str, str] = {}
        self._held_calls: dict[str, list[str]] = {}  # by the message that carries them
        self._held_results: set[str] = set()
        for message in self._input:
            if message.get("role") == "assistant":
                key = str(message.get("id"))
                content = message.get("content")
                self._held_text[key] = content if isinstance(content, str) else ""
                calls = message.get("toolCalls")
                self._held_calls[key] = [
                    str(call.get("id")) for call in calls or () if isinstance(call, dict)
                ]
            elif message.get("role") == "tool":
                self._held_results.add(str(message.get("id")))
        # This run's messages in the order a client holds them, by id.
        self._messages: dict[str, dict[str, Any]] = {}
        self._step: _Step | None = None
        self._end: Ended | None = None
        self._closed = False
        # Approvals asked and not answered yet, with the AG-UI id of the call each is for.
        self._pending: dict[str, tuple[ApprovalRequested, str]] = {}

    # ------------------------------------------------------------------ the run

    def opening(self) -> list[dict[str, Any]]:
        """``RUN_STARTED``."""
        return [
            {
                "type": "RUN_STARTED",
                "threadId": self.thread_id,
                "runId": self.run_id,
                "metadata": {"parley": {"sessionId": self.session_id, "turnId": self.turn_id}},
            }
        ]

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """The AG-UI events for the turn's next parley event."""
        if self._closed:
            return []
        out: list[dict[str, Any]] = []
        payload = event.payload
        match payload:
            case Token() if payload.text:
                self._text(out, payload.step, payload.text)
            case ToolCalled():
                self._tool_call(out, payload)
            case ToolAnswered():
                self._tool_result(out, payload)
            case StepCommitted():
                self._committed(out, payload)
            case StepRestarted():
                self._restarted(out, payload.step, payload.reason)
            case ApprovalRequested():
                self._asked(out, payload)
            case Steered() | Refused() | Checked() | ApprovalAnswered() | Throttled():
                out.append(self._notice(payload))
            case Ended():
                # Not the run's end yet: a resumed turn goes on in the same feed.  What is
                # open closes now (an interrupted stream's text stays, display-only).
                self._finish_step(out)
                self._end = payload
        return out  # (queued, started: nothing a client renders)

    def _notice(
        self, payload: Steered | Refused | Checked | ApprovalAnswered | Throttled
    ) -> dict[str, Any]:
        """The custom event of what a client shows beside the messages."""
        match payload:
            case Steered() | Checked() | Throttled():
                return notice_event(payload)
            case Refused():
                value: dict[str, Any] = {
                    "toolCallId": self._tool_call_id(payload.call_id),
                    "tool": payload.tool,
                    "rule": payload.rule,
                    "reason": payload.reason,
                }
                return custom_event(CUSTOM_REFUSAL, value)
        self._pending.pop(payload.approval_id, None)
        value = {
            "approvalId": payload.approval_id,
            "decision": payload.decision,
            "reason": payload.reason,
        }
        return custom_event(CUSTOM_APPROVAL_ANSWERED, value)

    def close(self, cut: str | None = None) -> list[dict[str, Any]]:
        """``RUN_FINISHED`` or ``RUN_ERROR``, from the last ``end`` (``RUN_ERROR`` with
        ``cut`` as its message if the feed ended without one)."""
        if self._closed:
            return []
        self._closed = True
        out: list[dict[str, Any]] = []
        self._finish_step(out)
        end = self._end
        metadata: dict[str, Any] = {"sessionId": self.session_id, "turnId": self.turn_id}
        if end is None:
            message = cut or "the turn's event stream ended before the turn did"
            out.append({"type": "RUN_ERROR", "message": message, "code": "stream_cut"})
            return out
        metadata["outcome"] = end.outcome
        if end.outcome == TurnStatus.FAILED:
            out.append(
                {
                    "type": "RUN_ERROR",
                    "message": end.error or "the turn failed",
                    "code": "failed",
                    "metadata": {"parley": metadata},
                }
            )
            return out
        finished: dict[str, Any] = {
            "type": "RUN_FINISHED",
            "threadId": self.thread_id,
            "runId": self.run_id,
            "metadata": {"parley": metadata},
        }
        if end.outcome == TurnStatus.CANCELLED:
            # AG-UI's own word for a run stopped before it completed; it carries no result.
            finished["outcome"] = {"type": "cancelled"}
        else:
            finished["outcome"] = {"type": "success"}
            result: dict[str, Any] = {"outcome": end.outcome, "reply": end.reply}
            if end.undelivered:
                result["undelivered"] = list(end.undelivered)
            finished["result"] = result
        out.append(finished)
        return out

    # ------------------------------------------------------------------ steps

    def _open_step(self, out: list[dict[str, Any]], index: int) -> _Step:
        step = self._step
        if step is not None and step.index == index:
            return step
        self._finish_step(out)
        step = self._step = self._new_step(index)
        out.append({"type": "STEP_STARTED", "stepName": step_name(index)})
        return step

    def _new_step(self, index: int) -> _Step:
        message_id = f"{self.turn_id}:{index}"
        held = self._held_text.get(message_id, "")
        return _Step(index=index, message_id=message_id, held=held, shown=len(held))

    def _finish_step(self, out: list[dict[str, Any]]) -> None:
        step = self._step
        if step is None:
            return
        self._end_text(out, step)
        out.append({"type": "STEP_FINISHED", "stepName": step_name(step.index)})
        self._step = None

    def _assistant(self, step: _Step) -> dict[str, Any]:
        """The step's assistant message in the snapshot list (made when first needed)."""
        message = self._messages.get(step.message_id)
        if message is None:
            message = self._messages[step.message_id] = {"id": step.message_id, "role": "assistant"}
            step.message_ids.append(step.message_id)
        return message

    def _text(self, out: list[dict[str, Any]], index: int, text: str) -> None:
        step = self._open_step(out, index)
        message = self._assistant(step)
        step.text += text
        message["content"] = step.text
        if (
            step.held
            and not step.text.startswith(step.held)
            and not step.held.startswith(step.text)
        ):
            step.held, step.shown = "", 0  # not the text it holds: send it all
        if len(step.text) <= step.shown:
            return  # the client holds this much already
        if not step.text_open:
            # Reopening the step's message (after a tool call, or one the client holds)
            # appends to it: a stock client finds the message by id.
            out.append(
                {"type": "TEXT_MESSAGE_START", "messageId": step.message_id, "role": "assistant"}
            )
            step.text_open = True
        delta = step.text[step.shown :]
        step.shown = len(step.text)
        out.append({"type": "TEXT_MESSAGE_CONTENT", "messageId": step.message_id, "delta": delta})

    def _end_text(self, out: list[dict[str, Any]], step: _Step) -> None:
        if step.text_open:
            out.append({"type": "TEXT_MESSAGE_END", "messageId": step.message_id})
            step.text_open = False

    def _tool_call_id(self, call_id: str) -> str:
        return f"{self.turn_id}:{call_id}"

    def _tool_call(self, out: list[dict[str, Any]], call: ToolCalled) -> None:
        self._announce(out, call.step, call.call_id, call.name, call.arguments)

    def _announce(
        self, out: list[dict[str, Any]], index: int, parley_call_id: str, name: str, arguments: str
    ) -> str:
        """``TOOL_CALL_*`` for a call, once per run (an approval announces it before it
        runs) and not at all if the client holds it; its AG-UI id."""
        step = self._open_step(out, index)
        self._end_text(out, step)
        call_id = self._tool_call_id(parley_call_id)
        if call_id in step.tool_call_ids:
            return call_id
        if call_id not in self._held_calls.get(step.message_id, ()):
            out.append(
                {
                    "type": "TOOL_CALL_START",
                    "toolCallId": call_id,
                    "toolCallName": name,
                    "parentMessageId": step.message_id,
                }
            )
            if arguments:
                out.append({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": arguments})
            out.append({"type": "TOOL_CALL_END", "toolCallId": call_id})
        message = self._assistant(step)
        message.setdefault("toolCalls", []).append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
        step.tool_call_ids.append(call_id)
        return call_id

    # ------------------------------------------------------------------ approvals

    def _asked(self, out: list[dict[str, Any]], asked: ApprovalRequested) -> None:
        arguments = json.dumps(asked.arguments, separators=(",", ":"))
        call_id = self._announce(out, asked.step, asked.call_id, asked.tool, arguments)
        self._pending[asked.approval_id] = (asked, call_id)
        value = {
            "approvalId": asked.approval_id,
            "toolCallId": call_id,
            "tool": asked.tool,
            "arguments": asked.arguments,
            "accesses": [dict(a) for a in asked.accesses],
            "rule": asked.rule,
            "expiresAt": asked.expires_at,
        }
        out.append(custom_event(CUSTOM_APPROVAL_REQUESTED, value))

    @property
    def asked(self) -> set[str]:
        """The approvals this run has seen asked and not yet answered."""
        return set(self._pending)

    def interrupt(self, approval_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The run's end while the turn waits for ``approval_ids`` (each seen asked):
        ``RUN_FINISHED`` with AG-UI's ``interrupt`` outcome, one interrupt per approval
        (its id the approval id; a ``resume`` entry answers it: ``resolved`` approves,
        ``cancelled`` denies).  Nothing if one of them was not seen."""
        if self._closed or not approval_ids or not set(approval_ids) <= set(self._pending):
            return []
        self._closed = True
        out: list[dict[str, Any]] = []
        self._finish_step(out)
        interrupts = []
        for approval_id in approval_ids:
            asked, call_id = self._pending[approval_id]
            interrupts.append(approval_interrupt(asked, call_id, self.turn_id))
        out.append(
            {
                "type": "RUN_FINISHED",
                "threadId": self.thread_id,
                "runId": self.run_id,
                "metadata": {
                    "parley": {
                        "sessionId": self.session_id,
                        "turnId": self.turn_id,
                        "outcome": "waiting",
                    }
                },
                "outcome": {"type": "interrupt", "interrupts": interrupts},
            }
        )
        return out

    def _tool_result(self, out: list[dict[str, Any]], result: ToolAnswered) -> None:
        step = self._open_step(out, result.step)
        call_id = self._tool_call_id(result.call_id)
        message_id = f"{call_id}:result"
        if message_id not in self._held_results:
            out.append(
                {
                    "type": "TOOL_CALL_RESULT",
                    "messageId": message_id,
                    "toolCallId": call_id,
                    "content": result.content,
                    "role": "tool",
                }
            )
        self._messages[message_id] = {
            "id": message_id,
            "role": "tool",
            "toolCallId": call_id,
            "content": result.content,
        }
        step.message_ids.append(message_id)

    def _committed(self, out: list[dict[str, Any]], committed: StepCommitted) -> None:
        step = self._open_step(out, committed.step)
        if committed.text != step.text:
            if not committed.text.startswith(step.text):
                # The stream shown is not a prefix of what committed (never so while the
                # step restarts as parley promises): retract it like a restart.
                self._restarted(out, committed.step, "diverged")
                step = self._open_step(out, committed.step)
            # What the stream lacked: a replay whose tokens aged out of the buffer has
            # none at all, and gets the committed text whole.
            missing = committed.text[len(step.text) :]
            if missing:
                self._text(out, committed.step, missing)
        self._finish_step(out)

    def _restarted(self, out: list[dict[str, Any]], index: int, reason: str) -> None:
        step = self._step if self._step is not None and self._step.index == index else None
        message_id = f"{self.turn_id}:{index}"
        dropped: list[str] = []
        calls: list[str] = []
        if step is not None:
            self._end_text(out, step)
            dropped, calls = list(step.message_ids), list(step.tool_call_ids)
        # On a replay the client may hold this step as a later attempt made it: that goes
        # too, and the redone attempt streams whole.
        if message_id in self._held_text and message_id not in dropped:
            dropped.insert(0, message_id)
        for call_id in self._held_calls.pop(message_id, []):
            calls += [] if call_id in calls else [call_id]
            result_id = f"{call_id}:result"
            if result_id in self._held_results and result_id not in dropped:
                dropped.append(result_id)
        held = message_id in self._held_text
        for key in dropped:
            self._messages.pop(key, None)
            self._held_text.pop(key, None)
            self._held_results.discard(key)
        gone = set(dropped)
        if held:
            # A message the client had before this run may have later ones after it: it
            # is emptied where it is rather than dropped (a stock client appends a message
            # it does not hold).  Tool results go: a client puts each after its call.
            gone.discard(message_id)
            self._held_text[message_id] = ""
            self._messages[message_id] = {"id": message_id, "role": "assistant"}
        if step is not None:
            # The redone step starts from nothing, under the same ids (the client no
            # longer holds them once the snapshot below is applied).
            self._step = self._new_step(index)
        value = {"step": index, "reason": reason, "messageIds": dropped, "toolCallIds": calls}
        out.append(custom_event(CUSTOM_STEP_RESTARTED, value))
        if dropped:
            out.append({"type": "MESSAGES_SNAPSHOT", "messages": self._snapshot(gone)})

    def _snapshot(self, dropped: set[str]) -> list[dict[str, Any]]:
        """Every message the client is to keep: the input's (this run's version of those
        it replays), then this run's others, without ``dropped``."""
        given = {str(m.get("id")) for m in self._input}
        messages = [
            self._messages.get(str(m.get("id")), m)
            for m in self._input
            if str(m.get("id")) not in dropped
        ]
        messages += [m for key, m in self._messages.items() if key not in given]
        copied: list[dict[str, Any]] = json.loads(json.dumps(messages))
        return copied
