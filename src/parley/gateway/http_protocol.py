"""The gateway's HTTP/1.1 connections: uvicorn's h11 protocol, with caps on the
connections open at once, a deadline on each request's head and its refusals in the
error form.

A process keeps at most ``PARLEY_GATEWAY_CONNECTIONS`` connections open, and at most
``PARLEY_GATEWAY_CLIENT_CONNECTIONS`` from one peer address (:class:`OpenConnections`).
A connection past either cap is answered at its first bytes, ``503`` past the first and
``429`` past the second (both with ``Retry-After``), and closed; one that sends nothing
is closed after a second.  The peer address is the one the connection comes
from: behind a reverse proxy every connection is the proxy's, so there the second cap is
a cap on what the proxy may hold (raise it to the first, and cap each client at the
proxy, which sees them).  Headers that name a client (``X-Forwarded-For``) are not read:
any client can write them.

uvicorn times out an idle keep-alive connection, but nothing else it reads: a client
that sends half a request line, or headers one byte at a time, holds its connection for
as long as it likes, and a few hundred of them hold the gateway.  Here a connection's
request head (request line and headers) must arrive within ``head_timeout`` seconds of
the connection opening, or of the first byte of a later request on it; else the gateway
answers ``408`` (if anything arrived) and closes it.  The body's deadline is
:class:`parley.gateway.bodies.BodyLimit`'s, which reads every JSON body before the
route, or an upload's (:class:`parley.gateway.uploads.UploadLimits`).

A request h11 cannot parse (a malformed request line, a header without a colon) is
``400`` in the error form, where uvicorn answers text.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass
from http import HTTPStatus

from uvicorn.protocols.http.h11_impl import H11Protocol

from parley.gateway.errors import JSON_HEADERS, error_body

log = logging.getLogger("parley.gateway")


RETRY_AFTER_SECONDS = 1
"""What ``Retry-After`` says to a connection past a cap: connections come and go."""
REFUSED_GRACE_SECONDS = 1.0
"""How long a connection past a cap may stay silent before it is closed unanswered (it
is not counted, so it must not linger: a client sends its request as it connects)."""


def raw_refusal(
    status: int, type_name: str, message: str, headers: dict[str, str] | None = None
) -> bytes:
    """A whole HTTP/1.1 response in the error form, closing the connection: what the
    protocol writes itself, where no application runs."""
    body = json.dumps(error_body(type_name, message)).encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name}: {value}" for name, value in {**JSON_HEADERS, **(headers or {})}.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


@dataclass(frozen=True, kw_only=True)
class ConnectionCaps:
    """How many connections a process keeps open: in all, and from one peer address."""

    total: int
    per_client: int


class OpenConnections:
    """The connections one process has open, in all and by peer address (counted on
    the event loop only)."""

    def __init__(self, caps: ConnectionCaps) -> None:
        self.caps = caps
        self.total = 0
        self.by_peer: Counter[str] = Counter()

    def admit(self, peer: str) -> bytes | None:
        """Count a new connection from ``peer``; or, past a cap, the refusal to answer
        it with (it is not counted)."""
        if self.total >= self.caps.total:
            message = (
                f"the gateway has {self.total} connections open, the most "
                "PARLEY_GATEWAY_CONNECTIONS allows; retry later"
            )
            return self._refused(peer, 503, "Unavailable", message)
        if self.by_peer[peer] >= self.caps.per_client:
            message = (
                f"{peer} has {self.by_peer[peer]} connections open, the most "
                "PARLEY_GATEWAY_CLIENT_CONNECTIONS allows; close one, or retry later"
            )
            return self._refused(peer, 429, "TooManyRequests", message)
        self.total += 1
        self.by_peer[peer] += 1
        return None

    @staticmethod
    def _refused(peer: str, status: int, type_name: str, message: str) -> bytes:
        log.info("refused a connection from %s: %s", peer, message)
        return raw_refusal(status, type_name, message, {"Retry-After": str(RETRY_AFTER_SECONDS)})

    def release(self, peer: str) -> None:
        """Uncount a connection :meth:`admit` counted, once it has closed."""
        self.total -= 1
        self.by_peer[peer] -= 1
        if not self.by_peer[peer]:
            del self.by_peer[peer]


class GatewayProtocol(H11Protocol):
    """uvicorn's h11 protocol with caps on the connections open and a deadline on each
    request's head (make one with :func:`protocol_with`, which sets ``head_timeout`` and
    the process's ``open_connections``)."""

    head_timeout: float
    open_connections: OpenConnections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._peer = self.client[0] if self.client else ""
        # A connection past a cap is answered once it speaks (an answer written before
        # its request might be lost to the reset its request then meets), and closed.
        self._refusal = self.open_connections.admit(self._peer)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            self._head_arrived()
            if not self.transport.is_closing():
                self.transport.write(self._refusal)
                self.transport.close()
            return
        if self._between_requests():
            self._await_head()  # (a no-op while one is already awaited)
        super().data_received(data)
        if not self._between_requests():
            self._head_arrived()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # A pipelined request read in part already is timed from here.
        if self._between_requests() and self.conn.trailing_data[0]:
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        if self._refusal is None:
            self.open_connections.release(self._peer)
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self._head_arrived()
        self.transport.write(
            raw_refusal(400, "InvalidRequest", "the request is not valid HTTP/1.1")
        )
        self.transport.close()

    def _between_requests(self) -> bool:
        """No request's head has arrived since the last answer (or ever)."""
        return self.cycle is None or self.cycle.response_complete

    def _await_head(self) -> None:
        if self._head_deadline is None:
            wait = self.head_timeout
            if self._refusal is not None:
                wait = min(wait, REFUSED_GRACE_SECONDS)
            self._head_deadline = self.loop.call_later(wait, self._head_too_slow)

    def _head_arrived(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing() or not self._between_requests():
            return
        if self.conn.trailing_data[0]:
            # Part of a request came: say why it ends.  (A connection that sent nothing,
            # like a browser's spare one, is closed without a word.)
            log.info(
                "closed a connection from %s whose request head took over %.3g s",
                f"{self.client[0]}:{self.client[1]}" if self.client else "?",
                self.head_timeout,
            )
            self.transport.write(
                raw_refusal(
                    408,
                    "RequestTimeout",
                    f"the request's head did not arrive within {self.head_timeout:g} s "
                    "(PARLEY_GATEWAY_HEADER_TIMEOUT)",
                )
            )
        self.transport.close()


def protocol_with(head_timeout: float, caps: ConnectionCaps) -> type[GatewayProtocol]:
    """The protocol class for uvicorn's ``http`` option, with this head deadline and
    these caps (counted by the process, over every connection the class serves)."""
    attributes = {"head_timeout": head_timeout, "open_connections": OpenConnections(caps)}
    return type("GatewayProtocol", (GatewayProtocol,), attributes)


__all__ = [
    "ConnectionCaps",
    "GatewayProtocol",
    "OpenConnections",
    "protocol_with",
    "raw_refusal",
]
