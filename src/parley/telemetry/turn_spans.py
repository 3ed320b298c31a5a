"""The spans of a turn, as the OpenTelemetry GenAI semantic conventions name them.

``invoke_agent parley`` per attempt at a turn (``gen_ai.conversation.id`` the session,
``parley.turn.id``, ``parley.run.id``, ``parley.attempt``, ``parley.outcome``), in the
turn's trace (:mod:`parley.telemetry.tracing`); under it ``chat {model}`` per model call
(``gen_ai.request.model``, ``gen_ai.provider.name``, the usage, the finish reasons),
``execute_tool {name}`` per tool call (``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
``parley.tool.decision``: ran, refused, approved, denied, error, interrupted), and
parley's own: the wait before the attempt (``parley.wait queue``, ``… capacity``,
``… approval``), a wait for capacity inside it, and each commit.

Everything here returns at once when tracing is off (``tracing.tracer()`` is None).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from parley.schemas.errors import Fenced
from parley.schemas.records import Waiting
from parley.telemetry import tracing

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

    from parley.ports.backend import ClaimedTurn, Store
    from parley.ports.host import ModelReply
    from parley.schemas.messages import Message, Prefix, ToolCall, ToolResult
    from parley.schemas.records import TurnStatus

log = logging.getLogger("parley.tracing")

AGENT = "parley"
"""``gen_ai.agent.name``: the agent is parley's loop, whatever model it drives."""

INPUT_LIMIT = 65_536
"""Characters of a call's ``gen_ai.input.messages`` (its newest messages that fit)."""

SHORT_WAIT_NS = 5_000_000
"""A wait for capacity inside an attempt shorter than this is no span of its own."""


# ---------------------------------------------------------------------- the caller's side


def submission(session_id: str, priority: str) -> AbstractContextManager[Span | None]:
    """The span of a submission (kind PRODUCER), the parent of everything its turn does:
    the caller's current span is its parent, and the run stores its context."""
    return tracing.span(
        "parley.submit",
        kind="PRODUCER",
        attributes={"gen_ai.conversation.id": session_id, "parley.priority": priority},
    )


def submitted(span: Span | None, turn_id: str, run_id: str, *, created: bool) -> None:
    """Which turn the submission made (or found: a repeated request id)."""
    if span is not None:
        span.set_attributes(
            {"parley.turn.id": turn_id, "parley.run.id": run_id, "parley.repeated": not created}
        )


def answer(
    turn_id: str,
    approval_id: str,
    decision: str,
    trace_context: Callable[[], Mapping[str, str] | None],
) -> AbstractContextManager[Span | None]:
    """The span of a person's answer to a waiting call, in the turn's trace (however
    late it comes: ``trace_context`` reads it from the run), linked to the request that
    carried it."""
    if tracing.tracer() is None:
        return nullcontext()  # (and the run is not read for a context)
    try:
        stored = tracing.context_of(trace_context())
    except Exception:  # the answer matters, its span does not: it goes without a parent
        log.warning("could not read turn %s's trace context", turn_id, exc_info=True)
        stored = None
    return tracing.span(
        "parley.approval answer",
        parent=stored,
        links=tracing.link_to_current() if stored is not None else (),
        attributes={
            "parley.turn.id": turn_id,
            "parley.approval.id": approval_id,
            "parley.approval.decision": decision,
        },
    )


# ---------------------------------------------------------------------- the attempt


@contextmanager
def attempt(claimed: ClaimedTurn, store: Store) -> Iterator[Span | None]:
    """The ``invoke_agent`` span of one attempt at ``claimed``, current for the block, in
    the turn's trace (restored from its run; a run with none gets this attempt's), after
    the span of the wait that ended with this claim."""
    if tracing.tracer() is None:
        yield None
        return
    run = claimed.run
    stored = tracing.context_of(run.trace_context)
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": AGENT,
        "gen_ai.conversation.id": claimed.session.session_id,
        "parley.turn.id": claimed.turn.turn_id,
        "parley.run.id": run.run_id,
        "parley.attempt": run.attempts + 1,
        "parley.priority": run.priority,
    }
    if claimed.previous_status == "running":
        attributes["parley.resumed_after"] = "takeover"
    if tracing.content():
        attributes["parley.prompt"] = tracing.clipped(claimed.turn.prompt)
    # The task that kicked this attempt (a Celery span, if its instrumentation is on) is
    # linked, not the parent: the turn keeps its own trace whoever kicks it.
    links = tracing.link_to_current()
    parent = stored if stored is not None else tracing.new_root()
    if stored is not None:
        _waited(claimed, stored)
    with tracing.span(
        f"invoke_agent {AGENT}", parent=parent, links=links, attributes=attributes
    ) as span:
        if stored is None:
            _keep_context(store, run.run_id)
            _waited(claimed, None)
        try:
            yield span
        except Fenced:
            # Another driver holds the turn now: this attempt stops, the turn goes on.
            if span is not None:
                span.set_attribute("parley.outcome", "lost_session")
            raise


def _keep_context(store: Store, run_id: str) -> None:
    """Store this attempt's context with a run that had none, so that later attempts
    join its trace.  A failure only costs them that: it never fails the turn."""
    here = tracing.carrier()
    if here is None:
        return
    try:
        store.set_trace_context(run_id, here)
    except Exception:
        log.warning(
            "could not keep run %s's trace context; its next attempt starts another",
            run_id,
            exc_info=True,
        )


def _waited(claimed: ClaimedTurn, parent: Context | None) -> None:
    """The span of the wait this claim ended: in line (submitted or resumed), for
    provider capacity, or for answers to a held step.  A takeover after a crash has none
    (nobody knows when the driver died)."""
    run = claimed.run
    if claimed.previous_status != "queued" or run.waiting_since is None:
        return
    what = str(run.waiting_for or Waiting.QUEUE)
    tracing.record(
        f"parley.wait {what}",
        started=run.waiting_since,
        parent=parent,
        attributes={"parley.turn.id": claimed.turn.turn_id, "parley.wait": what},
    )


def ended(span: Span | None, status: TurnStatus) -> None:
    """What the attempt came to: the turn's status when it let go (``queued``: it waits
    for capacity; ``waiting``: for answers)."""
    if span is None:
        return
    span.set_attribute("parley.outcome", status.value)
    if status.value == "failed":
        tracing.fail(span, "turn_failed")


def waited_in_slot(started_ns: int, model: str) -> None:
    """A wait for capacity spent in the worker slot (a second or less), if it was one."""
    if tracing.tracer() is None:
        return
    now = time.time_ns()
    if now - started_ns >= SHORT_WAIT_NS:
        tracing.record(
            "parley.wait capacity",
            started=started_ns / 1e9,
            attributes={"parley.wait": "capacity", "gen_ai.request.model": model},
        )


def commit(what: str, step: int) -> AbstractContextManager[Span | None]:
    """The span of one commit transaction (``step``, or the turn's ``end``)."""
    return tracing.span(f"parley.commit {what}", attributes={"parley.step": step})


# ---------------------------------------------------------------------- model calls


def provider_and_model(name: str) -> tuple[str, str]:
    """``openai:gpt-4o-mini`` → (``openai``, ``gpt-4o-mini``); a name without a provider
    is parley's own (the scripted model, a host's function)."""
    provider, sep, model = name.partition(":")
    return (provider, model) if sep else ("parley", name)


@contextmanager
def model_call(
    name: str, step: int, prefix: Prefix, messages: Sequence[Message]
) -> Iterator[Span | None]:
    """The ``chat {model}`` span of one model call (kind CLIENT)."""
    if tracing.tracer() is None:
        yield None
        return
    provider, model = provider_and_model(name)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        "parley.step": step,
    }
    if tracing.content():
        attributes["gen_ai.system_instructions"] = _json(
            [{"type": "text", "content": tracing.clipped(prefix.system_prompt)}]
        )
        shown, left_out = _input_messages(messages)
        attributes["gen_ai.input.messages"] = shown
        if left_out:
            attributes["parley.input.messages_left_out"] = left_out
    with tracing.span(f"chat {model}", kind="CLIENT", attributes=attributes) as span:
        yield span


def replied(span: Span | None, reply: ModelReply) -> None:
    """What the model answered: its model, usage and finish reason (and, with content
    on, the answer)."""
    if span is None:
        return
    span.set_attributes(
        {
            "gen_ai.response.model": provider_and_model(reply.model)[1] if reply.model else "",
            "gen_ai.usage.input_tokens": reply.usage.input_tokens,
            "gen_ai.usage.output_tokens": reply.usage.output_tokens,
            "gen_ai.response.finish_reasons": ["tool_calls" if reply.tool_calls else "stop"],
        }
    )
    if tracing.content():
        parts: list[dict[str, Any]] = [{"type": "text", "content": tracing.clipped(reply.text)}]
        parts += [_call_part(call) for call in reply.tool_calls]
        span.set_attribute("gen_ai.output.messages", _json([{"role": "assistant", "parts": parts}]))


def stopped(span: Span | None, how: str) -> None:
    """The call ended the attempt instead of answering (cancelled, failed)."""
    tracing.fail(span, how)


# ---------------------------------------------------------------------- tool calls


@contextmanager
def tool_call(call: ToolCall, step: int, decision: str) -> Iterator[Span | None]:
    """The ``execute_tool {name}`` span of one call, whatever became of it:
    ``decision`` is ``ran``, ``refused``, ``approved``, ``denied``, ``error`` or
    ``interrupted``."""
    if tracing.tracer() is None:
        yield None
        return
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
        "parley.step": step,
        "parley.tool.decision": decision,
    }
    if tracing.content():
        attributes["gen_ai.tool.call.arguments"] = tracing.clipped(call.arguments)
    with tracing.span(f"execute_tool {call.name}", attributes=attributes) as span:
        yield span


@contextmanager
def agent_calls(
    calls: Sequence[tuple[ToolCall, str]], step: int
) -> Iterator[list[dict[str, str] | None]]:
    """An ``execute_tool {agent}`` span for each agent call a held step opens a child
    turn for (``calls``: each call and its child's turn id), siblings under the current
    ``invoke_agent`` span, open for the block; yields each one's W3C context, which the
    child's run stores so that the child's spans, on whatever worker runs it, nest under
    its call (docs/sub-agents.md#7-seen).  Nones when tracing is off."""
    if tracing.tracer() is None:
        yield [None for _ in calls]
        return
    from opentelemetry import context

    here = context.get_current()
    with ExitStack() as spans:
        carriers: list[dict[str, str] | None] = []
        for call, child_turn_id in calls:
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.id,
                "gen_ai.tool.type": "agent",
                "parley.step": step,
                "parley.tool.decision": "agent",
                "parley.child.turn.id": child_turn_id,
            }
            if tracing.content():
                attributes["gen_ai.tool.call.arguments"] = tracing.clipped(call.arguments)
            spans.enter_context(
                tracing.span(f"execute_tool {call.name}", attributes=attributes, parent=here)
            )
            carriers.append(tracing.carrier())
        yield carriers


def tool_answered(span: Span | None, result: ToolResult) -> None:
    """The call's result (its content only with content on)."""
    if span is None:
        return
    if result.is_error:
        span.set_attribute("parley.tool.error", True)
    if tracing.content():
        span.set_attribute("gen_ai.tool.call.result", tracing.clipped(result.content))


# ---------------------------------------------------------------------- content


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _call_part(call: ToolCall) -> dict[str, Any]:
    arguments = tracing.clipped(call.arguments)
    return {"type": "tool_call", "id": call.id, "name": call.name, "arguments": arguments}


def _input_messages(messages: Sequence[Message]) -> tuple[str, int]:
    """``gen_ai.input.messages`` for a call: its newest messages whose JSON fits in
    ``INPUT_LIMIT`` (a long turn's history would otherwise grow every call's span with
    the square of its length), and how many older ones were left out."""
    shown = [_json(_message(m)) for m in messages]
    kept, size = 0, 2
    for text in reversed(shown):
        if kept and size + len(text) + 2 > INPUT_LIMIT:
            break
        kept, size = kept + 1, size + len(text) + 2
    return "[" + ", ".join(shown[len(shown) - kept :]) + "]", len(shown) - kept


def _message(message: Message) -> dict[str, Any]:
    """A message in the conventions' form (``role`` and typed ``parts``)."""
    if message.role == "user":
        return {
            "role": "user",
            "parts": [{"type": "text", "content": tracing.clipped(message.text)}],
        }
    if message.role == "assistant":
        parts: list[dict[str, Any]] = [{"type": "text", "content": tracing.clipped(message.text)}]
        return {"role": "assistant", "parts": parts + [_call_part(c) for c in message.tool_calls]}
    response = {
        "type": "tool_call_response",
        "id": message.call_id,
        "response": tracing.clipped(message.content),
    }
    return {"role": "tool", "parts": [response]}
