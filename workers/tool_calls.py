"""How one tool call of a step runs: validated, judged by the policy and the approver,
run, and its output capped, every outcome a result the model sees.  A tool's failure,
bad arguments and a refusal never fail the turn; only a lost session lock stops it
(:class:`Fenced`), checked again right before the tool runs, since the host code before
it (validation, policy, approver) may take any time."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from schemas.errors import InvalidRequest
from schemas.events import Refused, ToolAnswered, ToolCalled
from schemas.messages import ToolCall, ToolResult
from workers.emitter import Emitter
from workers.holding import ensure_holding
from workers.host_ports import Access, ApprovalRequest, Approver, Policy, Refusal, Tool, ToolContext

log = logging.getLogger("parley.engine")


class ToolRunner:
    """Runs the tool calls of one turn attempt, announcing each call, refusal and result
    as events."""

    def __init__(
        self,
        *,
        tools: Mapping[str, Tool],
        policy: Policy,
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

    def run(self, call: ToolCall, step: int) -> ToolResult:
        """Run one call of step ``step``; raises only :class:`Fenced`."""
        ensure_holding(self.holding, "before a tool call")
        self.emitter.emit(
            ToolCalled(step=step, call_id=call.id, name=call.name, arguments=call.arguments)
        )
        result = self._result(call)
        self.emitter.emit(ToolAnswered.of(step, result))
        return result

    def _result(self, call: ToolCall) -> ToolResult:
        def error(text: str) -> ToolResult:
            return ToolResult(call_id=call.id, name=call.name, content=text, is_error=True)

        tool = self.tools.get(call.name)
        if tool is None:
            return error(f"error: unknown tool {call.name!r}; available: {sorted(self.tools)}")
        try:
            arguments = tool.parse(call.arguments)
            accesses = tuple(tool.accesses(arguments))
        except InvalidRequest as exc:
            return error(f"error: InvalidRequest: {exc}")
        except Exception as exc:  # host code: its failure is the tool's, not the turn's
            return error(f"error: {type(exc).__name__}: {exc}")
        refusal = self._judged(call, arguments, accesses)
        if refusal is not None:
            self.emitter.emit(
                Refused(call_id=call.id, tool=call.name, rule=refusal.rule, reason=refusal.reason)
            )
            return ToolResult(
                call_id=call.id,
                name=call.name,
                content=f"refused by policy rule {refusal.rule}: {refusal.reason}",
                is_error=True,
                refusal=refusal.rule,
            )
        # Validation, the policy and the approver are host code and may take any time
        # (a person approving, an MCP server starting): the lock may have been lost
        # meanwhile, and a driver that lost it must not touch the workspace.
        ensure_holding(self.holding, "before the tool ran")
        try:
            output = tool.run(arguments, self.context)
        except Exception as exc:
            return error(f"error: {type(exc).__name__}: {exc}")
        if not isinstance(output, str):
            # A host tool's bug, like its exceptions: the model hears of it.
            return error(f"error: the tool returned {type(output).__name__}, not text")
        return ToolResult(call_id=call.id, name=call.name, content=cap(output, self.output_limit))

    def _judged(
        self, call: ToolCall, arguments: dict[str, Any], accesses: tuple[Access, ...]
    ) -> Refusal | None:
        """The policy's refusal, else the approver's, else None (the call may run)."""
        try:
            refusal = self.policy.check(call.name, accesses, self.context.root)
        except Exception as exc:
            # A policy that cannot decide refuses: failing closed is the safe side.
            log.warning("policy failed on %s; refusing the call", call.name, exc_info=True)
            return Refusal(rule="policy_error", reason=f"{type(exc).__name__}: {exc}")
        if refusal is not None:
            return refusal
        request = ApprovalRequest(
            session_id=self.context.session_id,
            turn_id=self.context.turn_id,
            tool=call.name,
            arguments=arguments,
            accesses=accesses,
        )
        try:
            approved = bool(self.approver.approve(request))
        except Exception:
            log.warning("approver failed; treating the call as declined", exc_info=True)
            approved = False
        if approved:
            return None
        return Refusal(rule="approver", reason="the host's approver declined this call")


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
