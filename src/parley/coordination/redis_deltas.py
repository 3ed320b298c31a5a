"""Publishing a turn's events through Redis: ``publish`` queues them and a flusher thread
sends whatever has accumulated in one pipeline of Lua calls (append to the turn's stream,
publish the batch on its channel, report the length of its steer list), so one round trip
carries many deltas.  The flusher sends at most once per flush interval: a delta after a
quiet spell goes out at once, and the ones that follow it within the interval wait for the
next send, a turn's joining its queued token event (:meth:`RedisDeltas.coalesce`), so a
streaming turn costs Redis an event per interval rather than one per delta.  What a
driver's turns cost is counted per driver (:class:`Tally`)."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis

from parley.coordination import constants as c
from parley.coordination.redis_scripts import Scripts
from parley.schemas.events import Event, EventKind

log = logging.getLogger("parley.redis")

COALESCED_TEXT_LIMIT = 4_096
"""A queued token event takes no more deltas once its text is this long: each merge copies
the text, and a stalled Redis must not make that quadratic."""
CHECKED_TURNS_KEPT = 10_000
"""How many turns' steer-list lengths (and reads) a coordinator remembers at most."""


@dataclass
class Tally:
    """What one driver's turns cost in Redis (:meth:`RedisCoordinator.tally`): the
    pipelines that carried any of their events, those events, and the deltas that joined
    one of them instead."""

    round_trips: int = 0
    events: int = 0
    coalesced: int = 0
    turns: set[str] = field(default_factory=set)


class RedisDeltas:
    """The coordinator's event publishing (see the module docstring)."""

    redis: Any
    scripts: Scripts
    replay_seconds: int
    cluster: bool

    def _start_deltas(self, flush_seconds: float) -> None:
        """The publishing state, empty (called once, by the coordinator's constructor);
        the flusher sends at most once per ``flush_seconds``."""
        self._flush_seconds = flush_seconds
        self._pending: list[tuple[int, Event]] = []
        # Per turn, its queued token event while nothing of the turn was queued after it:
        # what the turn's next delta may join (cleared as the queue is taken to be sent).
        self._open_tokens: dict[str, Event] = {}
        # The turns whose events the send under way carries: its reply reports their
        # steer lists' lengths (RedisSteers.steers_after waits for that).
        self._in_flight: frozenset[str] = frozenset()
        self._wake = threading.Condition()
        self._sending = threading.Lock()
        self._flusher: threading.Thread | None = None
        self._closed = False
        self._closing = threading.Event()  # set with _closed: it ends the flusher's pause
        # Per turn: the length and time of the flusher's latest report of its steer list.
        self._heard: dict[str, tuple[int, float]] = {}
        self.round_trips = 0  # pipelines sent, the events they carried, and the deltas
        self.events_sent = 0  # that joined a queued token event: for logs and benchmarks
        self.deltas_coalesced = 0
        self._tallying = threading.local()  # a driver's Tally, on the driver's thread
        self._tally_of: dict[str, Tally] = {}  # by turn: its events may go out elsewhere

    def _stop_deltas(self) -> None:
        """Stop the flusher, then send what is still queued."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        self._closing.set()
        if self._flusher is not None:
            self._flusher.join(5)
        self._send_pending()

    def publish(self, events: Sequence[Event], fence: int = 0, *, now: bool = False) -> None:
        """Queue events for the flusher (returns at once), or with ``now`` send them, and
        whatever is queued before them, from the caller's thread: woken for them, the
        flusher would only make the caller's next send wait behind its own.  A driver
        passes its fence."""
        self._tally_turns(events)
        if now:
            # Only these events' turns' queued ones go with them (their order within a
            # turn is all that matters): other turns' wait for the flusher's interval.
            # (Nothing sent now sends everything queued.)
            turns = {e.turn_id for e in events} or None
            self._send_pending([(fence, e) for e in events], turns)
            return
        if not events:
            return
        with self._wake:
            self._pending.extend((fence, e) for e in events)
            for event in events:
                if event.kind is EventKind.TOKEN:
                    self._open_tokens[event.turn_id] = event
                else:
                    self._open_tokens.pop(event.turn_id, None)
            if self._flusher is None:
                self._flusher = threading.Thread(
                    target=self._flush_loop, name="parley-deltas", daemon=True
                )
                self._flusher.start()
            self._wake.notify()

    def flush(self, turn_ids: Iterable[str] | None = None) -> None:
        """Send what is queued now (of ``turn_ids`` only, if given), from the caller's
        thread."""
        self._send_pending((), None if turn_ids is None else set(turn_ids))

    @contextmanager
    def tally(self) -> Iterator[Tally]:
        """While the block runs, count what the turns this thread publishes events of
        cost in Redis, whichever thread sends those events: a driver's share of
        :attr:`round_trips`, :attr:`events_sent` and :attr:`deltas_coalesced`, which
        count the whole process's (every driver's, on a threads pool).  Flush before
        reading it."""
        tally = self._tallying.tally = Tally()
        try:
            yield tally
        finally:
            self._tallying.tally = None
            for turn_id in tally.turns:
                if self._tally_of.get(turn_id) is tally:
                    self._tally_of.pop(turn_id, None)

    def _tally_turns(self, events: Sequence[Event]) -> None:
        tally: Tally | None = getattr(self._tallying, "tally", None)
        if tally is None:
            return
        for event in events:
            if event.turn_id not in tally.turns:
                tally.turns.add(event.turn_id)
                self._tally_of[event.turn_id] = tally

    def coalesce(self, token: Event, text: str, fence: int = 0) -> Event | None:
        """Append ``text`` to ``token`` while it is queued, unsent, and nothing of its
        turn was queued after it."""
        with self._wake:
            if self._open_tokens.get(token.turn_id) is not token:
                return None
            if len(token.data["text"]) >= COALESCED_TEXT_LIMIT:
                return None
            # In place (this runs once per delta): an event still queued is in nobody
            # else's hands, and a send takes the queue under this lock before reading it.
            token.data["text"] += text
            self.deltas_coalesced += 1
            tally = self._tally_of.get(token.turn_id)
            if tally is not None:
                tally.coalesced += 1
            return token

    def _send_pending(
        self, then: Sequence[tuple[int, Event]] = (), turns: set[str] | None = None
    ) -> None:
        """Send what is queued (of ``turns`` only, if given), and ``then`` after it, from
        the caller's thread."""
        # Taking and sending under one lock keeps batches in publish order: a batch sent
        # from the caller's thread can never overtake the flusher's earlier one (the
        # stream skips a seq that arrives after a higher one).
        with self._sending:
            try:
                self._flush([*self._take(turns, then), *then])
            finally:
                self._in_flight = frozenset()

    def _take(
        self, turns: set[str] | None, then: Sequence[tuple[int, Event]] = ()
    ) -> list[tuple[int, Event]]:
        """Take the queued events (of ``turns`` only, if given) off the queue, in order,
        to send with ``then`` (under the send lock): their turns are in flight until the
        send's end."""
        with self._wake:
            if turns is None:
                taken, self._pending = self._pending, []
                self._open_tokens.clear()
            else:
                kept: list[tuple[int, Event]] = []
                taken = []
                for queued in self._pending:
                    (taken if queued[1].turn_id in turns else kept).append(queued)
                self._pending = kept
                for turn_id in turns:
                    self._open_tokens.pop(turn_id, None)
            self._in_flight = frozenset(e.turn_id for batch in (taken, then) for _f, e in batch)
            return taken

    def _reported_soon(self, turn_id: str) -> bool:
        """Whether a send will soon report the turn's steer list: an event of it is
        queued for the flusher, or in the send under way."""
        return turn_id in self._open_tokens or turn_id in self._in_flight

    def _send_queued_with(
        self,
        then: Sequence[tuple[int, Event]],
        extra: Callable[[Any], object],
        turns: Iterable[str] = (),
    ) -> tuple[list[Any], bool, float]:
        """Send ``then``, after what is queued of its turns (and of ``turns``), with the
        commands ``extra`` puts on the pipeline after theirs, in one round trip from the
        caller's thread (under the send lock, as :meth:`_send_pending`).  Returns the
        replies to ``extra``'s commands, whether the pipeline ran twice, and when it was
        sent; raises
        ``RedisError`` (the events are then lost to the buffer, as any failed send's)."""
        with self._sending:
            try:
                batch = [*self._take({*turns, *(e.turn_id for _fence, e in then)}, then), *then]
                appended: list[str] = []  # the turn of each append call, in order

                def send(pipe: Any) -> None:
                    appended[:] = self._queue_appends(pipe, batch)
                    extra(pipe)

                at = time.monotonic()
                replies, twice = self.pipeline(send)
                self._sent(batch, appended, replies[: len(appended)], at)
                return replies[len(appended) :], twice, at
            finally:
                self._in_flight = frozenset()

    def _flush_loop(self) -> None:
        sent_at = -math.inf
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
            # A wait on its own event, not on the condition: every delta published
            # meanwhile would wake it.  Closing sets it.
            self._closing.wait(max(0.0, sent_at + self._flush_seconds - time.monotonic()))
            sent_at = time.monotonic()
            try:
                self._send_pending()
            except Exception:  # the one flusher of the process: it must go on
                log.exception("could not send queued events; readers fall back to the store")

    def pipeline(self, queue: Callable[[Any], object]) -> tuple[list[Any], bool]:
        """Run the commands ``queue`` puts on a pipeline in one round trip; returns their
        replies and whether it took two.  If the server lacks the scripts they call (new,
        or restarted), load them and run the pipeline once more: every script here can
        run twice, and the caller hears that the other commands ran twice too."""
        try:
            pipe = self.redis.pipeline(transaction=False)
            queue(pipe)
            return list(pipe.execute()), False
        except redis.exceptions.NoScriptError:
            self.scripts.load()
        pipe = self.redis.pipeline(transaction=False)
        queue(pipe)
        return list(pipe.execute()), True

    def _flush(self, events: list[tuple[int, Event]]) -> None:
        if not events:
            return
        turns: list[str] = []

        def append(pipe: Any) -> None:
            turns[:] = self._queue_appends(pipe, events)

        at = time.monotonic()
        try:
            lengths, _ = self.pipeline(append)
        except redis.RedisError:
            log.warning(
                "could not publish %d event(s); readers fall back to the store", len(events)
            )
            return
        self._sent(events, turns, lengths, at)

    def _queue_appends(self, pipe: Any, events: list[tuple[int, Event]]) -> list[str]:
        """Queue on ``pipe`` one append-and-publish call per run of a turn's events with
        the same fence (one per turn, as a rule); returns the turn of each call, in order.
        A turn's calls keep its events' order: a later event sent first would make the
        stream skip an earlier one as a re-send."""
        runs: list[tuple[str, int, list[Event]]] = []
        latest: dict[str, int] = {}  # each turn's latest run
        for fence, event in events:
            at = latest.get(event.turn_id)
            if at is not None and runs[at][1] == fence:
                runs[at][2].append(event)
            else:
                latest[event.turn_id] = len(runs)
                runs.append((event.turn_id, fence, [event]))
        for turn_id, fence, batch in runs:
            ends = [e.seq for e in batch if e.kind is EventKind.END]
            args: list[Any] = [
                ends[-1] if ends else 0,
                self.replay_seconds,
                fence,
                c.IDLE_BUFFER_SECONDS,
                c.ENDS_STREAM_SECONDS,
                1 if self.cluster else 0,
            ]
            for event in batch:
                args += [event.seq, json.dumps(event.to_json(), separators=(",", ":"))]
            keys = [
                c.events_key(turn_id),
                c.deltas_channel(turn_id),
                c.steers_key(turn_id),
                c.owner_key(turn_id),
                c.ends_key(turn_id),
                c.ended_channel(turn_id),
            ]
            self.scripts.queue(pipe, self.scripts.append, keys, args)
        return [turn_id for turn_id, _fence, _batch in runs]

    def _sent(
        self, events: list[tuple[int, Event]], turns: list[str], lengths: list[Any], at: float
    ) -> None:
        """Count a pipeline sent at ``at`` that carried ``events``, and note what it said
        of each turn's steer list: a reply is as good as asking, so the next
        :meth:`steers_after` within the recheck period needs no round trip unless the
        list grew."""
        self.round_trips += 1
        self.events_sent += len(events)
        if self._tally_of:
            tallies = [self._tally_of.get(event.turn_id) for _fence, event in events]
            for tally in tallies:
                if tally is not None:
                    tally.events += 1
            for tally in {id(t): t for t in tallies if t is not None}.values():
                tally.round_trips += 1
        if len(self._heard) > CHECKED_TURNS_KEPT:
            self._heard.clear()  # only a rate limit: forgetting is harmless
        for turn_id, length in zip(turns, lengths, strict=True):
            self._heard[turn_id] = (int(length), at)
