"""The committed history before a turn, as the messages its requests replay: built once
per attempt (it does not change during a turn), each past turn from the engine's replay
cache where it can be."""

from __future__ import annotations

from schemas.messages import Message
from workers.engine.context import history_messages, turn_replay
from workers.engine.replay_cache import ReplayCache
from workers.ports.backend import PathTurn, Store


class TurnHistory:
    """The history path of one attempt's turn, replayed on first use."""

    def __init__(self, path: tuple[PathTurn, ...], store: Store, cache: ReplayCache) -> None:
        self._path = path
        self._store = store
        self._cache = cache
        self._messages: tuple[Message, ...] | None = None

    def messages(self) -> tuple[Message, ...]:
        """The committed history before this turn, as messages (built once per attempt)."""
        if self._messages is None:
            self._messages = history_messages(self._path, self._replay_turn)
        return self._messages

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
