"""The committed history before a turn, as the messages its requests replay: built once
per attempt (it does not change during a turn), each past turn from the engine's replay
cache where it can be, and the turns a compaction covers as the compaction's messages
(docs/compaction.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from parley.engine.context import check_replay, history_messages, turn_replay
from parley.engine.replay_cache import ReplayCache
from parley.ports.backend import ClaimedTurn, PathTurn, Store
from parley.schemas.compactions import CompactionRecord, NativeItem
from parley.schemas.messages import Message
from parley.schemas.records import TurnRecord


def whole_path(
    claimed: ClaimedTurn, read: Callable[[str | None], Sequence[TurnRecord]]
) -> tuple[TurnRecord, ...]:
    """The claimed turn's whole history path, root first, as the hooks are shown it: the
    claim's when no compaction applies, else ``read`` from the store (the claim read only
    the turns after the compaction)."""
    if claimed.compaction is None:
        return tuple(p.turn for p in claimed.history)
    return tuple(read(claimed.turn.parent_id))


def usable_history(
    claimed: ClaimedTurn, store: Store, native_of: str
) -> tuple[tuple[PathTurn, ...], CompactionRecord | None]:
    """The claimed history for a model that reads the native items of ``native_of``
    (``""``: none): the claim's, unless the compaction that applies is another
    provider's native one, which that model cannot read; then the path is read again
    past it (the turns it covered are sent instead, or an older compaction's form)."""
    compaction = claimed.compaction
    if compaction is None or compaction.native is None or compaction.native.provider == native_of:
        return claimed.history, compaction
    usable, path = store.compacted_path(claimed.turn.parent_id, native_of)
    # Not loaded with the claim: the history replays them from the store.
    return tuple(PathTurn(turn=t, steps=None) for t in path), usable


class TurnHistory:
    """The history path of one attempt's turn, replayed on first use: ``path``, the
    turns after ``compaction`` when one applies (its messages stand in for the rest)."""

    def __init__(
        self,
        path: tuple[PathTurn, ...],
        store: Store,
        cache: ReplayCache,
        compaction: CompactionRecord | None = None,
    ) -> None:
        self._path = path
        self._compaction = compaction
        self._store = store
        self._cache = cache
        self._messages: tuple[Message, ...] | None = None

    def messages(self) -> tuple[Message, ...]:
        """The committed history before this turn, as messages (built once per attempt)."""
        if self._messages is None:
            compaction = self._compaction
            if compaction is None:
                self._messages = history_messages(self._path, self._replay_turn)
            else:
                # Checked like the rest: a compaction never hands the model an open round.
                head = check_replay(compaction.messages)
                self._messages = head + history_messages(self._path, self._replay_turn)
        return self._messages

    @property
    def path(self) -> tuple[PathTurn, ...]:
        """The turns it replays (those after its compaction, if one applies)."""
        return self._path

    @property
    def native(self) -> NativeItem | None:
        """The native item the requests start with (the compaction's, if native)."""
        return None if self._compaction is None else self._compaction.native

    @property
    def compaction(self) -> CompactionRecord | None:
        """The compaction the history starts with (None: the whole path is replayed)."""
        return self._compaction

    def _replay_turn(self, node: PathTurn) -> tuple[Message, ...]:
        """One history turn as checked messages, from the replay cache where it can."""
        cache = self._cache
        turn = node.turn
        replay = cache.get(turn.turn_id) if node.steps is None else None
        if replay is None:
            # Not loaded with the claim (cached then) or evicted since: load it now.
            steps = node.steps if node.steps is not None else self._store.steps_of(turn.turn_id)
            replay = turn_replay(turn.prompt, steps)
            cache.put(turn.turn_id, turn.status, replay)
        return replay
