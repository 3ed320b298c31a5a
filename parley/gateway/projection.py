"""What every protocol view of a turn shares (SPEC §6 "Protocols for existing UIs"): a
*projection* is a small stateful object fed one turn's parley events in seq order that
answers, for each, the protocol's own events; the route only wires one to the process's
shared feed (``Feeds.subscribe``).  It never runs anything: one log, several views.

A projection sees every event of the turn from its start (tokens while the replay buffer
has them, every durable event after that), and a turn that is resumed after an ``end``
goes on in the same feed, so the terminal answer is given by :meth:`Projection.close`,
once the feed is over, from the last ``end`` seen.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

from sse_starlette import EventSourceResponse, ServerSentEvent

from parley.gateway.feeds import Feeds, FellBehind
from parley.gateway.settings import GatewaySettings
from schemas.events import Event

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


async def projected(
    feeds: Feeds,
    turn_id: str,
    projection: Projection,
    frame: Callable[[dict[str, Any]], Frame],
) -> AsyncIterator[Frame]:
    """The turn's whole feed (from seq 0) through ``projection``, each protocol event made
    a frame by ``frame``; a feed that fails closes the view with its ``cut`` form."""
    for item in projection.opening():
        yield frame(item)
    cut: str | None = None
    try:
        async for event in feeds.subscribe(turn_id, 0):
            for item in projection.feed(event):
                yield frame(item)
    except FellBehind as exc:
        log.info("dropped a slow subscriber: %s", exc)
        cut = "the reader fell too far behind the turn; reconnect to replay it"
    except Exception as exc:  # the shared reader failed: say so in the protocol's form
        log.warning("the feed of turn %s failed: %s", turn_id, exc)
        cut = "the turn's event stream failed; reconnect to replay it"
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
        ping=max(1, round(settings.keepalive_seconds)),
        ping_message_factory=lambda: ServerSentEvent(comment="keep-alive", sep="\n"),
        sep="\n",
        headers={"Cache-Control": "no-cache", **headers},
    )
