"""The gateway's SSE frames: lines end in LF, as ``event_stream`` says."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from parley.gateway.event_streams import event_stream, sse_bytes
from parley.gateway.settings import GatewaySettings
from parley.schemas.events import Event, EventKind


def test_an_event_frame_is_id_event_data_and_a_blank_line_in_lf() -> None:
    event = Event(turn_id="t", seq=7, kind=EventKind.TOKEN, data={"step": 0, "text": "a\r\nb"})
    frame = sse_bytes(event)
    assert frame == (
        b"id: 7\nevent: token\n"
        b'data: {"turn_id":"t","seq":7,"kind":"token","data":{"step":0,"text":"a\\r\\nb"}}\n\n'
    )


def test_the_keep_alive_comment_ends_in_lf() -> None:
    async def frames() -> AsyncIterator[bytes]:
        yield b""

    settings = GatewaySettings(tokens={}, workspaces=Path("."))
    response = event_stream(frames(), settings)
    assert response.ping_message_factory is not None
    assert response.ping_message_factory().encode() == b": keep-alive\n\n"
