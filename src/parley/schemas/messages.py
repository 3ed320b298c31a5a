"""Model-visible conversation items and the versioned stored form of a step.

A step is stored as one JSON document (``StepPayload``) whose ``v`` field names its
version; ``StepPayload.from_json`` keeps every older version loadable.  Messages are a
tagged union on ``role``; the user message also carries ``origin`` (``prompt``, ``steer``
or ``check``) so that the turn's own prompt can be told apart from mid-turn input.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, Literal

from parley.schemas.errors import CodecError
from parley.schemas.records import Usage

STEP_PAYLOAD_VERSION = 1

InputOrigin = Literal["prompt", "steer", "check", "driver"]
"""Who wrote a user message: the prompt, a steer, a failed check's report, or a driver's
instruction (``driver``: sent with one request, never stored as conversation)."""


@dataclass(frozen=True, kw_only=True)
class ToolDeclaration:
    """A tool as the model sees it: name, description and JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The stored and wire form."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolDeclaration:
        """Load the stored form."""
        return cls(
            name=str(data["name"]),
            description=str(data["description"]),
            parameters=dict(data["parameters"]),
        )


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """A call the model asked for.  ``arguments`` is the raw JSON text the model produced,
    kept verbatim so that replay sends back exactly what the model said."""

    id: str
    name: str
    arguments: str

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolCall:
        """Load the stored form."""
        return cls(id=str(data["id"]), name=str(data["name"]), arguments=str(data["arguments"]))


@dataclass(frozen=True, kw_only=True)
class ToolResult:
    """The answer to one tool call.  ``refusal`` names the policy rule that refused it."""

    call_id: str
    name: str
    content: str
    is_error: bool = False
    refusal: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return {
            "call_id": self.call_id,
            "name": self.name,
            "content": self.content,
            "is_error": self.is_error,
            "refusal": self.refusal,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolResult:
        """Load the stored form."""
        return cls(
            call_id=str(data["call_id"]),
            name=str(data["name"]),
            content=str(data["content"]),
            is_error=bool(data.get("is_error", False)),
            refusal=data.get("refusal"),
        )


@dataclass(frozen=True, kw_only=True)
class StepInput:
    """Text that entered the conversation at a step boundary (a steer or check feedback)."""

    origin: InputOrigin
    text: str

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return {"origin": self.origin, "text": self.text}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepInput:
        """Load the stored form."""
        origin = data["origin"]
        if origin not in ("prompt", "steer", "check"):
            raise CodecError(f"unknown step input origin {origin!r}")
        return cls(origin=origin, text=str(data["text"]))


@dataclass(frozen=True, kw_only=True)
class UserMessage:
    """Text from the operator or the harness."""

    role: Literal["user"] = "user"
    text: str
    origin: InputOrigin = "prompt"


@dataclass(frozen=True, kw_only=True)
class AssistantMessage:
    """What the model said in one step: text and the tool calls it asked for."""

    role: Literal["assistant"] = "assistant"
    text: str
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ToolMessage:
    """The result of one tool call, sent back to the model."""

    role: Literal["tool"] = "tool"
    call_id: str
    name: str
    content: str
    is_error: bool = False


Message = UserMessage | AssistantMessage | ToolMessage


@dataclass(frozen=True, kw_only=True)
class Prefix:
    """The stable start of every request: system prompt and tool declarations."""

    system_prompt: str
    tools: tuple[ToolDeclaration, ...]

    def to_json(self) -> dict[str, Any]:
        """The stored form; serialised canonically so equal prefixes are equal bytes."""
        return {"system_prompt": self.system_prompt, "tools": [t.to_json() for t in self.tools]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Prefix:
        """Load the stored form."""
        return cls(
            system_prompt=str(data["system_prompt"]),
            tools=tuple(ToolDeclaration.from_json(t) for t in data["tools"]),
        )

    def canonical_bytes(self) -> bytes:
        """Byte-identical for equal prefixes: what provider prompt caches key on."""
        return self._canonical

    @cached_property
    def _canonical(self) -> bytes:
        # Computed once per prefix object: every step's request digest starts with it.
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True, kw_only=True)
class StepPayload:
    """Everything one step committed: the input that entered at its boundary, what the
    model said, the tool results and the usage.  Stored whole or not at all."""

    inputs: tuple[StepInput, ...] = ()
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()
    usage: Usage = field(default_factory=Usage)
    request_digest: str = ""
    model: str = ""
    label: str = ""
    """What a host's driver called this step (``plan``, ``act`` …), so that a driver
    resumed from its committed steps knows where it was; parley's own loop sets none."""

    def to_json(self) -> dict[str, Any]:
        """The stored form, tagged with its version."""
        stored: dict[str, Any] = {
            "v": STEP_PAYLOAD_VERSION,
            "inputs": [i.to_json() for i in self.inputs],
            "text": self.text,
            "tool_calls": [c.to_json() for c in self.tool_calls],
            "tool_results": [r.to_json() for r in self.tool_results],
            "usage": self.usage.to_json(),
            "request_digest": self.request_digest,
            "model": self.model,
        }
        if self.label:  # absent unless a driver set it: the stored form is unchanged
            stored["label"] = self.label
        return stored

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepPayload:
        """Load any stored version."""
        version = data.get("v")
        if version != 1:
            raise CodecError(f"unknown step payload version {version!r}")
        try:
            return cls._from_v1(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise CodecError(f"malformed step payload: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def _from_v1(cls, data: dict[str, Any]) -> StepPayload:
        return cls(
            inputs=tuple(StepInput.from_json(i) for i in data.get("inputs", ())),
            text=str(data.get("text", "")),
            tool_calls=tuple(ToolCall.from_json(c) for c in data.get("tool_calls", ())),
            tool_results=tuple(ToolResult.from_json(r) for r in data.get("tool_results", ())),
            usage=Usage.from_json(data.get("usage", {})),
            request_digest=str(data.get("request_digest", "")),
            model=str(data.get("model", "")),
            label=str(data.get("label", "")),
        )


def request_digest(prefix: Prefix, messages: Sequence[Message]) -> str:
    """A SHA-256 of a request, stored with its step so a replay can be audited."""
    digest = hashlib.sha256(prefix.canonical_bytes())
    for message in messages:
        digest.update(message_bytes(message))
    return digest.hexdigest()


@lru_cache(maxsize=8192)
def message_bytes(message: Message) -> bytes:
    """The canonical JSON bytes of a message.  Cached: a turn's requests repeat every
    earlier message, and messages are immutable."""
    return json.dumps(message_to_json(message), sort_keys=True, separators=(",", ":")).encode()


def request_size(prefix: Prefix, messages: Sequence[Message]) -> int:
    """The characters of a request as parley encodes it (its prefix and its messages):
    what a rough token estimate of its input counts."""
    return len(prefix.canonical_bytes()) + sum(len(message_bytes(m)) for m in messages)


def message_to_json(message: Message) -> dict[str, Any]:
    """A plain-JSON view of one message (for digests and provider codecs)."""
    if isinstance(message, UserMessage):
        return {"role": "user", "text": message.text, "origin": message.origin}
    if isinstance(message, AssistantMessage):
        return {
            "role": "assistant",
            "text": message.text,
            "tool_calls": [c.to_json() for c in message.tool_calls],
        }
    return {
        "role": "tool",
        "call_id": message.call_id,
        "name": message.name,
        "content": message.content,
        "is_error": message.is_error,
    }
