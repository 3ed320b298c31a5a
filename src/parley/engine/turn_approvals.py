"""A step held for a person's answers (docs/guarantees.md#15-approvals): holding it when a call
asks, going on with it once every answer is in, and the answers a turn's end lists."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from parley.engine.emitter import Emitter
from parley.engine.fenced_run import FencedStore
from parley.engine.held_step import HeldStep
from parley.engine.step_committer import StepCommitter
from parley.engine.tool_calls import Answer, Judgement, ToolRunner
from parley.engine.turn_state import Ending, TurnState
from parley.engine.turn_waits import EventWaits
from parley.ports.backend import CommittedStep
from parley.schemas.events import ApprovalRequested, Event
from parley.schemas.messages import ToolResult
from parley.schemas.records import Approval, Decision, TurnStatus


class Approvals:
    """The held steps of one attempt's turn."""

    def __init__(
        self,
        store: FencedStore,
        emitter: Emitter,
        committer: StepCommitter,
        *,
        turn_id: str,
        timeout: float | None,
    ) -> None:
        """``timeout``: the seconds an asked call may wait for its answer (None: no limit)."""
        self._store = store
        self._emitter = emitter
        self._committer = committer
        self._turn_id = turn_id
        self._timeout = timeout

    def hold(self, state: TurnState, held: HeldStep, delivered: list[Event]) -> Ending:
        """A call of the ``held`` step asks for a person's answer: keep the step's model
        output and judgements, one approval per asked call, and let the session go.  No
        call of the step runs before every answer is in (they run in the model's order).
        The step's ``delivered`` steer events are stored and published with the hold: the
        held step is kept, and commits once answered."""
        now = datetime.now(UTC)
        expires = now + timedelta(seconds=self._timeout) if self._timeout else None
        held = replace(held, judgements=tuple(_numbered(held.judgements)))
        approvals = [self._approval(held.index, j, now, expires) for j in held.asked]
        # Published once committed: a person must never be shown a call to answer
        # that a lost commit left unaskable.
        requests = [
            self._emitter.allocate(_requested(approval, j, expires))
            for approval, j in zip(approvals, held.asked, strict=True)
        ]
        self._store.hold_step(
            held_step=held.to_json(),
            approvals=approvals,
            events=[*self._emitter.take_unstored(), *delivered, *requests],
        )
        state.streaming = None
        for event in [*delivered, *requests]:
            self._emitter.publish(event)
        return Ending(status=TurnStatus.WAITING)

    def go_on(
        self,
        state: TurnState,
        held: HeldStep,
        tools: ToolRunner,
        *,
        interrupted: bool,
        children: Mapping[str, ToolResult] | None = None,
        waits: EventWaits,
    ) -> Ending | None:
        """Every answer to the held step's calls is in, and every child turn of its agent
        calls ended (``children``: their results by call id), or the turn was
        ``interrupted`` while it waited: run its calls as judged and answered, and commit
        it whole; or, if an approved call waits for an event (``waits``), hold it again
        for that (the ending the hold brought; None: the step committed)."""
        approvals = self._store.approvals_of_run() if held.asked else {}
        children = children or {}
        results = [
            tools.answer(
                judged,
                held.index,
                answer=self._answer(approvals, judged),
                interrupted=interrupted,
                child=children.get(judged.call.id),
            )
            for judged in held.judgements
        ]
        waiting = tools.take_waits()
        if waiting:
            return waits.hold(state, held, results, waiting, [], tools)
        payload = replace(held.payload, tool_results=tuple(results))
        # A turn that ended while the step was held consumed the steers up to its end
        # (the interrupt among them): a resume must not obey that interrupt again.
        cursor = max(held.cursor, state.cursor)
        self._committer.commit(state, CommittedStep(index=held.index, payload=payload), cursor)
        return None

    def _answer(self, approvals: dict[str, Approval], judged: Judgement) -> Answer | None:
        """The person's answer to ``judged``'s call, if it asked."""
        if judged.approval_id is None:
            return None
        approval = approvals[judged.approval_id]
        store = self._store

        def consume(approval_id: str = approval.approval_id) -> bool:
            return store.consume_approval(approval_id)

        return Answer(
            approved=approval.decision is Decision.APPROVED,
            reason=approval.reason,
            consume=consume,
        )

    def _approval(
        self, index: int, judged: Judgement, now: datetime, expires: datetime | None
    ) -> Approval:
        call = judged.call
        return Approval(
            approval_id=judged.approval_id or "",
            turn_id=self._turn_id,
            step=index,
            call_id=call.id,
            tool=call.name,
            arguments=arguments_of(call.arguments),
            accesses=tuple({"mode": a.mode, "path": a.path} for a in judged.accesses),
            requested_at=now,
            expires_at=expires,
        )


def _numbered(judgements: tuple[Judgement, ...]) -> list[Judgement]:
    """Each asked call's judgement with the id of the approval it waits for."""
    return [
        replace(j, approval_id=str(uuid.uuid4())) if j.ask is not None else j for j in judgements
    ]


def _requested(
    approval: Approval, judged: Judgement, expires: datetime | None
) -> ApprovalRequested:
    return ApprovalRequested(
        approval_id=approval.approval_id,
        step=approval.step,
        call_id=approval.call_id,
        tool=approval.tool,
        arguments=approval.arguments,
        accesses=approval.accesses,
        rule=judged.ask.rule if judged.ask else "",
        expires_at=expires.isoformat() if expires else None,
    )


def approvals_summary(store: FencedStore, *, asked: bool) -> tuple[dict[str, Any], ...]:
    """What the end event lists of the turn's asked calls (none ``asked``: nothing read)."""
    if not asked:
        return ()
    approvals = store.approvals_of_run().values()  # in call order
    return tuple(
        {
            "approval_id": a.approval_id,
            "tool": a.tool,
            "decision": a.decision.value if a.decision else None,
            "reason": a.reason,
        }
        for a in approvals
    )


def arguments_of(text: str) -> dict[str, Any]:
    """A call's arguments as a person reads them: the model's JSON object, or its text."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_raw": text}
