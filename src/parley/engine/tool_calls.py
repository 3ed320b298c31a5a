"""How one tool call of a step runs: validated, judged by the policy and the approver,
run, and its output capped, every outcome a result the model sees.  A tool's failure,
bad arguments and a refusal never fail the turn; only a lost session lock stops it
(:class:`Fenced`), checked again right before the tool runs, since the host code before
it (validation, policy, approver) may take any time."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parley.engine.emitter import Emitter
from parley.engine.holding import ensure_holding
from parley.ports.host import (
    Access,
    ApprovalRequest,
    Approver,
    Ask,
    PolicyPort,
    Refusal,
    Tool,
    ToolContext,
    WaitFor,
)
from parley.schemas.errors import InvalidRequest
from parley.schemas.events import Refused, ToolAnswered, ToolCalled
from parley.schemas.messages import ToolCall, ToolResult
from parley.telemetry import metrics, turn_spans

log = logging.getLogger("parley.engine")


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """What the policy and the approver made of one call, before it runs: it runs, it has
    its result already (bad arguments, an unknown tool, a refusal), or it waits for a
    person (``ask``).  Stored with a held step, so the step goes on as judged."""

    call: ToolCall
    result: ToolResult | None = None
    refusal: Refusal | None = None
    ask: Ask | None = None
    accesses: tuple[Access, ...] = ()
    approval_id: str | None = None
    announced: bool = False
    """The call ran, and its result was announced, before its step was held for another
    call's event: the held step's driver keeps that ``result`` and announces nothing."""
    waits: bool = False
    """The call waits for an event or a time (docs/time.md#waiting-for-an-event): its
    result is what ended its wait."""

    def to_json(self) -> dict[str, Any]:
        """The stored form (the call itself is stored with the step's payload)."""
        stored: dict[str, Any] = {
            "call_id": self.call.id,
            "result": self.result.to_json() if self.result else None,
            "refusal": vars(self.refusal) if self.refusal else None,
            "ask": vars(self.ask) if self.ask else None,
            "accesses": [vars(a) for a in self.accesses],
            "approval_id": self.approval_id,
        }
        # Only when set: a step held before waits existed reads the same.
        if self.announced:
            stored["announced"] = True
        if self.waits:
            stored["waits"] = True
        return stored

    @classmethod
    def from_json(cls, call: ToolCall, data: dict[str, Any]) -> Judgement:
        """Load the stored form of ``call``'s judgement."""
        return cls(
            call=call,
            result=ToolResult.from_json(data["result"]) if data.get("result") else None,
            refusal=Refusal(**data["refusal"]) if data.get("refusal") else None,
            ask=Ask(**data["ask"]) if data.get("ask") else None,
            accesses=tuple(Access(**a) for a in data.get("accesses", ())),
            approval_id=data.get("approval_id"),
            announced=bool(data.get("announced", False)),
            waits=bool(data.get("waits", False)),
        )


@dataclass(frozen=True, kw_only=True)
class Answer:
    """A person's answer to a call that asked, as the held step's driver sees it.
    ``consume`` marks an approved call as started, durably, and says whether this is the
    first time: a call an earlier attempt started (and may have run) is not run again."""

    approved: bool
    reason: str | None = None
    consume: Callable[[], bool] = lambda: True


NOT_RUN_INTERRUPTED = "not run: the turn was interrupted while this call waited for an answer"


class ToolRunner:
    """Runs the tool calls of one turn attempt, announcing each call, refusal and result
    as events.

    A step's calls are all judged (policy, then approver) before the first of them runs,
    so that a step with a call that must wait for a person waits as a whole: its calls
    then run in the order the model gave them, once every answer is in, and a call is
    never run ahead of one before it that is still waiting."""

    def __init__(
        self,
        *,
        tools: Mapping[str, Tool],
        policy: PolicyPort,
        approver: Approver,
        context: ToolContext,
        emitter: Emitter,
        holding: Callable[[], bool],
        output_limit: int,
    ) -> None:
        self.tools = tools
        self.policy = policy
        self.approver = approver
        self.context = context
        self.emitter = emitter
        self.holding = holding
        self.output_limit = output_limit
        self._parked: dict[str, WaitFor] = {}

    def judge(self, call: ToolCall, *, offered: Collection[str] | None = None) -> Judgement:
        """What becomes of ``call``: run, refused (or failed) already, or asked about.
        ``offered`` names the tools its step offered (None: all the turn's)."""
        ensure_holding(self.holding, "before a tool call")

        def error(text: str) -> Judgement:
            result = ToolResult(call_id=call.id, name=call.name, content=text, is_error=True)
            return Judgement(call=call, result=result)

        tool = self.tools.get(call.name)
        if tool is None:
            return error(f"error: unknown tool {call.name!r}; available: {sorted(self.tools)}")
        if offered is not None and call.name not in offered:
            return error(
                f"error: tool {call.name!r} is not offered at this step; offered: {sorted(offered)}"
            )
        try:
            arguments = tool.parse(call.arguments)
            accesses = tuple(tool.accesses(arguments))
        except InvalidRequest as exc:
            return error(f"error: InvalidRequest: {exc}")
        except Exception as exc:  # host code: its failure is the tool's, not the turn's
            return error(f"error: {type(exc).__name__}: {exc}")
        verdict = self._judged(call, arguments, accesses)
        if isinstance(verdict, Ask):
            return Judgement(call=call, ask=verdict, accesses=accesses)
        if verdict is not None:
            return Judgement(
                call=call, result=_refused(call, verdict), refusal=verdict, accesses=accesses
            )
        return Judgement(call=call, accesses=accesses)

    def run(self, call: ToolCall, step: int) -> ToolResult:
        """Judge and run one call of step ``step`` (one that cannot ask); raises only
        :class:`Fenced`."""
        return self.answer(self.judge(call), step)

    def answer(
        self,
        judged: Judgement,
        step: int,
        *,
        answer: Answer | None = None,
        interrupted: bool = False,
        child: ToolResult | None = None,
    ) -> ToolResult:
        """Announce ``judged``'s call and give it its result: its tool's output if it may
        run (an asked call: once ``answer`` approved it), else what it was judged to get,
        the person's denial, or, ``interrupted``, a result saying it never ran.  An agent
        call's result is its ``child`` turn's (docs/sub-agents.md).  Raises only
        :class:`Fenced`."""
        call = judged.call
        ensure_holding(self.holding, "before a tool call")
        self.emitter.emit(
            ToolCalled(step=step, call_id=call.id, name=call.name, arguments=call.arguments)
        )
        with turn_spans.tool_call(call, step, _decision(judged, answer, interrupted)) as span:
            outcome = self._answer(judged, answer, interrupted, child)
            if isinstance(outcome, WaitFor):
                # The call waits (docs/time.md#waiting-for-an-event): its result comes
                # when its wait ends, announced then, once.  Its step is held.
                self._parked[call.id] = outcome
                return _waiting(call)
            turn_spans.tool_answered(span, outcome)
        self.announce(step, outcome)
        return outcome

    def announce(self, step: int, result: ToolResult) -> None:
        """Count and announce a call's result (for a call that waited: once its wait
        ended)."""
        # Counted before readers see the result (as every metric is before its event).
        name = result.name
        metrics.tool_called(name if name in self.tools else metrics.UNKNOWN_TOOL)
        self.emitter.emit(ToolAnswered.of(step, result))

    def take_waits(self) -> dict[str, WaitFor]:
        """The calls answered since the last look that wait for an event or a time, by
        call id (their step is to be held: docs/time.md#waiting-for-an-event)."""
        parked, self._parked = self._parked, {}
        return parked

    def _answer(
        self,
        judged: Judgement,
        answer: Answer | None,
        interrupted: bool,
        child: ToolResult | None,
    ) -> ToolResult | WaitFor:
        call = judged.call
        if judged.result is not None:
            if judged.refusal is not None:
                self._announce_refusal(call, judged.refusal)
            return judged.result
        if judged.ask is not None:
            if answer is None or not answer.approved:
                why = answer.reason if answer is not None and answer.reason else "no reason given"
                refusal = Refusal(rule="approval", reason=f"the operator denied this call: {why}")
                self._announce_refusal(call, refusal)
                return _refused(call, refusal)
            if child is not None:
                return child  # its child turn ran (an agent call): its result, as it ended
            # Durably started before it runs: a driver that dies while it runs leaves a
            # mark, and the next attempt does not run it again for the same answer.  Asked
            # before the interrupt is: an earlier attempt may have run it before the
            # interrupt came, and its result must not say that it never ran.
            if not answer.consume():
                return ToolResult(
                    call_id=call.id,
                    name=call.name,
                    content="error: not run again: an earlier attempt started this approved "
                    "call and stopped before its result was kept, so its effect is unknown; "
                    "check before asking for it again",
                    is_error=True,
                )
            if interrupted:
                return _not_run(call)
        elif child is not None:
            return child
        elif interrupted:
            return _not_run(call)
        return self._execute(call)

    def _execute(self, call: ToolCall) -> ToolResult | WaitFor:
        def error(text: str) -> ToolResult:
            return ToolResult(call_id=call.id, name=call.name, content=text, is_error=True)

        tool = self.tools.get(call.name)
        if tool is None:  # the toolset changed while the step waited
            return error(f"error: unknown tool {call.name!r}; available: {sorted(self.tools)}")
        try:
            arguments = tool.parse(call.arguments)
        except Exception as exc:
            return error(f"error: {type(exc).__name__}: {exc}")
        # Validation, the policy and the approver are host code and may take any time
        # (a person approving, an MCP server starting): the lock may have been lost
        # meanwhile, and a driver that lost it must not touch the workspace.
        ensure_holding(self.holding, "before the tool ran")
        try:
            output = tool.run(arguments, self.context)
        except Exception as exc:
            return error(f"error: {type(exc).__name__}: {exc}")
        if isinstance(output, WaitFor):
            return output
        if not isinstance(output, str):
            # A host tool's bug, like its exceptions: the model hears of it.
            return error(f"error: the tool returned {type(output).__name__}, not text")
        return ToolResult(call_id=call.id, name=call.name, content=cap(output, self.output_limit))

    def _announce_refusal(self, call: ToolCall, refusal: Refusal) -> None:
        metrics.refused(refusal.rule)
        self.emitter.emit(
            Refused(call_id=call.id, tool=call.name, rule=refusal.rule, reason=refusal.reason)
        )

    def _judged(
        self, call: ToolCall, arguments: dict[str, Any], accesses: tuple[Access, ...]
    ) -> Refusal | Ask | None:
        """The policy's refusal or ask, else the approver's, else None (the call may run)."""
        try:
            verdict = self.policy.check(call.name, accesses, self.context.root)
        except Exception as exc:
            # A policy that cannot decide refuses: failing closed is the safe side.
            log.warning("policy failed on %s; refusing the call", call.name, exc_info=True)
            return Refusal(rule="policy_error", reason=f"{type(exc).__name__}: {exc}")
        if isinstance(verdict, Refusal):
            return verdict
        request = ApprovalRequest(
            session_id=self.context.session_id,
            turn_id=self.context.turn_id,
            tool=call.name,
            arguments=arguments,
            accesses=accesses,
        )
        try:
            approved = self.approver.approve(request)
        except Exception:
            log.warning("approver failed; treating the call as declined", exc_info=True)
            approved = False
        if isinstance(approved, Ask):
            return approved
        if not approved:
            return Refusal(rule="approver", reason="the host's approver declined this call")
        return verdict  # the policy's ask, if it asked; else None: the call runs


def _refused(call: ToolCall, refusal: Refusal) -> ToolResult:
    return ToolResult(
        call_id=call.id,
        name=call.name,
        content=f"refused by policy rule {refusal.rule}: {refusal.reason}",
        is_error=True,
        refusal=refusal.rule,
    )


def _waiting(call: ToolCall) -> ToolResult:
    """What stands for a waiting call's result until its wait ends (never committed:
    its step is held)."""
    return ToolResult(call_id=call.id, name=call.name, content="")


def _not_run(call: ToolCall) -> ToolResult:
    return ToolResult(call_id=call.id, name=call.name, content=NOT_RUN_INTERRUPTED, is_error=True)


def unique_ids(calls: Sequence[ToolCall], step: int) -> tuple[ToolCall, ...]:
    """Give every call of a step a distinct id (replay pairs results by id)."""
    seen: set[str] = set()
    unique: list[ToolCall] = []
    for position, call in enumerate(calls):
        call_id = call.id or f"call_{step}_{position}"
        if call_id in seen:
            call_id = f"{call_id}_{position}"
        seen.add(call_id)
        unique.append(ToolCall(id=call_id, name=call.name, arguments=call.arguments))
    return tuple(unique)


def cap(output: str, limit: int) -> str:
    """Cap tool output, telling the model what was cut."""
    if len(output) <= limit:
        return output
    return (
        output[:limit]
        + f"\n[output truncated: {len(output)} characters, showing the first {limit}]"
    )


def _decision(judged: Judgement, answer: Answer | None, interrupted: bool) -> str:
    """What became of a call, as its span says: ``refused`` by the policy or approver,
    an ``error`` before it could run (bad arguments, an unknown tool), ``denied`` or
    ``approved`` by a person, ``interrupted`` before it ran, or ``ran``."""
    if judged.result is not None:
        return "refused" if judged.refusal is not None else "error"
    if judged.ask is not None:
        if answer is None or not answer.approved:
            return "denied"
        return "interrupted" if interrupted else "approved"
    return "interrupted" if interrupted else "ran"
