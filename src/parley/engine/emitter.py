"""Allocates a turn's gap-free event ``seq`` and publishes events.

One driver owns a turn at a time, so it is the only writer of its seq.  Tokens are only
published; durable events are also collected until the next commit stores them with the
seq they were published under.  A delta that arrives while the previous token event of
its step is still waiting to be sent joins that event instead of taking a new seq, so a
burst of deltas costs a few events while a slow stream still sends each delta at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from parley.engine.holding import ensure_holding
from parley.ports.admission import ProviderReport
from parley.ports.backend import Coordinator
from parley.ports.host import StreamAborted
from parley.schemas.events import Event, EventKind, EventPayload, StepRestarted, Token
from parley.schemas.records import Steer
from parley.telemetry import metrics


class Emitter:
    """The event writer of one turn attempt."""

    def __init__(
        self, turn_id: str, next_seq: int, coordinator: Coordinator, fence: int = 0
    ) -> None:
        self.turn_id = turn_id
        self._next = next_seq
        self._coordinator = coordinator
        self._fence = fence
        self._unstored: list[Event] = []
        self._last_token: Event | None = None
        self._token_step = -1  # the step of the last token event
        # Made as its turn is claimed: the first token's latency and the turn's duration
        # count from here.
        self._claimed_at = time.monotonic()
        self._first_token = True

    def allocate(self, payload: EventPayload) -> Event:
        """Number an event without publishing it (for events published after a commit)."""
        event = Event.of(self.turn_id, self._next, payload)
        self._next += 1
        return event

    def skip(self) -> int:
        """Take the next seq for an event another writer builds (a turn's ``end``, which
        the store composes in the final transaction); returns it."""
        self._next += 1
        return self._next - 1

    def emit(self, payload: EventPayload, *, now: bool = False) -> Event:
        """Number and publish an event (sent before returning with ``now``); durable ones
        wait for the next commit to be stored."""
        event = self.allocate(payload)
        self._coordinator.publish([event], self._fence, now=now)
        if event.kind.durable:
            self._unstored.append(event)
        return event

    def emit_delta(self, step: int, text: str, *, now: bool = False) -> None:
        """Publish a step's delta: appended to the step's last token event while that one
        is unsent and nothing came after it, else as a new ``token`` event (sent before
        returning with ``now``)."""
        if self._first_token:
            metrics.first_token(time.monotonic() - self._claimed_at)
            self._first_token = False
        last = self._last_token
        if not now and last is not None and last.seq == self._next - 1 and self._token_step == step:
            merged = self._coordinator.coalesce(last, text, self._fence)
            if merged is not None:
                self._last_token = merged
                return
        self._last_token = self.emit(Token(step=step, text=text), now=now)
        self._token_step = step

    def publish(self, event: Event, *, now: bool = False) -> None:
        """Publish an event allocated earlier (after its commit)."""
        if event.kind is EventKind.END:
            # Counted first: whoever sees the end can see it counted.
            metrics.turn_ended(str(event.data["outcome"]), time.monotonic() - self._claimed_at)
        self._coordinator.publish([event], self._fence, now=now)

    def publish_listing_steers(self, events: list[Event], cursor: int) -> list[Steer]:
        """Publish events allocated earlier now, and read the turn's steers past
        ``cursor`` in the same round trip."""
        return self._coordinator.publish_listing_steers(events, self._fence, self.turn_id, cursor)

    def take_unstored(self) -> list[Event]:
        """The durable events published since the last commit; the caller stores them."""
        events, self._unstored = self._unstored, []
        return events

    @property
    def next_seq(self) -> int:
        """The seq the next event will get."""
        return self._next


class StreamingSink:
    """Publishes each delta as a ``token`` event (deltas that arrive while the previous
    one is still queued join it); aborts the stream on an interrupt, and stops a driver
    that lost its session lock from streaming any further."""

    def __init__(
        self,
        emitter: Emitter,
        index: int,
        holding: Callable[[], bool],
        interrupt_pending: Callable[[], bool],
    ) -> None:
        self._emitter = emitter
        self._index = index
        self._holding = holding
        self._interrupt_pending = interrupt_pending
        self.parts: list[str] = []
        self.on_report: Callable[[ProviderReport], None] | None = None
        """Where the provider's report of the call under way goes (its admission)."""

    def __call__(self, text: str) -> None:
        self.raise_if_interrupted()
        if text:
            # The first token is what a reader waits for: it is sent from this thread
            # now rather than when the flusher next gets the interpreter (the model may
            # be producing the rest faster than the flusher is scheduled).
            self._emitter.emit_delta(self._index, text, now=not self.parts)
            self.parts.append(text)

    def raise_if_interrupted(self) -> None:
        """Raise :class:`StreamAborted` on a listed interrupt (and Fenced once the lock
        is gone)."""
        ensure_holding(self._holding, "while the model streamed")
        if self._interrupt_pending():
            raise StreamAborted

    def provider_report(self, report: ProviderReport) -> None:
        if self.on_report is not None:
            self.on_report(report)

    def restart(self, reason: str) -> None:
        ensure_holding(self._holding, "while the model restarted its stream")
        self.retract(reason)
        self.raise_if_interrupted()

    def retract(self, reason: str) -> None:
        """Tell readers to drop what the step streamed so far: it will not commit."""
        if self.parts:
            # Only text readers have seen needs retracting; a retry before the first
            # delta is invisible to them.
            self._emitter.emit(StepRestarted(step=self._index, reason=reason))
        self.parts = []

    def settle(self, text: str) -> None:
        """Make the step's tokens concatenate to exactly ``text``, its committed text,
        whatever the model streamed: complete a prefix, or restart the step's stream if
        it diverged."""
        streamed = self.text
        if streamed != text:
            if text.startswith(streamed):
                self._emitter.emit_delta(self._index, text[len(streamed) :])
            else:
                self._emitter.emit(StepRestarted(step=self._index, reason="diverged"))
                if text:
                    self._emitter.emit_delta(self._index, text)
        self.parts = [text] if text else []

    @property
    def text(self) -> str:
        return "".join(self.parts)
