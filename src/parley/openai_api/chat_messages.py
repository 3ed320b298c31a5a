"""A chat-completions request's ``messages`` as a parley turn
(docs/batches.md#chat-completions): the newest user message is its prompt, and the
messages before that prompt the conversation its new session starts with, imported as
``Session.seed_history`` imports one (docs/host.md#3-seeded-history) and checked as it
checks one: a tool call without its result is refused.  The system and developer
messages are the request's instructions, which parley checks and does not use, as the
Responses route takes ``instructions``: the host's system prompt is the one the model
sees.

Messages are OpenAI's (``role`` system, developer, user, assistant or tool; ``content``
a string or a list of content parts), text only: an image, audio or file part is
refused, as the Responses route refuses one.  Every refusal is an
:class:`~parley.openai_api.errors.OpenAIError` naming the message (``messages[N]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from parley.errors import CodecError, InvalidRequest
from parley.openai_api.errors import OpenAIError
from parley.openai_api.response_requests import checked_prompt
from parley.schemas.batches import SeededHistory
from parley.seeding import MAX_SEED_MESSAGES, seeded_turns
from parley.validation import MAX_PROMPT_BYTES, check_json_object

INSTRUCTING = frozenset({"system", "developer"})
KEYS: dict[str, frozenset[str]] = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset(
        {"role", "content", "name", "refusal", "tool_calls", "audio", "function_call"}
    ),
    "tool": frozenset({"role", "content", "tool_call_id"}),
}
"""What each role's message may hold, as OpenAI documents it."""
MAX_HISTORY_BYTES = MAX_PROMPT_BYTES * 10
"""The most an imported conversation may weigh, as ``Session.seed_history`` takes it."""


@dataclass(frozen=True, kw_only=True)
class ChatMessages:
    """What a request's messages make of its turn."""

    prompt: str
    history: SeededHistory | None


def read_messages(messages: Sequence[Any]) -> ChatMessages:
    """The turn ``messages`` ask for (see the module docstring), or :class:`OpenAIError`."""
    texts = [_checked(n, message) for n, message in enumerate(messages)]
    roles = [message["role"] for message in messages]
    users = [n for n, role in enumerate(roles) if role == "user"]
    if not users:
        raise OpenAIError(
            400, "messages has no user message (its newest one is the prompt)", param="messages"
        )
    last = users[-1]
    after = next((n for n in range(last + 1, len(roles)) if roles[n] not in INSTRUCTING), None)
    if after is not None:
        raise OpenAIError(
            400,
            f"messages[{after}] ({roles[after]}) follows the newest user message: the prompt "
            "comes last (parley runs its host's tools; it takes no tool outputs and "
            "continues no assistant message)",
            param=f"messages[{after}]",
        )
    earlier = [n for n in range(last) if roles[n] not in INSTRUCTING]
    return ChatMessages(
        prompt=checked_prompt(texts[last], f"messages[{last}].content"),
        history=_history(messages, texts, earlier) if earlier else None,
    )


def _history(messages: Sequence[Any], texts: list[str], positions: list[int]) -> SeededHistory:
    """The conversation before the prompt, imported as ``Session.seed_history`` would."""
    first = positions[0]
    if messages[first]["role"] != "user":
        raise OpenAIError(
            400,
            f"messages[{first}] ({messages[first]['role']}) comes before any user message: "
            "an imported conversation starts with a user message (a turn is a prompt "
            "and its answer)",
            param=f"messages[{first}]",
        )
    if len(positions) > MAX_SEED_MESSAGES:
        raise OpenAIError(
            400,
            f"the conversation before the prompt has {len(positions)} messages; the limit "
            f"is {MAX_SEED_MESSAGES}",
            param="messages",
        )
    given = [messages[n] for n in positions]
    try:
        check_json_object({"messages": given}, "messages", MAX_HISTORY_BYTES)
        turns = seeded_turns(
            [_seedable(messages[n], texts[n]) for n in positions], positions=positions
        )
    except (InvalidRequest, CodecError) as exc:
        raise OpenAIError(
            400, f"messages: {exc}", param="messages", code="invalid_messages"
        ) from None
    return SeededHistory(turns=tuple((t.prompt, t.steps) for t in turns), messages=tuple(given))


def _seedable(message: dict[str, Any], text: str) -> dict[str, Any]:
    """A checked message in the form ``seeded_turns`` takes: its text as its content."""
    seedable: dict[str, Any] = {"role": message["role"], "content": text}
    for key in ("tool_calls", "tool_call_id"):
        if message.get(key) is not None:
            seedable[key] = message[key]
    return seedable


def _checked(n: int, message: Any) -> str:
    """Message ``n``'s text, once it is a message parley takes; else :class:`OpenAIError`."""
    where = f"messages[{n}]"
    if not isinstance(message, dict):
        raise OpenAIError(400, f"{where} is not a message (an object)", param=where)
    role = message.get("role")
    if role == "function":
        raise OpenAIError(
            400,
            f"{where}: function messages (deprecated) are not taken: send a tool message",
            param=f"{where}.role",
        )
    if not isinstance(role, str) or role not in KEYS:
        raise OpenAIError(
            400,
            f"{where}.role must be one of {', '.join(KEYS)}, not {role!r}",
            param=f"{where}.role",
        )
    unknown = sorted(set(message) - KEYS[role])
    if unknown:
        raise OpenAIError(
            400, f"{where}: unknown key {unknown[0]!r}", param=f"{where}.{unknown[0]}"
        )
    if role == "assistant":
        return _assistant_text(where, message)
    if role == "tool" and (
        not isinstance(message.get("tool_call_id"), str) or not message["tool_call_id"]
    ):
        raise OpenAIError(
            400, f"{where}: a tool message names its tool_call_id", param=f"{where}.tool_call_id"
        )
    return _text(f"{where}.content", message.get("content"), ("text",))


def _assistant_text(where: str, message: dict[str, Any]) -> str:
    """An assistant message's words (its refusal, if that is all it said); its tool
    calls, if any, must each be a function call."""
    for key in ("audio", "function_call"):
        if message.get(key) is not None:
            raise OpenAIError(
                400,
                f"{where}.{key}: parley imports an assistant's text and tool calls only",
                param=f"{where}.{key}",
            )
    calls = message.get("tool_calls")
    if calls is not None:
        _check_calls(f"{where}.tool_calls", calls)
    content, refusal = message.get("content"), message.get("refusal")
    if refusal is not None and not isinstance(refusal, str):
        raise OpenAIError(400, f"{where}.refusal must be a string", param=f"{where}.refusal")
    if content is None:
        if not calls and not refusal:
            raise OpenAIError(
                400,
                f"{where} says nothing: it needs content, a refusal or tool calls",
                param=f"{where}.content",
            )
        return refusal or ""
    return _text(f"{where}.content", content, ("text", "refusal"))


def _check_calls(where: str, calls: Any) -> None:
    if not isinstance(calls, list):
        raise OpenAIError(400, f"{where} must be a list", param=where)
    for n, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or call.get("type", "function") != "function"
            or not isinstance(call.get("id"), str)
            or not call["id"]
            or not isinstance(function.get("name"), str)
            or not function["name"]
            or not isinstance(function.get("arguments", ""), str)
        ):
            raise OpenAIError(
                400,
                f"{where}[{n}] must be a function call: {{'id', 'type': 'function', "
                "'function': {'name', 'arguments'}}",
                param=f"{where}[{n}]",
            )


def _text(where: str, content: Any, kinds: tuple[str, ...]) -> str:
    """The text of ``content``: a string, or a list of parts of the ``kinds`` given
    (a refusal part's text is the refusal)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OpenAIError(400, f"{where} must be a string or a list of parts", param=where)
    texts = []
    for n, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get(kind) if kind in kinds and isinstance(part, dict) else None
        if not isinstance(text, str):
            raise OpenAIError(
                400,
                f"{where}[{n}] is {kind or 'not a part'}: parley takes text only",
                param=f"{where}[{n}]",
            )
        texts.append(text)
    return "\n".join(texts)
