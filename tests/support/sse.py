"""Reading a gateway's Server-Sent Events: one parser (the WHATWG rules), the frames of
Event JSON it carries, and a reader that reconnects as a browser's ``EventSource`` does."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from parley.schemas.events import Event, EventKind


@dataclass(frozen=True)
class SseMessage:
    """One dispatched Server-Sent Event (``id``, ``event``, ``data``) or one comment."""

    id: str | None = None
    event: str | None = None
    data: str | None = None
    comment: str | None = None

    def json(self) -> dict[str, Any]:
        """The data, parsed."""
        assert self.data is not None, self
        value: dict[str, Any] = json.loads(self.data)
        return value


class SseParser:
    """An event stream's messages, one line at a time (the WHATWG parsing rules:
    ``field: value`` with one optional space, a blank line dispatches, ``:`` starts a
    comment; several ``data`` lines join with newlines)."""

    def __init__(self) -> None:
        self._fields: dict[str, str] = {}
        self._data: list[str] = []

    def feed(self, line: str) -> SseMessage | None:
        """The event or comment this line completes, if any."""
        if line == "":
            fields, data = self._fields, self._data
            self._fields, self._data = {}, []
            if not (fields or data):
                return None
            joined = "\n".join(data) if data else None
            return SseMessage(id=fields.get("id"), event=fields.get("event"), data=joined)
        if line.startswith(":"):
            return SseMessage(comment=line[1:].removeprefix(" "))
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        else:
            self._fields[name] = value
        return None


def sse_messages(lines: Iterable[str]) -> Iterator[SseMessage]:
    """The events and comments of an event stream's lines."""
    parser = SseParser()
    for line in lines:
        message = parser.feed(line)
        if message is not None:
            yield message


@dataclass
class Frame:
    """One event as it came over SSE."""

    id: int
    kind: str
    event: Event


def frame_of(message: SseMessage) -> Frame | None:
    """The frame of Event JSON a message carries (None: a comment or a keep-alive)."""
    if message.data is None:
        return None
    assert message.id is not None and message.event is not None, message
    return Frame(id=int(message.id), kind=message.event, event=Event.from_json(message.json()))


class FrameParser:
    """The frames of a stream's lines, one line at a time."""

    def __init__(self) -> None:
        self._parser = SseParser()

    def feed(self, line: str) -> Frame | None:
        """The frame this line completes, if any."""
        message = self._parser.feed(line)
        return None if message is None else frame_of(message)


def parse_frames(lines: Iterable[str]) -> Iterator[Frame]:
    """Every frame of a stream's lines."""
    frames = (frame_of(message) for message in sse_messages(lines))
    return (frame for frame in frames if frame is not None)


@dataclass
class Reader:
    """A browser's ``EventSource`` on one turn: it remembers the last id it saw and
    reconnects with ``Last-Event-ID``, to the same gateway or another."""

    turn_id: str
    token: str
    events: list[Event] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    """The gateway each event came from."""
    connections: int = 0
    drops: int = 0

    @property
    def last_id(self) -> int:
        return self.events[-1].seq if self.events else 0

    @property
    def ended(self) -> bool:
        return bool(self.events) and self.events[-1].kind is EventKind.END

    def read(
        self, base_url: str, *, until: Callable[[Event], bool] | None = None, timeout: float = 60
    ) -> bool:
        """Connect to ``base_url`` (with ``Last-Event-ID`` once it has seen an event) and
        read: True at ``end``; False once ``until(event)`` holds (it closes the stream
        itself) or the connection dropped (the server died or closed early)."""
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream"}
        if self.events:
            headers["Last-Event-ID"] = str(self.last_id)
        self.connections += 1
        try:
            with httpx.stream(
                "GET",
                f"{base_url}/v1/turns/{self.turn_id}/events",
                headers=headers,
                timeout=httpx.Timeout(timeout, connect=5),
            ) as answer:
                assert answer.status_code == 200, answer.read()
                assert answer.headers["content-type"].startswith("text/event-stream")
                for frame in parse_frames(answer.iter_lines()):
                    assert frame.id == frame.event.seq and frame.kind == frame.event.kind.value
                    assert frame.event.turn_id == self.turn_id
                    self.events.append(frame.event)
                    self.origins.append(base_url)
                    if frame.event.kind is EventKind.END:
                        return True
                    if until is not None and until(frame.event):
                        return False
        except httpx.TransportError:
            pass
        self.drops += 1
        return False

    def follow(self, base_urls: list[str], *, deadline: float) -> None:
        """Read to ``end``, reconnecting (to the next of ``base_urls`` in turn, as a load
        balancer might send it) after each drop, a little later each time."""
        attempt = 0
        while not self.read(base_urls[attempt % len(base_urls)]):
            assert time.monotonic() < deadline, f"no end after {self.connections} connections"
            attempt += 1
            time.sleep(min(0.05 * attempt, 0.5))
