"""A compaction: what the model sees instead of the older turns of a session's path
(docs/compaction.md).

The tree stays append-only: a compaction is a record beside it, never an edit of a
step.  It covers the path from the root to ``through_turn_id`` and applies to every turn
hung under that turn (directly or further down); a branch from before it does not see
it.  On a path with several, the one covering the most applies (the newest of those
covering the same turn); a dropped one applies to nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from parley.schemas.errors import CodecError
from parley.schemas.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    UserMessage,
    message_to_json,
)
from parley.schemas.records import Usage


class CompactionStrategy(StrEnum):
    """How a compaction was made."""

    TRIM = "trim"
    """Old tool results and call arguments replaced by short markers."""
    SUMMARIZE = "summarize"
    """A model call wrote a structured summary of the covered turns."""
    NATIVE = "native"
    """The provider's own compaction item, opaque, for that provider only."""


@dataclass(frozen=True, kw_only=True)
class NativeItem:
    """A provider's own compaction item (docs/compaction.md#native), kept as the provider
    returned it: opaque to parley, sent back verbatim, and only to ``provider``."""

    provider: str
    """The provider that made it (``anthropic``)."""
    item: dict[str, Any]
    """Its wire form, as received."""

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return {"provider": self.provider, "item": self.item}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NativeItem:
        """Load the stored form; :class:`CodecError` for one that is not."""
        provider, item = data.get("provider"), data.get("item")
        if not isinstance(provider, str) or not isinstance(item, dict):
            raise CodecError(f"not a native compaction item: {data!r}")
        return cls(provider=provider, item=item)


@dataclass(frozen=True, kw_only=True)
class CompactionRecord:
    """One compaction as stored.  ``text`` is what a person reads (the summary, or what
    was trimmed); ``messages`` is what the model is sent instead of the covered turns
    (none for a ``native`` one: its ``native`` item is sent instead, to its provider only).
    ``made_by_turn_id``: the turn that made it (None: made on request, between turns)."""

    compaction_id: str
    session_id: str
    through_turn_id: str
    strategy: CompactionStrategy
    text: str
    messages: tuple[Message, ...]
    tokens_before: int
    tokens_after: int
    created_at: datetime
    made_by_turn_id: str | None = None
    dropped_at: datetime | None = None
    usage: Usage | None = None
    """What making it cost (a summary's model call; None: nothing), charged to the turn
    that made it, if one did."""
    native: NativeItem | None = None
    """A ``native`` one's provider item."""

    @property
    def dropped(self) -> bool:
        """Whether it was removed (it then applies to nothing)."""
        return self.dropped_at is not None

    def to_json(self) -> dict[str, Any]:
        """The wire form (the HTTP API's, ``parley history --json``'s)."""
        return {
            "id": self.compaction_id,
            "session_id": self.session_id,
            "through_turn_id": self.through_turn_id,
            "strategy": str(self.strategy),
            "text": self.text,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "created_at": self.created_at.isoformat(),
            "made_by_turn_id": self.made_by_turn_id,
            "dropped": self.dropped,
            "usage": None if self.usage is None else self.usage.to_json(),
        }


@dataclass(frozen=True, kw_only=True)
class CompactionDraft:
    """A compaction made and not yet stored: the store gives it its id and time."""

    session_id: str
    through_turn_id: str
    strategy: CompactionStrategy
    text: str
    messages: tuple[Message, ...]
    tokens_before: int
    tokens_after: int
    usage: Usage | None = None
    made_by_turn_id: str | None = None
    native: NativeItem | None = None


def applicable(
    compactions: Iterable[CompactionRecord], path: Sequence[str]
) -> CompactionRecord | None:
    """The compaction that applies to a turn hung under ``path`` (turn ids, root first):
    of those not dropped that cover a turn of the path, the one reaching furthest along
    it, the newest among equals."""
    depth = {turn_id: i for i, turn_id in enumerate(path)}
    best: CompactionRecord | None = None
    for c in compactions:
        if c.dropped or c.through_turn_id not in depth:
            continue
        if best is None or (depth[c.through_turn_id], c.created_at) > (
            depth[best.through_turn_id],
            best.created_at,
        ):
            best = c
    return best


def messages_to_json(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The stored form of a compaction's messages."""
    return [message_to_json(m) for m in messages]


def messages_from_json(data: Sequence[dict[str, Any]]) -> tuple[Message, ...]:
    """Load the stored form; :class:`CodecError` for an entry that is no message."""
    return tuple(_message(d) for d in data)


def _message(data: dict[str, Any]) -> Message:
    try:
        role = data["role"]
        if role == "user":
            return UserMessage(text=str(data["text"]), origin=data.get("origin", "prompt"))
        if role == "assistant":
            calls = tuple(ToolCall.from_json(c) for c in data.get("tool_calls", ()))
            return AssistantMessage(text=str(data["text"]), tool_calls=calls)
        if role == "tool":
            return ToolMessage(
                call_id=str(data["call_id"]),
                name=str(data["name"]),
                content=str(data["content"]),
                is_error=bool(data.get("is_error", False)),
            )
    except (KeyError, TypeError) as exc:
        raise CodecError(f"not a stored message: {exc}") from None
    raise CodecError(f"unknown message role {data.get('role')!r}")
