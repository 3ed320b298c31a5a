"""Typed durable rows of a conversation and their projections (docs/transcript.md);
public as ``parley.transcript``.

parley stores a conversation as turns (a prompt) and their committed steps (the inputs
that entered at the step's boundary, the assistant's text and tool calls, the tool
results), plus, for a turn an interrupt cut off while the model streamed, a display-only
*partial*.  :func:`rows` flattens that into one ordered list of typed rows, the form a
host codec maps to its own dialect and back (``docs/transcript.md`` is the conversion
contract, with a worked example):

- :func:`native` is what a provider is sent: prompts, inputs, assistant messages with
  their tool calls, tool results, in order; partials are left out.
- :func:`to_messages` is the checked native replay: :class:`CodecError` if any tool call
  is without its result (an incomplete round), instead of orphan provider messages.
- :func:`display` is text only, for people: partials shown (marked), tool rounds as
  their text.

``Session.transcript()`` returns the rows of the history path (root → head).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from parley.engine.context import check_replay
from parley.ports.backend import CommittedStep
from parley.schemas.errors import CodecError
from parley.schemas.messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage

__all__ = [
    "AssistantRow",
    "DisplayLine",
    "InputRow",
    "PartialRow",
    "PromptRow",
    "Row",
    "ToolResultRow",
    "display",
    "from_json",
    "native",
    "rows",
    "to_json",
    "to_messages",
]


@dataclass(frozen=True, kw_only=True)
class PromptRow:
    """A turn's prompt (``seeded``: imported with ``Session.seed_history``)."""

    kind: Literal["prompt"] = "prompt"
    turn_id: str
    text: str
    seeded: bool = False


@dataclass(frozen=True, kw_only=True)
class InputRow:
    """Text that entered at step ``step``'s boundary: a delivered steer, or a failed
    check's feedback."""

    kind: Literal["input"] = "input"
    turn_id: str
    step: int
    origin: Literal["steer", "check"]
    text: str


@dataclass(frozen=True, kw_only=True)
class AssistantRow:
    """What the model said in step ``step``: its text and the tool calls it asked for."""

    kind: Literal["assistant"] = "assistant"
    turn_id: str
    step: int
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    seeded: bool = False


@dataclass(frozen=True, kw_only=True)
class ToolResultRow:
    """The result of one tool call of step ``step`` (``refusal``: the rule that refused
    it, if one did)."""

    kind: Literal["tool_result"] = "tool_result"
    turn_id: str
    step: int
    call_id: str
    name: str
    content: str
    is_error: bool = False
    refusal: str | None = None


@dataclass(frozen=True, kw_only=True)
class PartialRow:
    """Text the model streamed before an interrupt cut it off: shown to people, never
    replayed to a model."""

    kind: Literal["partial"] = "partial"
    turn_id: str
    text: str


Row = PromptRow | InputRow | AssistantRow | ToolResultRow | PartialRow


@dataclass(frozen=True, kw_only=True)
class DisplayLine:
    """One line of the display projection."""

    role: Literal["user", "assistant", "tool"]
    text: str
    partial: bool = False


def rows(
    turn_id: str,
    prompt: str,
    steps: Iterable[CommittedStep],
    *,
    partial: str | None = None,
    seeded: bool = False,
) -> list[Row]:
    """One turn's rows, in order: its prompt, then per step its inputs, the assistant's
    message and the results of its calls (in call order), then its partial, if any."""
    found: list[Row] = [PromptRow(turn_id=turn_id, text=prompt, seeded=seeded)]
    for step in steps:
        payload = step.payload
        found.extend(
            InputRow(turn_id=turn_id, step=step.index, origin=i.origin, text=i.text)  # type: ignore[arg-type]
            for i in payload.inputs
        )
        found.append(
            AssistantRow(
                turn_id=turn_id,
                step=step.index,
                text=payload.text,
                tool_calls=payload.tool_calls,
                seeded=seeded,
            )
        )
        results = {r.call_id: r for r in payload.tool_results}
        for call in payload.tool_calls:
            result = results.get(call.id)
            if result is not None:
                found.append(
                    ToolResultRow(
                        turn_id=turn_id,
                        step=step.index,
                        call_id=result.call_id,
                        name=result.name,
                        content=result.content,
                        is_error=result.is_error,
                        refusal=result.refusal,
                    )
                )
    if partial:
        found.append(PartialRow(turn_id=turn_id, text=partial))
    return found


def native(transcript: Sequence[Row]) -> list[Message]:
    """What a provider is sent for ``transcript``, unchecked: partials left out."""
    messages: list[Message] = []
    for row in transcript:
        match row:
            case PromptRow(text=text):
                messages.append(UserMessage(text=text, origin="prompt"))
            case InputRow(text=text, origin=origin):
                messages.append(UserMessage(text=text, origin=origin))
            case AssistantRow(text=text, tool_calls=calls):
                messages.append(AssistantMessage(text=text, tool_calls=calls))
            case ToolResultRow(call_id=call_id, name=name, content=content, is_error=error):
                messages.append(
                    ToolMessage(call_id=call_id, name=name, content=content, is_error=error)
                )
            case PartialRow():
                continue
    return messages


def to_messages(transcript: Sequence[Row]) -> tuple[Message, ...]:
    """The checked native replay: :class:`CodecError` on an incomplete tool round."""
    return check_replay(native(transcript))


def display(transcript: Sequence[Row]) -> list[DisplayLine]:
    """Text only, for people: prompts and inputs, the assistant's text (a step with
    none shows nothing), tool results, and partials (marked)."""
    lines: list[DisplayLine] = []
    for row in transcript:
        match row:
            case PromptRow(text=text) | InputRow(text=text):
                lines.append(DisplayLine(role="user", text=text))
            case AssistantRow(text=text) if text:
                lines.append(DisplayLine(role="assistant", text=text))
            case ToolResultRow(name=name, content=content):
                lines.append(DisplayLine(role="tool", text=f"{name}: {content}"))
            case PartialRow(text=text):
                lines.append(DisplayLine(role="assistant", text=text, partial=True))
    return lines


def to_json(row: Row) -> dict[str, Any]:
    """A row's JSON form (``kind`` tags it)."""
    data = dict(vars(row))
    if isinstance(row, AssistantRow):
        data["tool_calls"] = [c.to_json() for c in row.tool_calls]
    return data


def from_json(data: dict[str, Any]) -> Row:
    """Load a row's JSON form; :class:`CodecError` for one that is not a row."""
    values = dict(data)
    kind = values.get("kind")
    try:
        if kind == "prompt":
            return PromptRow(**values)
        if kind == "input":
            return InputRow(**values)
        if kind == "assistant":
            calls = tuple(ToolCall.from_json(c) for c in values.pop("tool_calls", ()))
            return AssistantRow(**values, tool_calls=calls)
        if kind == "tool_result":
            return ToolResultRow(**values)
        if kind == "partial":
            return PartialRow(**values)
    except (TypeError, KeyError) as exc:
        raise CodecError(f"not a {kind} row: {exc}") from None
    raise CodecError(f"unknown row kind {kind!r}")
