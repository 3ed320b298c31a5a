"""``Session.seed_history``: an existing conversation, in the OpenAI chat format, as the
turns parley replays (docs/host.md#3-seeded-history).

Each ``user`` message opens a turn (its prompt); each ``assistant`` message after it is a
step of that turn (its text and tool calls), answered by the ``tool`` messages that
follow it.  The result is checked like any replay: a tool call without its result, a
result for no call, or a conversation going on past an unanswered call is
:class:`CodecError`, and nothing is stored.  A seeded turn's reply is its last step's
text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from parley.engine.context import turn_replay
from parley.errors import CodecError, InvalidRequest
from parley.ports.backend import CommittedStep
from parley.schemas.messages import StepPayload, ToolCall, ToolResult

MAX_SEED_MESSAGES = 10_000
SEEDED_MODEL = "seeded"


@dataclass(frozen=True, kw_only=True)
class SeededTurn:
    """One turn of an imported conversation."""

    prompt: str
    steps: tuple[StepPayload, ...]

    @property
    def reply(self) -> str | None:
        """The turn's last assistant text, if it has any."""
        return self.steps[-1].text if self.steps else None


def seeded_turns(
    messages: Sequence[Any], *, positions: Sequence[int] | None = None
) -> list[SeededTurn]:
    """The turns of ``messages`` (see the module docstring); :class:`InvalidRequest` for
    a message that is not one, :class:`CodecError` for an incomplete tool round.  An
    error names a message by its index, or by its number in ``positions`` (where the
    caller took the messages from a longer list)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidRequest("seed_history takes a list of messages")
    if not messages:
        raise InvalidRequest("seed_history needs at least one message")
    if len(messages) > MAX_SEED_MESSAGES:
        raise InvalidRequest(f"seed_history takes at most {MAX_SEED_MESSAGES} messages")
    turns = _by_prompt(messages, range(len(messages)) if positions is None else positions)
    seeded = [SeededTurn(prompt=prompt, steps=_steps(rest)) for prompt, rest in turns]
    for number, turn in enumerate(seeded):
        steps = [CommittedStep(index=i, payload=p) for i, p in enumerate(turn.steps)]
        try:
            turn_replay(turn.prompt, steps)
        except CodecError as exc:
            raise CodecError(f"seeded turn {number + 1}: {exc}") from None
    return seeded


def _by_prompt(
    messages: Sequence[Any], positions: Sequence[int]
) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each user message's text, with the assistant and tool messages that follow it."""
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    for position, message in zip(positions, messages, strict=True):
        if not isinstance(message, dict):
            raise InvalidRequest(f"message {position} is not an object")
        role = message.get("role")
        if role == "user":
            turns.append((_text(message, position), []))
        elif role in ("assistant", "tool"):
            if not turns:
                raise InvalidRequest("a seeded conversation starts with a user message")
            turns[-1][1].append(message | {"_position": position})
        elif role == "system":
            raise InvalidRequest(
                f"message {position}: the system prompt is the host's (Host.system_prompt, "
                "or a prefix from before_turn), not part of a seeded history"
            )
        else:
            raise InvalidRequest(f"message {position}: unknown role {role!r}")
    return turns


def _steps(messages: list[dict[str, Any]]) -> tuple[StepPayload, ...]:
    steps: list[tuple[str, list[ToolCall], list[ToolResult]]] = []
    for message in messages:
        position = message["_position"]
        if message["role"] == "assistant":
            steps.append((_text(message, position, empty=True), _calls(message, position), []))
            continue
        if not steps:
            raise CodecError(f"message {position}: a tool result answers no assistant message")
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequest(f"message {position}: a tool message needs its tool_call_id")
        _, calls, results = steps[-1]
        names = {call.id: call.name for call in calls}
        if call_id not in names:
            raise CodecError(f"message {position}: tool result {call_id} answers no open call")
        results.append(
            ToolResult(
                call_id=call_id,
                name=str(message.get("name") or names[call_id]),
                content=_text(message, position, empty=True),
            )
        )
    return tuple(
        StepPayload(
            text=text, tool_calls=tuple(calls), tool_results=tuple(results), model=SEEDED_MODEL
        )
        for text, calls, results in steps
    )


def _calls(message: dict[str, Any], position: int) -> list[ToolCall]:
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise InvalidRequest(f"message {position}: tool_calls must be a list")
    parsed = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(call.get("id"), str):
            raise InvalidRequest(
                f"message {position}: a tool call is {{'id', 'type': 'function', "
                "'function': {'name', 'arguments'}}"
            )
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        parsed.append(
            ToolCall(id=call["id"], name=str(function.get("name", "")), arguments=arguments)
        )
    return parsed


def _text(message: dict[str, Any], position: int, *, empty: bool = False) -> str:
    """A message's text: a string, or the text parts of a content list."""
    content = message.get("content")
    if content is None and empty:
        return ""
    if isinstance(content, list):
        content = "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    if not isinstance(content, str) or (not empty and not content.strip()):
        raise InvalidRequest(f"message {position}: its content must be text")
    return content
