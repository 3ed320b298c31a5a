"""What every protocol view of a turn shares (docs/protocols.md): a
*projection* is a small stateful object fed one turn's parley events in seq order that
answers, for each, the protocol's own events (each of ``projections/`` is one, on the walk
of ``projections/base.py``); the route only wires one to the process's shared feed
(``Feeds.subscribe``).  It never runs anything: one log, several views.

A projection sees every event of the turn from its start (tokens while the replay buffer
has them, every durable event after that), and a turn that is resumed after an ``end``
goes on in the same feed, so the terminal answer is given by :meth:`Projection.close`,
once the feed is over, from the last ``end`` seen.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from sse_starlette import EventSourceResponse, ServerSentEvent

from parley.client import Client
from parley.gateway.feeds import Feeds, FellBehind
from parley.gateway.settings import GatewaySettings
from parley.gateway.work import light
from parley.schemas.events import Event, EventKind

log = logging.getLogger("parley.gateway")

Frame = TypeVar("Frame")


class Projection(Protocol):
    """A view of one turn in some protocol's events (each a JSON object)."""

    def opening(self) -> list[dict[str, Any]]:
        """What the protocol sends before any of the turn's events."""
        ...

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """The protocol's events for the turn's next event."""
        ...

    def close(self, cut: str | None = None) -> list[dict[str, Any]]:
        """The protocol's closing events once the turn's feed is over; ``cut`` says why
        it ended without the turn's ``end`` (the reader failed or fell behind)."""
        ...


Pause = Callable[[Event], Awaitable[list[dict[str, Any]]]]
"""Asked after each event: the protocol's closing events if the view ends there though
the turn goes on (it waits for a person), else none."""


async def projected(
    feeds: Feeds,
    turn_id: str,
    projection: Projection,
    frame: Callable[[dict[str, Any]], Frame],
    *,
    after: int = 0,
    pause: Pause | None = None,
    events: AsyncIterator[Event] | None = None,
) -> AsyncIterator[Frame]:
    """The turn's feed after seq ``after`` (its whole feed by default; ``events``: another
    source of them, a tree's feed say) through ``projection``, each protocol event made a
    frame by ``frame``; ``pause`` may end the view early, and a feed that fails closes it
    with its ``cut`` form."""
    for item in projection.opening():
        yield frame(item)
    cut: str | None = None
    source = events if events is not None else feeds.subscribe(turn_id, after)
    try:
        async for event in source:
            for item in projection.feed(event):
                yield frame(item)
            closing = await pause(event) if pause is not None else []
            if closing:
                for item in closing:
                    yield frame(item)
                return
    except FellBehind as exc:
        log.info("dropped a slow subscriber: %s", exc)
        cut = "the reader fell too far behind the turn; reconnect to replay it"
    except Exception as exc:  # the shared reader failed: say so in the protocol's form
        log.warning("the feed of turn %s failed: %s", turn_id, exc)
        cut = "the turn's event stream failed; reconnect to replay it"
    finally:
        # At once, not when the collector finds it: a tree's feed reads its turns in
        # tasks of their own, which would go on reading a view that ended (a pause).
        closing_source = getattr(source, "aclose", None)
        if closing_source is not None:
            await closing_source()
    for item in projection.close(cut):
        yield frame(item)


def data_frame(item: dict[str, Any] | str) -> ServerSentEvent:
    """``data: JSON`` (or the text as it is), nothing else, its lines ending in LF: AG-UI's
    client splits a stream on blank lines written ``\\n\\n`` only."""
    data = item if isinstance(item, str) else json.dumps(item, separators=(",", ":"))
    return ServerSentEvent(data=data, sep="\n")


def data_stream(
    frames: AsyncIterator[ServerSentEvent], settings: GatewaySettings, **headers: str
) -> EventSourceResponse:
    """A ``text/event-stream`` response of ``frames``, with a ``: keep-alive`` comment at
    least every ``PARLEY_GATEWAY_KEEPALIVE`` seconds while idle, every line ending in LF."""
    return EventSourceResponse(
        frames,
        ping=settings.keepalive_seconds,
        ping_message_factory=lambda: ServerSentEvent(comment="keep-alive", sep="\n"),
        sep="\n",
        headers={"Cache-Control": "no-cache", **headers},
    )


def approval_pause(
    client: Client,
    turn_id: str,
    asked: Callable[[], set[str]],
    interrupt: Callable[[list[str]], list[dict[str, Any]]],
) -> Pause:
    """End the view once the turn waits for a person: after an ``approval_requested``,
    if every approval the store has pending for the turn has been seen asked (one
    transaction held them all, so none is missing from the store), ``interrupt`` them.
    A replay past answered approvals goes on: none of them is pending any more."""

    async def pause(event: Event) -> list[dict[str, Any]]:
        if event.kind is not EventKind.APPROVAL_REQUESTED:
            return []

        def pending() -> list[str]:
            return [a.approval_id for a in client.attach(turn_id).approvals()]

        waiting = await light(pending)
        if waiting and set(waiting) <= asked():
            return interrupt(waiting)
        return []

    return pause
