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
``waiting``                   ``CUSTOM`` ``parley.waiting`` (``callId``, ``event``,
                              ``until``): a call waits for an event, holding no worker
``compacted``                 ``CUSTOM`` ``parley.compacted`` (``compactionId``,
                              ``throughTurnId``, ``strategy``, ``text``, ``tokensBefore``,
                              ``tokensAfter``): docs/compaction.md
``agent_started``             ``CUSTOM`` ``parley.agent_started`` (``call_id``, ``agent``,
                              ``turn_id``, ``session_id``): a call's child turn opened
``agent_ended``               ``CUSTOM`` ``parley.agent_ended`` (``call_id``, ``outcome``)
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

The walk (the open step, its streamed text and its commit reconciled with it, restarts,
the last ``end``, the approvals pending) is the base's, ``base.TurnProjection``; this
module formats each of its hooks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, final

from parley.gateway.projections.agui_events import (
    CUSTOM_AGENT_ENDED,
    CUSTOM_AGENT_STARTED,
    CUSTOM_APPROVAL_ANSWERED,
    CUSTOM_APPROVAL_REQUESTED,
    CUSTOM_REFUSAL,
    CUSTOM_STEP_RESTARTED,
    approval_interrupt,
    custom_event,
    notice_event,
    step_name,
)
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
from parley.schemas.records import TurnStatus


@dataclass(kw_only=True)
class _Step(StepView):
    """What this run has shown of one step since its last restart."""

    message_id: str
    held: str = ""
    """The text the client already holds under ``message_id`` (a replay's input)."""
    shown: int = 0
    """How much of ``text`` the client holds (sent now, or held already)."""
    text_open: bool = False
    message_ids: list[str] = field(default_factory=list)
    """This step's messages in the snapshot list (its assistant message, tool results)."""
    tool_call_ids: list[str] = field(default_factory=list)


@final
class AgUiRun(TurnProjection[_Step]):
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
        super().__init__()
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
        # This run's messages in the order a client holds them, by id, and the input's
        # that a restart took back (this run's message of the same id, if it streams one
        # again, is held instead).
        self._messages: dict[str, dict[str, Any]] = {}
        self._taken_back: set[str] = set()
        # The approvals asked, by id: an interrupt names each waiting call.
        self._requests: dict[str, ApprovalRequested] = {}

    # ------------------------------------------------------------------ the run

    def opening(self) -> Out:
        """``RUN_STARTED``."""
        return [
            {
                "type": "RUN_STARTED",
                "threadId": self.thread_id,
                "runId": self.run_id,
                "metadata": {"parley": {"sessionId": self.session_id, "turnId": self.turn_id}},
            }
        ]

    def on_queued(self, out: Out, queued: Queued) -> None:
        """Nothing a client renders."""

    def on_started(self, out: Out, started: Started) -> None:
        """Nothing a client renders."""

    def on_end(self, out: Out, end: Ended) -> None:
        """Nothing yet: the run ends at :meth:`close`.  What was open is closed (an
        interrupted stream's text stays, display-only)."""

    def on_steer(self, out: Out, steered: Steered) -> None:
        """``CUSTOM`` ``parley.steer``."""
        out.append(notice_event(steered))

    def on_check(self, out: Out, checked: Checked) -> None:
        """``CUSTOM`` ``parley.check``."""
        out.append(notice_event(checked))

    def on_agent_started(self, out: Out, started: AgentStarted) -> None:
        """``CUSTOM`` ``parley.agent_started``: an agent call's child turn opened."""
        out.append(custom_event(CUSTOM_AGENT_STARTED, started.to_json()))

    def on_agent_ended(self, out: Out, ended: AgentEnded) -> None:
        """``CUSTOM`` ``parley.agent_ended``: an agent call's child turn ended."""
        out.append(custom_event(CUSTOM_AGENT_ENDED, ended.to_json()))

    def on_throttled(self, out: Out, throttled: Throttled) -> None:
        """``CUSTOM`` ``parley.throttled``."""
        out.append(notice_event(throttled))

    def on_waiting(self, out: Out, waiting: WaitingForEvent) -> None:
        """``CUSTOM`` ``parley.waiting``: a call waits for an event (or a time), holding no
        worker (not hung); its tool result comes when the wait ends."""
        out.append(notice_event(waiting))

    def on_compacted(self, out: Out, compacted: Compacted) -> None:
        """``CUSTOM`` ``parley.compacted``: what the model sees of the older turns now."""
        out.append(notice_event(compacted))

    def on_refusal(self, out: Out, refused: Refused) -> None:
        """``CUSTOM`` ``parley.refusal``, naming the call by its AG-UI id."""
        value: dict[str, Any] = {
            "toolCallId": self._tool_call_id(refused.call_id),
            "tool": refused.tool,
            "rule": refused.rule,
            "reason": refused.reason,
        }
        out.append(custom_event(CUSTOM_REFUSAL, value))

    def on_close(self, out: Out, end: Ended | None, cut: str | None) -> None:
        """``RUN_FINISHED`` or ``RUN_ERROR``, from the last ``end`` (``RUN_ERROR`` with
        ``cut`` as its message if the feed ended without one)."""
        metadata: dict[str, Any] = {"sessionId": self.session_id, "turnId": self.turn_id}
        if end is None:
            message = cut or "the turn's event stream ended before the turn did"
            out.append({"type": "RUN_ERROR", "message": message, "code": "stream_cut"})
            return
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
            return
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

    # ------------------------------------------------------------------ steps

    def new_step(self, index: int, attempt: int) -> _Step:
        """A step's message is ``<turn>:<k>`` whatever the attempt, holding what the
        client holds of it."""
        message_id = f"{self.turn_id}:{index}"
        held = self._held_text.get(message_id, "")
        return _Step(
            index=index, attempt=attempt, message_id=message_id, held=held, shown=len(held)
        )

    def on_step_start(self, out: Out, step: _Step) -> None:
        """``STEP_STARTED``."""
        out.append({"type": "STEP_STARTED", "stepName": step_name(step.index)})

    def on_step_finish(self, out: Out, step: _Step) -> None:
        """``TEXT_MESSAGE_END`` (if open), ``STEP_FINISHED``."""
        self._end_text(out, step)
        out.append({"type": "STEP_FINISHED", "stepName": step_name(step.index)})

    def _assistant(self, step: _Step) -> dict[str, Any]:
        """The step's assistant message in the snapshot list (made when first needed)."""
        message = self._messages.get(step.message_id)
        if message is None:
            message = self._messages[step.message_id] = {"id": step.message_id, "role": "assistant"}
            step.message_ids.append(step.message_id)
        return message

    def on_text(self, out: Out, step: _Step, text: str) -> None:
        """``TEXT_MESSAGE_START`` (once per opening), ``TEXT_MESSAGE_CONTENT`` with what
        the client does not hold yet."""
        message = self._assistant(step)
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

    def _end_text(self, out: Out, step: _Step) -> None:
        if step.text_open:
            out.append({"type": "TEXT_MESSAGE_END", "messageId": step.message_id})
            step.text_open = False

    def _tool_call_id(self, call_id: str) -> str:
        return f"{self.turn_id}:{call_id}"

    def on_tool_call(self, out: Out, call: ToolCalled) -> None:
        """The call's ``TOOL_CALL_*`` (see :meth:`_announce`)."""
        self._announce(out, call.step, call.call_id, call.name, call.arguments)

    def _announce(
        self, out: Out, index: int, parley_call_id: str, name: str, arguments: str
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

    def on_approval_requested(self, out: Out, asked: ApprovalRequested) -> None:
        """The waiting call's ``TOOL_CALL_*``, ``CUSTOM`` ``parley.approval_requested``."""
        arguments = json.dumps(asked.arguments, separators=(",", ":"))
        call_id = self._announce(out, asked.step, asked.call_id, asked.tool, arguments)
        self._requests[asked.approval_id] = asked
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

    def on_approval_answered(
        self, out: Out, answered: ApprovalAnswered, call_id: str | None
    ) -> None:
        """``CUSTOM`` ``parley.approval_answered``."""
        value = {
            "approvalId": answered.approval_id,
            "decision": answered.decision,
            "reason": answered.reason,
        }
        out.append(custom_event(CUSTOM_APPROVAL_ANSWERED, value))

    def on_interrupt(self, out: Out, approval_ids: Sequence[str]) -> None:
        """``RUN_FINISHED`` with AG-UI's ``interrupt`` outcome, one interrupt per approval
        (its id the approval id; a ``resume`` entry answers it: ``resolved`` approves,
        ``cancelled`` denies)."""
        interrupts = []
        for approval_id in approval_ids:
            asked = self._requests[approval_id]
            interrupts.append(
                approval_interrupt(asked, self._tool_call_id(asked.call_id), self.turn_id)
            )
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

    def on_tool_result(self, out: Out, result: ToolAnswered) -> None:
        """``TOOL_CALL_RESULT`` (a tool message), unless the client holds it."""
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

    # ------------------------------------------------------------------ restarts

    def on_restart(self, out: Out, index: int, reason: str, dropped: _Step | None) -> None:
        """``TEXT_MESSAGE_END`` (if open), ``CUSTOM`` ``parley.step_restarted`` naming what
        is dropped, and a ``MESSAGES_SNAPSHOT`` without it."""
        message_id = f"{self.turn_id}:{index}"
        message_ids: list[str] = []
        calls: list[str] = []
        if dropped is not None:
            self._end_text(out, dropped)
            message_ids, calls = list(dropped.message_ids), list(dropped.tool_call_ids)
        # On a replay the client may hold this step as a later attempt made it: that goes
        # too, and the redone attempt streams whole.
        if message_id in self._held_text and message_id not in message_ids:
            message_ids.insert(0, message_id)
        for call_id in self._held_calls.pop(message_id, []):
            calls += [] if call_id in calls else [call_id]
            result_id = f"{call_id}:result"
            if result_id in self._held_results and result_id not in message_ids:
                message_ids.append(result_id)
        self._taken_back |= self._forget(message_id, message_ids)
        value = {"step": index, "reason": reason, "messageIds": message_ids, "toolCallIds": calls}
        out.append(custom_event(CUSTOM_STEP_RESTARTED, value))
        if message_ids:
            out.append({"type": "MESSAGES_SNAPSHOT", "messages": self._snapshot()})

    def _forget(self, message_id: str, dropped: list[str]) -> set[str]:
        """Drop ``dropped`` from this run's messages and from what the client holds; the
        ids taken back from the client (all but a held message, emptied in place)."""
        held = message_id in self._held_text
        for key in dropped:
            self._messages.pop(key, None)
            self._held_text.pop(key, None)
            self._held_results.discard(key)
        left_out = set(dropped)
        if held:
            # A message the client had before this run may have later ones after it: it
            # is emptied where it is rather than dropped (a stock client appends a message
            # it does not hold).  Tool results go: a client puts each after its call.
            left_out.discard(message_id)
            self._held_text[message_id] = ""
            self._messages[message_id] = {"id": message_id, "role": "assistant"}
        return left_out

    def _snapshot(self) -> list[dict[str, Any]]:
        """Every message the client is to keep: the input's (this run's version of those
        it replays; none of those a restart took back), then this run's others."""
        messages = []
        for message in self._input:
            key = str(message.get("id"))
            if key in self._messages:
                messages.append(self._messages[key])
            elif key not in self._taken_back:
                messages.append(message)
        given = {str(m.get("id")) for m in self._input}
        messages += [m for key, m in self._messages.items() if key not in given]
        copied: list[dict[str, Any]] = json.loads(json.dumps(messages))
        return copied
