"""A turn's sub-agents in its AG-UI run (docs/sub-agents.md#7-seen): each agent call's
child turn is an AG-UI *subagent* of the parent's run, AG-UI 1.0's own shape for an
agent exposed to a model as a tool.

============================  ==========================================================
the child turn                AG-UI, in the parent's run
============================  ==========================================================
opened (parent's              ``SUBAGENT_STARTED`` (``subagentRunId``: the child's turn id,
``agent_started``)            ``name``: the agent, ``parentToolCallId``: the parent's
                              call, ``parentSubagentRunId``: the child that called it,
                              for a grandchild)
its events                    what :class:`~parley.gateway.projections.agui.AgUiRun`
                              makes of them, each carrying ``subagentRunId``
its ``end``                   ``SUBAGENT_FINISHED`` (``result``: outcome and reply) for a
                              child that finished; ``SUBAGENT_ERROR`` (``message``,
                              ``code``: its outcome) for one that failed, was cancelled
                              or ran out of budget
============================  ==========================================================

Why not a nested ``RUN_STARTED`` with ``parentRunId``: AG-UI 1.0 keeps ``parentRunId``
for an agent run as a *separate* run, and a stock client refuses a ``RUN_STARTED`` while
a run is active ("Cannot send 'RUN_STARTED' while a run is still active"); its subagent
events are the nesting one stream carries.  A child's ``MESSAGES_SNAPSHOT`` (a restarted
step) is not sent: a snapshot is the whole thread's message list, and the child's would
drop the parent's messages from the client.
"""

from __future__ import annotations

from typing import Any, final

from parley.gateway.projections.agui import AgUiRun
from parley.gateway.projections.base import Out
from parley.schemas.events import Event, EventKind
from parley.schemas.records import TurnStatus

UNATTRIBUTED = frozenset({"RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "MESSAGES_SNAPSHOT"})
"""AG-UI's run-scoped events: they carry no ``subagentRunId`` (a stock client refuses,
and strips, fields an event does not declare)."""


@final
class AgUiSubagent:
    """One child turn's segment of the parent's AG-UI run, fed the child's events."""

    def __init__(
        self,
        *,
        thread_id: str,
        run_id: str,
        started: dict[str, Any],
        parent_turn_id: str,
        parent_subagent: str | None,
    ) -> None:
        self.turn_id = str(started["turn_id"])
        self._started = started
        self._parent_turn_id = parent_turn_id
        self._parent_subagent = parent_subagent
        self._run = AgUiRun(
            thread_id=thread_id,
            run_id=run_id,
            session_id=str(started["session_id"]),
            turn_id=self.turn_id,
        )
        self._closed = False

    def opening(self) -> Out:
        """``SUBAGENT_STARTED``, tied to the parent's call."""
        event: dict[str, Any] = {
            "type": "SUBAGENT_STARTED",
            "subagentRunId": self.turn_id,
            "name": str(self._started["agent"]),
            "parentToolCallId": f"{self._parent_turn_id}:{self._started['call_id']}",
            "metadata": {
                "parley": {
                    "turnId": self.turn_id,
                    "sessionId": self._started["session_id"],
                    "callId": self._started["call_id"],
                }
            },
        }
        if self._parent_subagent is not None:
            event["parentSubagentRunId"] = self._parent_subagent
        return [event]

    def feed(self, event: Event) -> Out:
        """The child's event as the parent's run shows it."""
        out = self._attributed(self._run.feed(event))
        if event.kind is EventKind.END:
            out.extend(self.close())
        return out

    def close(self, cut: str | None = None) -> Out:
        """``SUBAGENT_FINISHED`` or ``SUBAGENT_ERROR``, once (at the child's ``end``, or
        when the feed is over without it)."""
        if self._closed:
            return []
        self._closed = True
        out: Out = []
        for item in self._run.close(cut):
            if item["type"] == "RUN_FINISHED" and item.get("outcome", {}).get("type") == "success":
                out.append(
                    {
                        "type": "SUBAGENT_FINISHED",
                        "subagentRunId": self.turn_id,
                        "result": item.get("result"),
                        "outcome": {"type": "success"},
                    }
                )
            elif item["type"] in ("RUN_FINISHED", "RUN_ERROR"):
                outcome = str(item.get("metadata", {}).get("parley", {}).get("outcome", ""))
                code = outcome or str(item.get("code") or "failed")
                message = item.get("message") or f"the child turn ended {code}"
                if outcome == TurnStatus.CANCELLED:
                    message = "the child turn was cancelled"
                out.append(
                    {
                        "type": "SUBAGENT_ERROR",
                        "subagentRunId": self.turn_id,
                        "message": str(message),
                        "code": code,
                    }
                )
            else:
                out.extend(self._attributed([item]))
        return out

    def _attributed(self, items: Out) -> Out:
        return [
            {**item, "subagentRunId": self.turn_id}
            for item in items
            if item["type"] not in UNATTRIBUTED
        ]


@final
class AgUiTree:
    """A turn's AG-UI run with its descendants as subagents: fed the tree's events (each
    turn's in its order), it sends each to its turn's view."""

    def __init__(self, root: AgUiRun) -> None:
        self.root = root
        self._subagents: dict[str, AgUiSubagent] = {}

    def opening(self) -> Out:
        return self.root.opening()

    def feed(self, event: Event) -> Out:
        """The AG-UI events for ``event``, of the root or of any descendant."""
        if event.turn_id == self.root.turn_id:
            out = self.root.feed(event)
        elif (child := self._subagents.get(event.turn_id)) is not None:
            out = child.feed(event)
        else:
            return []  # a turn not of this tree
        if event.kind is EventKind.AGENT_STARTED and event.data["turn_id"] not in self._subagents:
            parent = self._subagents.get(event.turn_id)
            opened = AgUiSubagent(
                thread_id=self.root.thread_id,
                run_id=self.root.run_id,
                started=dict(event.data),
                parent_turn_id=event.turn_id,
                parent_subagent=parent.turn_id if parent is not None else None,
            )
            self._subagents[opened.turn_id] = opened
            out.extend(opened.opening())
        return out

    def close(self, cut: str | None = None) -> Out:
        """Each child still open closed (its feed ended without its ``end``), then the
        root's run."""
        out: Out = []
        for child in reversed(self._subagents.values()):
            out.extend(child.close(cut or "the child turn's event stream ended before it did"))
        return [*out, *self.root.close(cut)]
