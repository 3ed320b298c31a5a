"""A base for models whose provider cannot stream: the whole answer arrives at once and is
published as a single delta, so the engine sees the same protocol as from a streaming
model (the step's tokens still concatenate to its committed text)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

from parley.ports.host import DeltaSink, ModelReply, ModelRequest
from parley.schemas.messages import ToolCall, request_size
from parley.schemas.records import Usage


class CompletionModel(ABC):
    """Subclass and implement :meth:`complete`; :meth:`stream` emits the finished text as
    one delta.  Set ``name`` in the subclass (or pass it to ``__init__``)."""

    def __init__(self, *, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        """The label stored with each step."""
        return self._name

    @abstractmethod
    def complete(self, request: ModelRequest) -> ModelReply:
        """Answer ``request`` in one piece."""

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        """Answer with :meth:`complete`, then publish its text as a single delta (an
        interrupt raised by ``on_delta`` propagates)."""
        reply = self.complete(request)
        if reply.text:
            on_delta(reply.text)
        if not reply.model:
            reply = ModelReply(
                text=reply.text, tool_calls=reply.tool_calls, usage=reply.usage, model=self._name
            )
        return reply


def estimate_usage(request: ModelRequest, text: str, calls: tuple[ToolCall, ...]) -> Usage:
    """Characters / 4, the usual rough token count: used when a provider reports no usage,
    so that budgets and token ceilings still bound the turn instead of seeing zero."""
    request_chars = request_size(request.prefix, request.messages)
    output_chars = len(text) + sum(len(c.name) + len(c.arguments) for c in calls)
    return Usage(
        input_tokens=math.ceil(request_chars / 4), output_tokens=math.ceil(output_chars / 4)
    )
