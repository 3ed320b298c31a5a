"""A step held for a person's answers (SPEC §2.15): holding it when a call asks, going on
with it once every answer is in, and the answers a turn's end lists.  Functions of the
engine's attempt at a turn (:class:`workers.engine.turn_engine._TurnRun`)."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from schemas.events import ApprovalRequested, Event, StepCommitted
from schemas.messages import StepPayload
from schemas.records import Approval, Decision, TurnStatus
from workers.engine.held_step import HeldStep
from workers.engine.tool_calls import Answer, Judgement
from workers.engine.turn_state import Ending, TurnState, has_interrupt

if TYPE_CHECKING:
    from workers.engine.turn_engine import _TurnRun


def hold(
    run: _TurnRun,
    index: int,
    said: StepPayload,
    judged: list[Judgement],
    cursor: int,
    delivered: list[Event],
) -> Ending:
    """A call of step ``index`` asks for a person's answer: keep the step's model
    output and judgements, one approval per asked call, and let the session go.  No
    call of the step runs before every answer is in (they run in the model's order).
    The step's ``delivered`` steer events are stored and published with the hold: the
    held step is kept, and commits once answered."""
    now = datetime.now(UTC)
    timeout = run.host.approval_timeout
    expires = now + timedelta(seconds=timeout) if timeout else None
    judged = [replace(j, approval_id=str(uuid.uuid4())) if j.ask is not None else j for j in judged]
    held = HeldStep(index=index, payload=said, cursor=cursor, judgements=tuple(judged))
    approvals = [
        Approval(
            approval_id=j.approval_id or "",
            turn_id=run.turn.turn_id,
            step=index,
            call_id=j.call.id,
            tool=j.call.name,
            arguments=arguments_of(j.call.arguments),
            accesses=tuple({"mode": a.mode, "path": a.path} for a in j.accesses),
            requested_at=now,
            expires_at=expires,
        )
        for j in held.asked
    ]
    # Published once committed: a person must never be shown a call to answer
    # that a lost commit left unaskable.
    requests = [
        run.emitter.allocate(
            ApprovalRequested(
                approval_id=approval.approval_id,
                step=index,
                call_id=approval.call_id,
                tool=approval.tool,
                arguments=approval.arguments,
                accesses=approval.accesses,
                rule=j.ask.rule if j.ask else "",
                expires_at=expires.isoformat() if expires else None,
            )
        )
        for approval, j in zip(approvals, held.asked, strict=True)
    ]
    run.store.hold_step(
        run_id=run.run_id,
        session_id=run.claimed.session.session_id,
        fence=run.fence,
        held_step=held.to_json(),
        approvals=approvals,
        events=[*run.emitter.take_unstored(), *delivered, *requests],
    )
    run.streaming = None
    for event in [*delivered, *requests]:
        run.emitter.publish(event)
    return Ending(status=TurnStatus.WAITING)


def go_on(run: _TurnRun, state: TurnState, held: HeldStep) -> None:
    """Every answer to the held step's calls is in (or the turn was interrupted while
    it waited): run its calls as judged and answered, and commit it whole."""
    run.take_steers(state)
    interrupted = has_interrupt(state.pending)
    approvals = run.store.approvals_of_run(run.run_id)
    session_id = run.claimed.session.session_id
    results = []
    for judged in held.judgements:
        answer = None
        if judged.approval_id is not None:
            approval = approvals[judged.approval_id]

            def consume(approval_id: str = approval.approval_id) -> bool:
                return run.store.consume_approval(
                    approval_id=approval_id, session_id=session_id, fence=run.fence
                )

            answer = Answer(
                approved=approval.decision is Decision.APPROVED,
                reason=approval.reason,
                consume=consume,
            )
        results.append(
            run.tool_runner.answer(judged, held.index, answer=answer, interrupted=interrupted)
        )
    payload = replace(held.payload, tool_results=tuple(results))
    step_event = run.emitter.allocate(
        StepCommitted(
            step=held.index,
            text=payload.text,
            tool_calls=payload.tool_calls,
            usage=payload.usage,
        )
    )
    receipt = run.store.commit_step(
        run_id=run.run_id,
        session_id=session_id,
        fence=run.fence,
        index=held.index,
        payload=payload,
        steer_cursor=held.cursor,
        events=[*run.emitter.take_unstored(), step_event],
        close_inbox_if_idle=False,
    )
    run.committed(state, held.index, payload, held.cursor, [step_event], receipt.steer_count)


def approvals_summary(run: _TurnRun) -> tuple[dict[str, Any], ...]:
    """What the end event lists of the turn's asked calls (none asked: nothing read)."""
    if not run.asked:
        return ()
    approvals = run.store.approvals_of_run(run.run_id).values()  # in call order
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
