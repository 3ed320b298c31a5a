"""A step held for its agent calls (docs/sub-agents.md): each call is a child turn that
any worker runs, and the step waits for them as a step waits for a person's answers,
holding no driver, no lock and no slot.

When a step's calls are judged, an agent call past the host's depth bound is a tool
error, not a turn.  A step with agent calls the policy lets run (and none that waits
for a person) is held: its model output is kept, and the same transaction opens each
call's child session and turn (:meth:`Store.hold_for_agents`).  When the last child of
the step ends, its end queues the parent again; the driver that claims it gives each
agent call its child's result (the reply, or a result naming how the child ended),
runs the step's other calls, and commits the step whole, as after answers.  A step
held for answers whose approved calls include agent calls opens their children once
the answers are in, and waits again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace

from parley.engine.attempt import Attempt
from parley.engine.held_step import HeldStep
from parley.engine.tool_calls import Judgement
from parley.engine.turn_state import Ending, TurnState
from parley.ports.backend import ChildEnd, ChildTurn
from parley.ports.host import AGENT_PATH_SEPARATOR, RecordedAnswers, agent_path
from parley.schemas.events import AgentStarted, Event
from parley.schemas.messages import ToolCall, ToolResult
from parley.schemas.records import Decision, TurnStatus
from parley.telemetry import turn_spans


class AgentCalls:
    """The agent calls of one attempt's steps."""

    def __init__(self, attempt: Attempt) -> None:
        self._attempt = attempt
        host = attempt.host
        self._agents = {agent.name: agent for agent in host.agents}
        self._path = agent_path(attempt.claimed.session.agent)

    def bounded(self, judgements: Iterable[Judgement]) -> list[Judgement]:
        """``judgements`` with each agent call a ``recorded`` replay answers given its
        answer (it opens no child turn), and each past the depth bound made a tool
        error."""
        depth = len(self._path) + 1
        limit = self._attempt.host.max_agent_depth
        bounded = []
        for judged in judgements:
            judged = self._replayed(judged)
            if judged.call.name in self._agents and judged.result is None and depth > limit:
                content = (
                    f"error: {judged.call.name} was not called: a child turn here would be "
                    f"at depth {depth}, past the host's max_agent_depth of {limit}"
                )
                result = ToolResult(
                    call_id=judged.call.id, name=judged.call.name, content=content, is_error=True
                )
                judged = replace(judged, result=result, ask=None)
            bounded.append(judged)
        return bounded

    def _replayed(self, judged: Judgement) -> Judgement:
        """An agent call the policy lets run without asking, in a ``recorded`` replay
        (docs/replay.md#tools-recorded-or-live): its recorded result, or that it was
        not run, unless the replay lets it run (a read-only agent's unmatched call).
        (One that asks a person waits for the answer, and opens its child if approved.)"""
        replaying: RecordedAnswers | None = getattr(self._attempt.host, "replaying", None)
        call = judged.call
        if replaying is None or call.name not in self._agents or judged.result is not None:
            return judged
        if judged.ask is not None:
            return judged
        answer = replaying.agent_result(call.name, call.arguments)
        if answer is None:
            return judged
        content, is_error = answer
        result = ToolResult(call_id=call.id, name=call.name, content=content, is_error=is_error)
        return replace(judged, result=result)

    def spawning(
        self, judgements: Iterable[Judgement], approved: Mapping[str, bool] | None = None
    ) -> list[Judgement]:
        """The agent calls among ``judgements`` that open a child turn: allowed (those
        that asked: ``approved``, by approval id)."""
        opening = []
        for judged in judgements:
            if judged.call.name not in self._agents or judged.result is not None:
                continue
            if judged.ask is not None and not (approved or {}).get(judged.approval_id or ""):
                continue
            opening.append(judged)
        return opening

    def hold(
        self, state: TurnState, held: HeldStep, delivered: list[Event], opening: list[Judgement]
    ) -> Ending:
        """Hold ``held`` for the child turns of its ``opening`` calls, opened in the
        same transaction; the driver kicks their sessions once it lets go."""
        attempt = self._attempt
        emitter = attempt.emitter
        children = [self._child(j.call) for j in opening]
        # Stored with the hold, published once it committed: a reader never hears of a
        # child that a lost commit never opened.
        started = [
            emitter.allocate(
                AgentStarted(
                    call_id=c.call_id, agent=c.agent, turn_id=c.turn_id, session_id=c.session_id
                )
            )
            for c in children
        ]
        calls = [(j.call, c.turn_id) for j, c in zip(opening, children, strict=True)]
        with turn_spans.agent_calls(calls, held.index) as contexts:
            children = [
                replace(c, trace_context=context)
                for c, context in zip(children, contexts, strict=True)
            ]
            spawned = attempt.store.hold_for_agents(
                held_step=held.to_json(),
                children=children,
                events=[*emitter.take_unstored(), *delivered, *started],
                parallel=attempt.host.max_parallel_agents,
            )
        state.streaming = None
        for event in [*delivered, *started]:
            emitter.publish(event)
        return Ending(status=TurnStatus.WAITING, spawned=spawned)

    def open_answered(self, state: TurnState, held: HeldStep) -> Ending | None:
        """A step held for answers whose approved calls include agent calls, and whose
        children are not open yet: open them and wait again (None: nothing to open)."""
        if not any(j.call.name in self._agents for j in held.judgements):
            return None
        store = self._attempt.store
        approvals = store.approvals_of_run()
        approved = {
            approval_id: approval.decision is Decision.APPROVED
            for approval_id, approval in approvals.items()
        }
        opening = self.spawning(held.judgements, approved)
        if not opening or store.children_of_step(held.index):
            return None
        return self.hold(state, held, [], opening)

    def cancelled_children(self, held: HeldStep) -> bool:
        """Whether a child of ``held``'s agent calls ended cancelled (an interrupt of
        this turn reached it)."""
        if not any(j.call.name in self._agents for j in held.judgements):
            return False
        children = self._attempt.store.children_of_step(held.index).values()
        return any(child.status is TurnStatus.CANCELLED for child in children)

    def resume_cancelled(self, state: TurnState, held: HeldStep) -> Ending | None:
        """A resume of this turn, which an interrupt ended while ``held`` waited for its
        children: resume each child the interrupt cancelled (finished ones keep their
        results) and wait for them again (None: none to resume)."""
        if not held.resumed:
            return None
        attempt = self._attempt
        children = attempt.store.resumable_children(held.index)
        if not children:
            return None
        emitter = attempt.emitter
        started = [
            emitter.allocate(
                AgentStarted(
                    call_id=c.call_id, agent=c.agent, turn_id=c.turn_id, session_id=c.session_id
                )
            )
            for c in children
        ]
        spawned = attempt.store.resume_for_agents(
            held_step=replace(held, resumed=False).to_json(),
            children=children,
            events=[*emitter.take_unstored(), *started],
            parallel=attempt.host.max_parallel_agents,
        )
        state.streaming = None
        for event in started:
            emitter.publish(event)
        return Ending(status=TurnStatus.WAITING, spawned=spawned)

    def results(self, held: HeldStep) -> dict[str, ToolResult]:
        """Each agent call's result from its child turn, by call id (none for a call
        that opened no child)."""
        if not any(j.call.name in self._agents for j in held.judgements):
            return {}
        children = self._attempt.store.children_of_step(held.index)
        calls = {j.call.id: j.call for j in held.judgements}
        return {
            call_id: result_of(calls[call_id], child)
            for call_id, child in children.items()
            if call_id in calls
        }

    def _child(self, call: ToolCall) -> ChildTurn:
        agent = self._agents[call.name]
        return ChildTurn(
            call_id=call.id,
            agent=AGENT_PATH_SEPARATOR.join((*self._path, call.name)),
            task=task_of(call.arguments),
            session_id=str(uuid.uuid4()),
            turn_id=str(uuid.uuid4()),
            run_id=str(uuid.uuid4()),
            contract=agent.contract or self._attempt.claimed.run.contract,
        )


def result_of(call: ToolCall, child: ChildEnd) -> ToolResult:
    """What the model hears of a call's child turn: its reply, or a result naming how
    it ended (``cancelled``, ``failed: …``, ``budget_exceeded``), for the model to
    decide what to do about it."""
    if child.status is TurnStatus.FINISHED:
        return ToolResult(call_id=call.id, name=call.name, content=child.reply or "")
    content = child.status.value + (f": {child.error}" if child.error else "")
    return ToolResult(call_id=call.id, name=call.name, content=content, is_error=True)


def task_of(arguments: str) -> str:
    """A call's task (its arguments were checked when it was judged: the agent's tool
    refuses any but one non-empty ``task``)."""
    value = json.loads(arguments)
    return str(value["task"])
