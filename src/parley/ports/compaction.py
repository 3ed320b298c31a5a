"""When a host compacts a session by itself (docs/compaction.md#when): before a turn's
first model call, once the request would pass ``threshold`` of the model's context
window; and the windows of the models parley knows, in one table."""

from __future__ import annotations

from dataclasses import dataclass

from parley.schemas.compactions import CompactionStrategy
from parley.schemas.errors import InvalidRequest

CONTEXT_WINDOWS: dict[str, int] = {
    "openai:gpt-4o": 128_000,
    "openai:gpt-4o-mini": 128_000,
    "openai:gpt-4.1": 1_047_576,
    "openai:gpt-4.1-mini": 1_047_576,
    "openai:gpt-4.1-nano": 1_047_576,
    "openai:o3": 200_000,
    "openai:o4-mini": 200_000,
    "openai:gpt-5": 400_000,
    "openai:gpt-5-mini": 400_000,
    "anthropic:claude-sonnet-4-5": 200_000,
    "anthropic:claude-opus-4-1": 200_000,
    "anthropic:claude-haiku-4-5": 200_000,
}
"""Context windows in tokens by model name (``provider:model``), as the providers
publish them; a model not here needs ``Compaction(window=…)``."""


def window_of(model_name: str) -> int | None:
    """The context window of ``model_name`` (a fallover chain's: its smallest member's),
    None if one of them is not known."""
    windows = [CONTEXT_WINDOWS.get(name.strip()) for name in model_name.split(",")]
    if not windows or any(w is None for w in windows):
        return None
    return min(w for w in windows if w is not None)


@dataclass(frozen=True, kw_only=True)
class Compaction:
    """A host's compaction: ``strategy`` (``summarize``, ``trim``, or ``native`` for a
    model whose provider compacts itself) once a turn's first
    request would pass ``threshold`` of the model's context window (``window`` tokens,
    else the model's known size); the newest ``keep_turns`` turns stay whole, and
    ``trim`` keeps the newest ``keep`` tool rounds of what it covers whole too."""

    strategy: str = "summarize"
    threshold: float = 0.8
    keep_turns: int = 4
    keep: int = 2
    window: int | None = None

    def __post_init__(self) -> None:
        if self.strategy not in tuple(CompactionStrategy):
            raise InvalidRequest("Compaction.strategy must be 'summarize', 'trim' or 'native'")
        threshold = self.threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise InvalidRequest("Compaction.threshold must be a number")
        if not 0 < threshold <= 1:
            raise InvalidRequest("Compaction.threshold must be more than 0 and at most 1")
        for name in ("keep_turns", "keep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidRequest(f"Compaction.{name} must be an integer, 0 or more")
        window = self.window
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, int) or window < 1
        ):
            raise InvalidRequest("Compaction.window must be a positive number of tokens")

    def limit(self, model_name: str) -> int | None:
        """The request size past which a turn compacts first (None: the window is not
        known)."""
        window = self.window or window_of(model_name)
        return None if window is None else int(window * self.threshold)
