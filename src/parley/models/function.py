"""A model backed by a Python function: for tests and for hosts that wrap their own client."""

from __future__ import annotations

from collections.abc import Callable

from parley.ports.host import DeltaSink, ModelReply, ModelRequest


class FunctionModel:
    """Calls ``function(request)`` for each step.  It returns a :class:`ModelReply` or plain
    text; the text is streamed in ``chunk_chars`` pieces (one piece if None)."""

    def __init__(
        self,
        function: Callable[[ModelRequest], ModelReply | str],
        *,
        name: str = "function",
        chunk_chars: int | None = None,
    ) -> None:
        self._function = function
        self._name = name
        self._chunk = chunk_chars

    @property
    def name(self) -> str:
        """The label stored with each step."""
        return self._name

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        """Call the function, then stream its text."""
        reply = self._function(request)
        if isinstance(reply, str):
            reply = ModelReply(text=reply, model=self._name)
        size = self._chunk or max(len(reply.text), 1)
        for start in range(0, len(reply.text), size):
            on_delta(reply.text[start : start + size])
        return reply
