"""The gateway benchmark's minimal HTTP/1.1 clients: one kept-alive connection on a
socket, or on asyncio streams, so that what is measured is the gateway rather than an
HTTP library."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from typing import Any

from tests.support.gateway import Gateway


class Connection:
    """One kept-alive HTTP/1.1 connection, on a socket (no HTTP library's cost)."""

    def __init__(self, gateway: Gateway) -> None:
        host, port = gateway.url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.auth = f"Authorization: Bearer {gateway.token}\r\n"
        self.buffer = b""

    def send(
        self, method: str, path: str, body: dict[str, Any] | None = None, extra: str = ""
    ) -> None:
        payload = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: gateway\r\n{self.auth}{extra}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + payload)

    def json(
        self, method: str, path: str, body: dict[str, Any] | None = None, extra: str = ""
    ) -> Any:
        """A JSON request and its answer's body (the status must be 2xx); ``extra``: more
        header lines, each ending in CRLF."""
        self.send(method, path, body, extra)
        while b"\r\n\r\n" not in self.buffer:
            self._recv()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        assert head.split(b" ", 2)[1].startswith(b"2"), head
        length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
        while len(self.buffer) < length:
            self._recv()
        answer, self.buffer = self.buffer[:length], self.buffer[length:]
        return json.loads(answer)

    def first_token(self, turn_id: str) -> float:
        """Follow the turn's event stream to its end; when its first ``token`` came."""
        self.send("GET", f"/v1/turns/{turn_id}/events")
        first = 0.0
        while not first:
            self._recv()
            if b"event: token" in self.buffer:
                first = time.perf_counter()
        while not (b"event: end" in self.buffer and self.buffer.endswith(b"\r\n0\r\n\r\n")):
            self._recv()
        self.buffer = b""
        return first

    def _recv(self) -> None:
        data = self.sock.recv(1 << 16)
        assert data, "the gateway closed the connection"
        self.buffer += data

    def close(self) -> None:
        self.sock.close()


class AsyncConnection:
    """One kept-alive HTTP/1.1 connection on asyncio streams (no HTTP library's cost)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.auth = f"Authorization: Bearer {gateway.token}\r\n"
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A JSON request and its answer's status and body."""
        if self.streams is None:
            host, port = self.gateway.url.removeprefix("http://").split(":")
            self.streams = await asyncio.open_connection(host, int(port))
        reader, writer = self.streams
        payload = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: gateway\r\n{self.auth}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        writer.write(head.encode() + b"\r\n" + payload)
        answer = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", answer).group(1))  # type: ignore[union-attr]
        return int(answer.split(b" ", 2)[1]), json.loads(await reader.readexactly(length))

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
