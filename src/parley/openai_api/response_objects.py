"""The OpenAI Responses objects of a turn: its response object, its output items and
their ids, as pure functions of what parley stored (no I/O here; the router
``routers/responses.py`` serves them, and the streaming events of
:mod:`parley.gateway.projections.responses` carry them).

A response is a turn.  Its ``output`` holds what the turn committed: each step's tool
calls as a ``function_call`` item followed by its ``function_call_output`` item (parley
runs its host's tools itself, so both halves of a round are there), and, for a turn that
ended with a reply, that reply as one assistant ``message`` (``phase: "final_answer"``),
so ``output_text`` is the reply.  Text a step streamed before calling tools is shown
while it streams (a ``message`` item with ``phase: "commentary"``) but is not part of the
object: the reply is the agent's last message, or nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from parley.ports.backend import CommittedStep
from parley.schemas.records import Approval, RunState, TurnRecord, TurnStatus, Usage

SLOTS = 16
"""Responses events one parley event may expand into; ``sequence_number = seq * SLOTS + k``."""

STATUS: dict[TurnStatus, str] = {
    TurnStatus.QUEUED: "queued",
    TurnStatus.RUNNING: "in_progress",
    # OpenAI has no status for a response that waits for a person: it is in progress,
    # and its output holds an ``mcp_approval_request`` item per call waiting for one.
    TurnStatus.WAITING: "in_progress",
    TurnStatus.FINISHED: "completed",
    TurnStatus.SUCCEEDED: "completed",
    TurnStatus.CHECK_FAILED: "incomplete",
    TurnStatus.BUDGET_EXCEEDED: "incomplete",
    TurnStatus.CANCELLED: "cancelled",
    TurnStatus.FAILED: "failed",
}
"""A turn's status as a response's."""

# The event that ends a stream, by the response's status.  The Responses protocol has no
# event for a cancelled response: ``response.incomplete`` carrying ``status: cancelled``
# is the closest (the response stopped short, and did not fail).
TERMINAL_EVENT = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "cancelled": "response.incomplete",
    "failed": "response.failed",
}


def sequence_number(seq: int, index: int) -> int:
    """The sequence number of the ``index``-th Responses event of parley event ``seq``."""
    assert 0 <= index < SLOTS, index
    return seq * SLOTS + index


# ---------------------------------------------------------------------------- objects


def unix_seconds(moment: datetime) -> int:
    """A time as the Responses objects give it: whole seconds since the epoch."""
    return int(moment.timestamp())


@dataclass(frozen=True, kw_only=True)
class ResponseMeta:
    """What a response object says besides its output and status."""

    response_id: str
    created_at: int
    conversation_id: str
    model: str = ""
    previous_response_id: str | None = None
    background: bool = False
    max_output_tokens: int | None = None


@dataclass(frozen=True, kw_only=True)
class ResponseContent:
    """What a response object holds beyond its meta and status: its output items, its
    reply (``output_text``), usage, error, why it is incomplete, and when it completed
    (none of them, for a response that has only started)."""

    output: Sequence[dict[str, Any]] = ()
    reply: str | None = None
    usage: Usage | None = None
    error: str | None = None
    incomplete_reason: str | None = None
    completed_at: int | None = None


def response_object(
    meta: ResponseMeta, *, status: str, content: ResponseContent | None = None
) -> dict[str, Any]:
    """A ``Response`` as the Open Responses specification publishes it (its
    ``ResponseResource``: every field it requires, of the type it requires) and OpenAI's
    client parses it (``openai.types.responses.Response``).  The host's model decides
    the sampling, which parley leaves alone: the sampling fields say what OpenAI's
    defaults are (``temperature`` and ``top_p`` 1, no penalties, no log probabilities),
    not what the request asked.  ``output_text`` is not part of either wire form (the
    clients compute it from ``output``); it is sent too, as the reply, for readers
    without such a client."""
    held = content if content is not None else ResponseContent()
    return {
        "id": meta.response_id,
        "object": "response",
        "created_at": meta.created_at,
        "completed_at": held.completed_at,
        "status": status,
        "model": meta.model,
        "output": list(held.output),
        "output_text": held.reply or "",
        "usage": None if held.usage is None else usage_object(held.usage),
        "error": None if held.error is None else {"code": "server_error", "message": held.error},
        "incomplete_details": (
            None if held.incomplete_reason is None else {"reason": held.incomplete_reason}
        ),
        "previous_response_id": meta.previous_response_id,
        "conversation": {"id": meta.conversation_id},
        "background": meta.background,
        "max_output_tokens": meta.max_output_tokens,
        "max_tool_calls": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": 1.0,
        "top_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": 0,
        "reasoning": None,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": True,
        "service_tier": "default",
        "user": None,
        "safety_identifier": None,
        "prompt_cache_key": None,
    }


def usage_object(usage: Usage) -> dict[str, Any]:
    """A ``ResponseUsage``."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total,
    }


def stored_response(
    turn: TurnRecord,
    run: RunState,
    steps: Sequence[CommittedStep],
    *,
    approvals: Sequence[Approval] = (),
    model: str = "",
    previous_response_id: str | None = None,
    background: bool = False,
) -> dict[str, Any]:
    """The response object of a stored turn (``approvals``: its calls that asked for a
    person's answer; those still waiting are shown).  ``model`` is what the request
    named: it is shown until a step records the model the host actually used;
    ``previous_response_id`` likewise until the turn has taken its place under a parent;
    ``background`` is echoed (parley does not store it: a later read says false).
    ``completed_at`` is when a completed response's turn ended."""
    meta = meta_of(
        turn,
        run,
        steps,
        model=model,
        previous_response_id=previous_response_id,
        background=background,
    )
    status = STATUS[run.status]
    reply = turn.reply if run.status.has_reply else None
    waiting = [approval_item(a.approval_id, a.tool, a.arguments) for a in approvals if a.pending]
    content = ResponseContent(
        output=committed_output(turn.turn_id, steps, reply) + waiting,
        reply=reply,
        usage=run.usage,
        error=(run.error or "the turn failed") if run.status is TurnStatus.FAILED else None,
        incomplete_reason=incomplete_reason(run.status, run.error),
        completed_at=(
            unix_seconds(run.ended_at)
            if status == "completed" and run.ended_at is not None
            else None
        ),
    )
    return response_object(meta, status=status, content=content)


def meta_of(
    turn: TurnRecord,
    run: RunState,
    steps: Sequence[CommittedStep],
    *,
    model: str = "",
    previous_response_id: str | None = None,
    background: bool = False,
) -> ResponseMeta:
    """The meta of a stored turn (see :func:`stored_response` for the hints)."""
    contract = run.contract
    return ResponseMeta(
        response_id=turn.turn_id,
        created_at=unix_seconds(turn.created_at),
        conversation_id=turn.session_id,
        model=model_used(steps) or model,
        previous_response_id=turn.parent_id or previous_response_id,
        background=background,
        max_output_tokens=contract.max_tokens if contract is not None else None,
    )


def model_used(steps: Sequence[CommittedStep]) -> str:
    """The model a turn's newest step recorded ("": none recorded one)."""
    return next((s.payload.model for s in reversed(steps) if s.payload.model), "")


def incomplete_reason(status: TurnStatus, error: str | None) -> str | None:
    """Why an ``incomplete`` response stopped, in OpenAI's words: a step budget is
    ``max_messages`` (a step is one model message), a token budget ``max_output_tokens``."""
    if status is TurnStatus.BUDGET_EXCEEDED:
        return "max_messages" if error and error.startswith("max_steps") else "max_output_tokens"
    if status is TurnStatus.CHECK_FAILED:
        return "max_messages"  # the contract's check still failed when the steps ran out
    return None


def committed_output(
    turn_id: str, steps: Sequence[CommittedStep], reply: str | None
) -> list[dict[str, Any]]:
    """The output items of a turn's committed steps: every tool round, then the reply."""
    output: list[dict[str, Any]] = []
    used: dict[str, int] = {}
    ordered = sorted(steps, key=lambda s: s.index)
    for step in ordered:
        results = {r.call_id: r for r in step.payload.tool_results}
        for call in step.payload.tool_calls:
            shown = shown_call_id(call.id, step.index, used)
            output.append(
                function_call_item(
                    call_item_id(turn_id, step.index, call.id),
                    shown,
                    call.name,
                    call.arguments,
                    "completed",
                )
            )
            result = results.get(call.id)
            if result is not None:
                output.append(
                    function_output_item(
                        output_item_id(turn_id, step.index, call.id),
                        shown,
                        result.content,
                        "completed",
                    )
                )
        for call in step.payload.tool_calls:
            used.setdefault(call.id, step.index)
    if reply is not None:
        last = ordered[-1].index if ordered else 0
        output.append(message_item(message_id(turn_id, last), reply, "completed", "final_answer"))
    return output


def _compact(turn_id: str) -> str:
    return turn_id.replace("-", "")


def message_id(turn_id: str, step: int, attempt: int = 0) -> str:
    """The id of a step's message item (``attempt``: how many the stream opened before it
    for the same step)."""
    suffix = f"_{attempt}" if attempt else ""
    return f"msg_{_compact(turn_id)}_{step}{suffix}"


def call_item_id(turn_id: str, step: int, call_id: str) -> str:
    """The id of a ``function_call`` item."""
    return f"fc_{_compact(turn_id)}_{step}_{call_id}"


def output_item_id(turn_id: str, step: int, call_id: str) -> str:
    """The id of a ``function_call_output`` item."""
    return f"fco_{_compact(turn_id)}_{step}_{call_id}"


def shown_call_id(call_id: str, step: int, used: dict[str, int]) -> str:
    """The call id a client sees: the model's, unless an earlier step of the response
    used it already (OpenAI's client takes a call id to name one call of a response, and
    a model may number each step's calls from 1)."""
    first = used.get(call_id)
    return call_id if first is None or first == step else f"{call_id}_{step}"


def message_item(
    item_id: str, text: str | None, status: str, phase: str | None = None
) -> dict[str, Any]:
    """A ``ResponseOutputMessage`` (``text`` None: no content part yet)."""
    item: dict[str, Any] = {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [] if text is None else [text_part(text)],
    }
    if phase is not None:
        item["phase"] = phase
    return item


def approval_item(approval_id: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An ``McpApprovalRequest``: a call waiting for a person's answer (its ``id`` is the
    approval id the answer names; ``server_label`` says the host's tools asked)."""
    return {
        "id": approval_id,
        "type": "mcp_approval_request",
        "name": tool,
        "arguments": json.dumps(arguments, sort_keys=True),
        "server_label": "parley",
    }


def text_part(text: str) -> dict[str, Any]:
    """A ``ResponseOutputText`` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    """A ``ResponseFunctionToolCall``."""
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def function_output_item(item_id: str, call_id: str, output: str, status: str) -> dict[str, Any]:
    """A ``ResponseFunctionToolCallOutputItem``: the result parley's host gave the model."""
    return {
        "id": item_id,
        "type": "function_call_output",
        "call_id": call_id,
        "output": output,
        "status": status,
    }


# ---------------------------------------------------------------------------- events
