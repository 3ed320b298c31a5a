"""The gateway's HTTP/1.1 connections: uvicorn's h11 protocol, with a deadline on each
request's head and its refusals in the error form.

uvicorn times out an idle keep-alive connection, but nothing else it reads: a client
that sends half a request line, or headers one byte at a time, holds its connection for
as long as it likes, and a few hundred of them hold the gateway.  Here a connection's
request head (request line and headers) must arrive within ``head_timeout`` seconds of
the connection opening, or of the first byte of a later request on it; else the gateway
answers ``408`` (if anything arrived) and closes it.  The body's deadline is
:class:`parley.gateway.errors.BodyLimit`'s, which reads every body before the route.

A request h11 cannot parse (a malformed request line, a header without a colon) is
``400`` in the error form, where uvicorn answers text.
"""

from __future__ import annotations

import asyncio
import json
import logging
from http import HTTPStatus

from uvicorn.protocols.http.h11_impl import H11Protocol

from parley.gateway.errors import JSON_HEADERS, error_body

log = logging.getLogger("parley.gateway")


def raw_refusal(status: int, type_name: str, message: str) -> bytes:
    """A whole HTTP/1.1 response in the error form, closing the connection: what the
    protocol writes itself, where no application runs."""
    body = json.dumps(error_body(type_name, message)).encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name}: {value}" for name, value in JSON_HEADERS.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


class GatewayProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's head (make one with
    :func:`protocol_with`, which sets ``head_timeout``)."""

    head_timeout: float

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._await_head()

    def data_received(self, data: bytes) -> None:
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
            self._head_deadline = self.loop.call_later(self.head_timeout, self._head_too_slow)

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


def protocol_with(head_timeout: float) -> type[GatewayProtocol]:
    """The protocol class for uvicorn's ``http`` option, with this head deadline."""
    return type("GatewayProtocol", (GatewayProtocol,), {"head_timeout": head_timeout})


__all__ = ["GatewayProtocol", "protocol_with", "raw_refusal"]
