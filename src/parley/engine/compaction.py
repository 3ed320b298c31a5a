"""Compaction strategies (docs/compaction.md): the messages the model is sent instead of
the older turns of a path, made from those turns' messages.

Every strategy keeps tool rounds whole (docs/guarantees.md#11-checked-replay): ``trim``
shortens what a round says but keeps every call and its result, and ``summarize``
replaces the covered turns by one message with no call at all, and ``native`` by the
provider's own item, which no call is in.  What they return is
checked again (:func:`~parley.engine.context.check_replay`) before it is stored.

Token counts are by the counter the caller gives (:mod:`parley.engine.token_counts`:
tiktoken's for OpenAI models), else estimates (about four characters a token).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import cast

from parley.engine.context import check_replay
from parley.ports.admission import ProviderReport
from parley.ports.budget import TokenCounter, estimate_tokens
from parley.ports.host import (
    Model,
    ModelRequest,
    NativeCompactor,
    ToolContext,
    native_provider_of,
)
from parley.schemas.compactions import NativeItem
from parley.schemas.errors import Conflict, InvalidRequest
from parley.schemas.messages import (
    AssistantMessage,
    Message,
    Prefix,
    ToolMessage,
    UserMessage,
)
from parley.schemas.records import Usage

SUMMARY_HEADINGS = ("Goal", "Decisions", "Facts and data", "Open questions", "Next steps")
"""The sections a summary is asked for, in order."""


def trimmed_result_marker(characters: int) -> str:
    """What the model sees in place of a trimmed tool result."""
    return f"[parley trimmed this tool result ({characters} characters)]"


def trimmed_arguments_marker(characters: int) -> str:
    """What the model sees in place of a trimmed call's arguments: still a JSON object,
    since providers parse arguments as one."""
    return json.dumps({"parley_trimmed": f"{characters} characters of arguments"})


def message_tokens(messages: Sequence[Message], counter: TokenCounter = estimate_tokens) -> int:
    """The tokens of ``messages`` by ``counter`` (text, call names and arguments, results)."""
    total = 0
    for m in messages:
        if isinstance(m, UserMessage):
            total += counter(m.text)
        elif isinstance(m, AssistantMessage):
            total += counter(m.text + "".join(c.name + c.arguments for c in m.tool_calls))
        else:
            total += counter(m.name + m.content)
    return total


def trim(messages: Sequence[Message], *, keep: int) -> tuple[tuple[Message, ...], int]:
    """``messages`` with the tool results and call arguments of every round but the
    newest ``keep`` replaced by short markers (each only where the marker is shorter),
    and how many were replaced.  Every call keeps its result: the rounds stay whole."""
    if keep < 0:
        raise ValueError("keep must be 0 or more")
    checked = check_replay(messages)
    rounds = [i for i, m in enumerate(checked) if isinstance(m, AssistantMessage) and m.tool_calls]
    spared = set(rounds[len(rounds) - keep :]) if keep else set()
    out: list[Message] = []
    replaced = 0
    in_spared_round = False
    for position, message in enumerate(checked):
        if isinstance(message, AssistantMessage):
            in_spared_round = position in spared
            if message.tool_calls and not in_spared_round:
                calls = []
                for call in message.tool_calls:
                    marker = trimmed_arguments_marker(len(call.arguments))
                    if len(marker) < len(call.arguments):
                        call = replace(call, arguments=marker)
                        replaced += 1
                    calls.append(call)
                message = replace(message, tool_calls=tuple(calls))
        elif isinstance(message, ToolMessage) and not in_spared_round:
            marker = trimmed_result_marker(len(message.content))
            if len(marker) < len(message.content):
                message = replace(message, content=marker)
                replaced += 1
        out.append(message)
    return check_replay(out), replaced


def transcript_text(messages: Sequence[Message]) -> str:
    """The covered turns as plain text, for a summarizing model call: providers refuse
    tool rounds without their tools declared, and the summary needs none."""
    lines: list[str] = []
    for m in messages:
        if isinstance(m, UserMessage):
            lines.append(f"USER: {m.text}")
        elif isinstance(m, AssistantMessage):
            if m.text:
                lines.append(f"ASSISTANT: {m.text}")
            lines.extend(f"ASSISTANT CALLS {c.name}({c.arguments})" for c in m.tool_calls)
        else:
            lines.append(f"TOOL {m.name}{' (error)' if m.is_error else ''}: {m.content}")
    return "\n".join(lines)


SUMMARY_INSTRUCTIONS = (
    "You are compacting a long conversation between a user and an agent so that the "
    "agent can go on without the full history. Write a summary under exactly these "
    "headings, in this order: "
    + ", ".join(f"'## {h}'" for h in SUMMARY_HEADINGS)
    + ". Keep every fact, figure, file name, identifier and decision the work depends on; "
    "leave out pleasantries. Write only the summary."
)
"""The system prompt of a summarizing model call."""


class _NoStream:
    """A summary is read whole: nobody follows its tokens."""

    def __call__(self, text: str) -> None:
        return None

    def restart(self, reason: str) -> None:
        return None

    def raise_if_interrupted(self) -> None:
        return None

    def provider_report(self, report: ProviderReport) -> None:
        return None


def summarize(
    model: Model, messages: Sequence[Message], context: ToolContext | None = None
) -> tuple[tuple[Message, ...], str, Usage]:
    """What the model sees instead of ``messages``: ``model``'s summary of them under
    the structured headings, as one message; the summary; what the call cost.
    ``context``: the turn asking, if one does (as every model call of a turn says).
    :class:`Conflict` for an empty summary (nothing to store)."""
    request = ModelRequest(
        prefix=Prefix(system_prompt=SUMMARY_INSTRUCTIONS, tools=()),
        messages=(UserMessage(text=transcript_text(messages), origin="prompt"),),
        context=context,
    )
    reply = model.stream(request, _NoStream())
    summary = reply.text.strip()
    if not summary:
        raise Conflict("the model wrote an empty summary: nothing was stored")
    return (summary_message(summary),), summary, reply.usage


def native_compactor(model: Model) -> NativeCompactor:
    """``model`` as one whose provider compacts natively, or :class:`InvalidRequest`."""
    if not native_provider_of(model) or not callable(getattr(model, "compact_natively", None)):
        raise InvalidRequest(
            f"strategy 'native' needs a model whose provider compacts natively (Anthropic's); "
            f"{model.name!r} does not (docs/compaction.md#native)"
        )
    return cast(NativeCompactor, model)


def compact_natively(
    model: Model,
    prefix: Prefix,
    messages: Sequence[Message],
    *,
    earlier: NativeItem | None = None,
    context: ToolContext | None = None,
) -> tuple[NativeItem, str, Usage]:
    """The model's provider's own compaction of ``messages`` (after ``earlier``, the
    native item of the compaction they start from, if one does): its item, its text, its
    cost.  :class:`InvalidRequest` for a model whose provider makes none."""
    compactor = native_compactor(model)
    request = ModelRequest(
        prefix=prefix, messages=tuple(check_replay(messages)), context=context, native=earlier
    )
    made = compactor.compact_natively(request)
    return made.item, made.text, made.usage


def summary_message(summary: str) -> UserMessage:
    """What the model sees instead of the turns a summary covers."""
    return UserMessage(
        text="[parley compacted the earlier part of this conversation; its summary follows]"
        f"\n\n{summary}",
        origin="prompt",
    )
