"""A turn's events as Server-Sent Events, the one form every streaming route of the
gateway answers in (native, Responses): each event's frame (:func:`sse_of`), the
response that carries frames with keep-alive comments while idle (:func:`event_stream`),
and the OpenAPI description of a native event stream (:data:`EVENT_STREAM`).  Here, not
in a router, so that no router imports another."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent

from parley.gateway.settings import GatewaySettings
from parley.schemas.events import Event

EVENT_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: each `id: SEQ`, `event: KIND`, `data: Event` "
        "(see the ServerSentEvent, Event and *Payload schemas); `: keep-alive` comments "
        "while idle; the stream closes after `end`.",
        # Before OpenAPI 3.2's itemSchema, an event stream's schema describes each event.
        "content": {
            "text/event-stream": {"schema": {"$ref": "#/components/schemas/ServerSentEvent"}}
        },
    }
}


SSE_LINE_END = "\n"
"""What ends an SSE line here.  sse_starlette's response takes a ``sep`` for what it
encodes itself, but a ``ServerSentEvent`` keeps its own (CRLF unless told)."""


def sse_of(event: Event) -> ServerSentEvent:
    """An event as SSE: ``id: SEQ``, ``event: KIND``, ``data: Event.to_json()``."""
    return ServerSentEvent(
        data=json.dumps(event.to_json(), separators=(",", ":")),
        event=str(event.kind),
        id=str(event.seq),
        sep=SSE_LINE_END,
    )


def sse_bytes(event: Event) -> bytes:
    """An event's SSE frame, encoded (what :func:`sse_of` makes, as bytes)."""
    return sse_of(event).encode()


def event_stream(
    frames: AsyncIterator[ServerSentEvent] | AsyncIterator[bytes],
    settings: GatewaySettings,
    **headers: str,
) -> EventSourceResponse:
    """A ``text/event-stream`` response of ``frames`` with ``: keep-alive`` comments while
    idle; lines end in LF (the form every SSE parser takes)."""
    return EventSourceResponse(
        frames,
        ping=settings.keepalive_seconds,
        ping_message_factory=lambda: ServerSentEvent(comment="keep-alive", sep=SSE_LINE_END),
        sep=SSE_LINE_END,
        headers={"Cache-Control": "no-cache", **headers},
    )
