"""The context budget: fit a request under a token limit without losing anything stored.

When the prefix plus the replayed history plus this turn would exceed the limit, the
oldest tool results are elided first (each replaced by a one-line marker, so the tool
round stays complete and the model sees that something was there), then the oldest whole
turns of the history (replaced by one marker message).  The current turn is never
dropped, and the results the model is about to answer are never elided.  Nothing is
removed from the store: the budget shapes one request only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

from parley.schemas.errors import InvalidRequest
from parley.schemas.messages import AssistantMessage, Message, Prefix, ToolMessage, UserMessage

log = logging.getLogger(__name__)

TokenCounter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """About four characters per token: the default, since tokenizer packages that fetch
    their data at first use fail on machines without internet."""
    return (len(text) + 3) // 4


def elided_result_marker(characters: int) -> str:
    """What the model sees in place of an elided tool result."""
    return f"[parley elided this tool result ({characters} characters) to fit the context budget]"


def elided_turns_marker(turns: int) -> str:
    """What the model sees in place of the oldest turns."""
    return (
        f"[parley elided the {turns} oldest turn{'s' if turns != 1 else ''} "
        "of this conversation to fit the context budget]"
    )


@dataclass(frozen=True, kw_only=True)
class ContextBudget:
    """A token limit for each request.  ``counter`` counts the tokens of a text (the
    host's tokenizer; characters/4 by default)."""

    max_tokens: int
    counter: TokenCounter = estimate_tokens
    _count: Callable[[Message], int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise InvalidRequest("ContextBudget.max_tokens must be an integer")
        if self.max_tokens < 1:
            raise InvalidRequest("ContextBudget.max_tokens must be positive")
        if not callable(self.counter):
            raise InvalidRequest("ContextBudget.counter must be a function of a text")
        # Messages are immutable and repeat in every request of a session: count each once.
        object.__setattr__(self, "_count", lru_cache(maxsize=65536)(self._count_message))

    def fit(
        self, prefix: Prefix, past: Sequence[Message], current: Sequence[Message]
    ) -> tuple[Message, ...]:
        """The messages of one request, within the limit where that is possible.

        ``past`` is the replayed history (whole turns, each starting with its prompt);
        ``current`` is this turn so far.  Both are already checked complete rounds."""
        fixed = self._prefix_tokens(prefix)
        messages = [*past, *current]
        costs = [self._count(m) for m in messages]
        total = fixed + sum(costs)
        if total <= self.max_tokens:
            return tuple(messages)
        total = self._elide_tool_results(messages, costs, total)
        if total > self.max_tokens:
            messages, total = self._drop_oldest_turns(messages, costs, total, len(past))
        if total > self.max_tokens:
            log.warning(
                "context still %d tokens over its budget of %d after eliding everything "
                "but the current turn",
                total - self.max_tokens,
                self.max_tokens,
            )
        return tuple(messages)

    def tokens(self, prefix: Prefix, messages: Sequence[Message]) -> int:
        """What a request costs by this budget's counter."""
        return self._prefix_tokens(prefix) + sum(self._count(m) for m in messages)

    # ------------------------------------------------------------------ phases

    def _elide_tool_results(self, messages: list[Message], costs: list[int], total: int) -> int:
        """Replace tool results oldest first, sparing the ones after the last assistant
        message: the model is about to answer them."""
        last_assistant = max(
            (i for i, m in enumerate(messages) if isinstance(m, AssistantMessage)), default=-1
        )
        for position in range(last_assistant):
            if total <= self.max_tokens:
                break
            message = messages[position]
            if not isinstance(message, ToolMessage):
                continue
            elided = replace(message, content=elided_result_marker(len(message.content)))
            cost = self._count(elided)
            if cost >= costs[position]:
                continue  # already shorter than its marker
            messages[position] = elided
            total += cost - costs[position]
            costs[position] = cost
        return total

    def _drop_oldest_turns(
        self, messages: list[Message], costs: list[int], total: int, past_length: int
    ) -> tuple[list[Message], int]:
        """Drop whole turns of the history, oldest first.  The first turn kept carries a
        marker ahead of its prompt, so no extra message breaks the user/assistant rhythm
        providers expect."""
        starts = [i for i in range(past_length) if _is_prompt(messages[i])]
        if not starts:
            return messages, total
        dropped = 0
        for dropped, cut in enumerate([*starts[1:], past_length], start=1):
            total -= sum(costs[starts[dropped - 1] : cut])
            if total + self._marker_cost(messages, cut, dropped) <= self.max_tokens:
                break
        if dropped == 0:
            return messages, total
        cut = starts[dropped] if dropped < len(starts) else past_length
        kept = messages[cut:]
        marker = elided_turns_marker(dropped)
        if kept and _is_prompt(kept[0]):
            first = kept[0]
            assert isinstance(first, UserMessage)
            kept[0] = replace(first, text=f"{marker}\n\n{first.text}")
            total += self._count(kept[0]) - costs[cut]
        return kept, total

    def _marker_cost(self, messages: list[Message], cut: int, dropped: int) -> int:
        """What prefixing the marker to the prompt at ``cut`` adds."""
        if cut >= len(messages) or not _is_prompt(messages[cut]):
            return 0
        return self.counter(elided_turns_marker(dropped) + "\n\n")

    # ------------------------------------------------------------------ counting

    def _prefix_tokens(self, prefix: Prefix) -> int:
        return _prefix_cost(prefix.canonical_bytes(), self.counter)

    def _count_message(self, message: Message) -> int:
        if isinstance(message, UserMessage):
            return self.counter(message.text)
        if isinstance(message, AssistantMessage):
            calls = "".join(c.name + c.arguments for c in message.tool_calls)
            return self.counter(message.text + calls)
        return self.counter(message.name + message.content)


def _is_prompt(message: Message) -> bool:
    return isinstance(message, UserMessage) and message.origin == "prompt"


@lru_cache(maxsize=64)
def _prefix_cost(canonical: bytes, counter: TokenCounter) -> int:
    # The prefix is frozen per session: its cost is computed once per process.
    data = json.loads(canonical)
    return counter(data["system_prompt"] + json.dumps(data["tools"], sort_keys=True))
