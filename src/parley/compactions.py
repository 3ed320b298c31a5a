"""Compacting a session on request (docs/compaction.md): the history path's older turns
made into what the model sees instead of them, stored as one record between turns.

The turns through ``keep_turns`` before the head are covered; the compaction that
applied to them already (if any) is where it starts, so compactions chain.  Nothing of
the tree changes: dropping the record gives the model the turns again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parley.engine.compaction import (
    compact_natively,
    message_tokens,
    native_compactor,
    summarize,
    trim,
)
from parley.engine.context import turn_replay
from parley.engine.token_counts import counter_for
from parley.errors import Conflict, InvalidRequest
from parley.ports.budget import estimate_tokens
from parley.ports.host import native_provider_of
from parley.schemas.compactions import (
    CompactionDraft,
    CompactionRecord,
    CompactionStrategy,
    NativeItem,
    applicable,
)
from parley.schemas.messages import Message, Prefix
from parley.schemas.records import TurnRecord, Usage

if TYPE_CHECKING:
    from parley.client_runtime import Runtime

ON_REQUEST = (CompactionStrategy.TRIM, CompactionStrategy.SUMMARIZE, CompactionStrategy.NATIVE)


def check_request(strategy: object, keep_turns: object, keep: object) -> CompactionStrategy:
    """The strategy asked for, or :class:`InvalidRequest` for any bad argument."""
    for name, value in (("keep_turns", keep_turns), ("keep", keep)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRequest(f"{name} must be an integer, 0 or more")
    if not isinstance(strategy, str) or strategy not in ON_REQUEST:
        raise InvalidRequest("strategy must be 'trim', 'summarize' or 'native'")
    return CompactionStrategy(strategy)


def compact(
    runtime: Runtime,
    session_id: str,
    *,
    strategy: CompactionStrategy,
    keep_turns: int,
    keep: int,
) -> CompactionRecord:
    """Compact the session's path but its newest ``keep_turns`` turns, now, and announce
    it (see the module docstring).  :class:`Conflict` if there is nothing to cover or a
    turn of the session is unfinished."""
    store = runtime.store
    host = runtime.host
    if strategy is not CompactionStrategy.TRIM and host is None:
        raise InvalidRequest(f"strategy {str(strategy)!r} needs a client with a host (its model)")
    if strategy is CompactionStrategy.NATIVE and host is not None:
        native_compactor(host.model)  # refused before anything is read
    path = store.history(session_id)
    if len(path) <= keep_turns:
        raise Conflict(
            f"nothing to compact: the history has {len(path)} turns and {keep_turns} are kept"
        )
    covered = path[: len(path) - keep_turns]
    # A native one starts from an earlier native one of its own provider; the others
    # from the turns such a one covered (they cannot hold its opaque item).
    native_of = native_provider_of(host.model) if host is not None else ""
    if strategy is not CompactionStrategy.NATIVE:
        native_of = ""
    known, start, messages = _covered_messages(runtime, session_id, covered, native_of)
    if start is not None and start.through_turn_id == covered[-1].turn_id:
        # It would be made of that one alone: a copy of what the model sees already (a
        # trim's, of the messages; a summary's, another model call), for nothing.
        raise Conflict(
            f"nothing to compact: compaction {start.compaction_id} covers the same turns "
            f"(through {start.through_turn_id}); drop it to compact them another way"
        )
    earlier = None if start is None else start.native
    # Counted as the host's model counts (a trim made without a host: the estimate).
    counter = counter_for(host.model.name) if host is not None else estimate_tokens
    usage: Usage | None = None
    native: NativeItem | None = None
    if strategy is CompactionStrategy.TRIM:
        made, replaced = trim(messages, keep=keep)
        text = f"trimmed {replaced} tool results and call arguments of {len(covered)} turns"
    elif strategy is CompactionStrategy.SUMMARIZE:
        assert host is not None
        made, text, usage = summarize(host.model, messages)
    else:
        assert host is not None
        prefix = store.frozen_prefix(session_id) or Prefix(
            system_prompt=host.system_prompt, tools=()
        )
        native, text, usage = compact_natively(host.model, prefix, messages, earlier=earlier)
        made = ()
    draft = CompactionDraft(
        session_id=session_id,
        through_turn_id=covered[-1].turn_id,
        strategy=strategy,
        text=text,
        messages=made,
        tokens_before=message_tokens(messages, counter),
        tokens_after=counter(text) if native is not None else message_tokens(made, counter),
        usage=usage,
        native=native,
    )
    record, event = store.add_compaction(draft, head=path[-1].turn_id, known=known)
    runtime.coordinator.publish([event], now=True)
    return record


def _covered_messages(
    runtime: Runtime, session_id: str, covered: list[TurnRecord], native_of: str
) -> tuple[int, CompactionRecord | None, tuple[Message, ...]]:
    """How many compactions the session has (the new one is stored only while it still
    has as many); the one that applies to ``covered`` now, of those a model reading the
    native items of ``native_of`` can use (its native item, or its messages, start what
    the model sees); and what the model sees of ``covered``: those messages, then the
    turns after it, replayed (and checked) as a turn's history is."""
    store = runtime.store
    ids = [t.turn_id for t in covered]
    listed = store.compactions(session_id)
    usable = [c for c in listed if c.native is None or c.native.provider == native_of]
    earlier = applicable(usable, ids)
    start = 0 if earlier is None else ids.index(earlier.through_turn_id) + 1
    messages: list[Message] = list(earlier.messages) if earlier is not None else []
    for turn in covered[start:]:
        messages.extend(turn_replay(turn.prompt, store.steps_of(turn.turn_id)))
    return len(listed), earlier, tuple(messages)
