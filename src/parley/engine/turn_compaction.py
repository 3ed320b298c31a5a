"""A turn compacts its session before its first model call (docs/compaction.md#when):
when the host asks for it and the first request would pass the host's share of the
model's context window, the history but its newest turns becomes a compaction, stored
whole under the attempt's fence with its ``compacted`` event and its cost, and the turn's
requests start from it.

A crash before that commit leaves nothing (the next attempt decides again); one after it
leaves the whole record, which the next attempt's claim reads as the compaction that
applies, so it is not made twice.
"""

from __future__ import annotations

import dataclasses
import logging

from parley.engine.attempt import Attempt
from parley.engine.compaction import compact_natively, message_tokens, summarize, trim
from parley.engine.replay_cache import ReplayCache
from parley.engine.token_counts import counter_for
from parley.engine.turn_history import TurnHistory
from parley.engine.turn_state import TurnState
from parley.engine.turn_step import StepParts
from parley.ports.backend import PathTurn, Store
from parley.ports.budget import TokenCounter, estimate_tokens
from parley.schemas.compactions import (
    CompactionDraft,
    CompactionRecord,
    CompactionStrategy,
    NativeItem,
)
from parley.schemas.errors import Conflict
from parley.schemas.messages import Message, Prefix, UserMessage
from parley.schemas.records import Usage

log = logging.getLogger("parley.engine")


def request_tokens(
    prefix: Prefix, messages: tuple[Message, ...], counter: TokenCounter = estimate_tokens
) -> int:
    """A request's size by ``counter``: its prefix and its messages."""
    return counter(prefix.canonical_bytes().decode()) + message_tokens(messages, counter)


def compact_first(
    attempt: Attempt,
    parts: StepParts,
    state: TurnState,
    prefix: Prefix,
    reads: tuple[Store, ReplayCache],
) -> StepParts:
    """``parts`` with the history the turn's requests start from: compacted first if the
    host's compaction asks for it now (see the module docstring), else as they are."""
    policy = attempt.host.compaction
    if policy is None or state.steps:
        return parts  # not asked for, or the turn's first model call was made already
    claimed = attempt.claimed
    limit = policy.limit(attempt.host.model.name)
    counter = counter_for(attempt.host.model.name)
    history = parts.history
    current = history.compaction
    first = (*history.messages(), UserMessage(text=claimed.turn.prompt))
    size = request_tokens(prefix, first, counter)
    if history.native is not None and current is not None:
        size += current.tokens_after  # the native item, as counted when it was made
    if limit is None or size <= limit:
        return parts
    store, cache = reads
    strategy = CompactionStrategy(policy.strategy)
    path = history.path
    if current is not None and current.native is not None and strategy is not NATIVE:
        # A trim or a summary cannot hold a native item: it covers what that one did.
        current, turns = store.compacted_path(claimed.turn.parent_id, "")
        path = tuple(PathTurn(turn=t, steps=None) for t in turns)
    # The turns after the compaction that applies (all when none does): its newest
    # ``keep_turns`` stay whole, the ones before them join what it covers.
    covered = len(path) - policy.keep_turns
    if covered <= 0:
        return parts  # nothing more to cover than what is covered already
    messages = TurnHistory(path[:covered], store, cache, current).messages()
    earlier = None if current is None else current.native
    made = _made(attempt, strategy, messages, prefix, earlier, keep=policy.keep)
    if made is None:
        return parts
    standing, text, usage, native = made
    record = _stored(
        attempt,
        CompactionDraft(
            session_id=claimed.session.session_id,
            through_turn_id=path[covered - 1].turn.turn_id,
            strategy=strategy,
            text=text,
            messages=standing,
            tokens_before=message_tokens(messages, counter),
            tokens_after=counter(text) if native else message_tokens(standing, counter),
            usage=usage,
            made_by_turn_id=claimed.turn.turn_id,
            native=native,
        ),
    )
    if usage is not None:
        # Its cost is the turn's: the turn's token budget and the session's count it.
        state.usage = state.usage + usage
        state.session_tokens += usage.total
    return dataclasses.replace(parts, history=TurnHistory(path[covered:], store, cache, record))


NATIVE = CompactionStrategy.NATIVE

Made = tuple[tuple[Message, ...], str, Usage | None, NativeItem | None]
"""What a strategy made: the messages, the text, the cost, a native item."""


def _made(
    attempt: Attempt,
    strategy: CompactionStrategy,
    messages: tuple[Message, ...],
    prefix: Prefix,
    earlier: NativeItem | None,
    *,
    keep: int,
) -> Made | None:
    """What ``strategy`` makes of ``messages`` (after ``earlier``, a native item they
    start from): None for an empty summary or native block (nothing to stand in for the
    turns: the turn goes on with them whole; a model error, though, fails the turn as
    any model call's does)."""
    if strategy is CompactionStrategy.TRIM:
        trimmed, replaced = trim(messages, keep=keep)
        return trimmed, f"trimmed {replaced} tool results and call arguments", None, None
    try:
        if strategy is NATIVE:
            model = attempt.host.model
            item, text, usage = compact_natively(
                model, prefix, messages, earlier=earlier, context=attempt.context
            )
            return (), text, usage, item
        standing, text, usage = summarize(attempt.host.model, messages, attempt.context)
        return standing, text, usage, None
    except Conflict:
        log.warning("turn %s: the model's compaction was empty", attempt.turn.turn_id)
        return None


def _stored(attempt: Attempt, draft: CompactionDraft) -> CompactionRecord:
    """Commit ``draft`` (with the events the attempt published and has not stored yet)
    and publish its ``compacted`` event."""
    emitter = attempt.emitter
    events = emitter.take_unstored()
    record, event = attempt.store.compact(draft=draft, seq=emitter.skip(), events=events)
    emitter.publish(event, now=True)
    return record
