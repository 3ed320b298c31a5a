"""How much of the gateway one tenant may hold: requests in flight, and of them streams.

Every request holds a connection while it runs, and a stream (a turn's events, an AG-UI
run, a chat, a response) holds one for as long as its turn goes on; a tenant that opened
them without end would leave the others nothing.  Past its bound a tenant's request is
``429 TooManyRequests`` with ``Retry-After``, before any route runs (so it changes
nothing), while every other tenant is served as before.  A request without a token the
gateway knows never gets here (``authentication.py`` refuses it, ``401``): what an
unauthenticated client can hold is bounded by the connections' deadlines and caps
instead (``http_protocol.py``).

A request counts as a stream by its route, before it answers: one that may answer a
stream or wait for a turn to end holds a stream's place for as long as it runs.
"""

from __future__ import annotations

import re
from collections import Counter
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Receive, Scope, Send

from parley.gateway.authentication import tenant_of
from parley.gateway.errors import GatewayError, refusal

RETRY_AFTER_SECONDS = {"requests": 1, "streams": 5}
"""What ``Retry-After`` says: a request is soon over, a stream lasts its turn."""

STREAM_ROUTES = re.compile(
    r"(GET /v1/turns/[^/]+/events|POST /v1/ag-ui|POST /v1/chat|GET /v1/chat/[^/]+/stream"
    r"|POST /v1/responses|POST /mcp|POST /a2a|POST /message:(send|stream)"
    r"|(GET|POST) /tasks/[^/]+:subscribe)/?"
)
"""The routes that answer a stream, or (a ``POST /v1/responses`` not in the background)
wait for the turn; ``GET /v1/responses/{id}`` is one with ``stream=true``.  Any MCP
message may be a ``tools/call`` or ``tasks/result`` that streams its turn (which one is
in the body, not yet read): every ``POST /mcp`` counts as one, and so does every A2A
JSON-RPC request (``POST /a2a``), a message (it waits for its task unless it asks not
to) and a subscription."""
RESPONSE = re.compile(r"GET /v1/responses/[^/]+/?")


def is_stream(scope: Scope) -> bool:
    """Whether the request may hold its connection for as long as a turn runs."""
    route = f"{scope['method']} {scope['path']}"
    if STREAM_ROUTES.fullmatch(route):
        return True
    if RESPONSE.fullmatch(route):
        query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
        return bool(query.get("stream", [""])[-1].lower() == "true")
    return False


class TenantLimits:
    """ASGI middleware: at most ``requests`` requests of one tenant in flight, at most
    ``streams`` of them streams; ``429`` past either.

    The counts live in this process (each gateway process bounds what it serves), and
    need no lock: they change on the event loop only, between awaits."""

    def __init__(self, app: ASGIApp, requests: int, streams: int) -> None:
        self.app = app
        self.bounds = {"requests": requests, "streams": streams}
        self.held: dict[str, Counter[str]] = {"requests": Counter(), "streams": Counter()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tenant = tenant_of(scope) if scope["type"] == "http" else None
        if tenant is None:
            await self.app(scope, receive, send)
            return
        kinds = ["requests", "streams"] if is_stream(scope) else ["requests"]
        for kind in kinds:
            if self.held[kind][tenant] >= self.bounds[kind]:
                variable = f"PARLEY_GATEWAY_TENANT_{kind.upper()}"
                message = (
                    f"this tenant has {self.bounds[kind]} {kind} open, the most "
                    f"{variable} allows; retry once one has ended"
                )
                headers = {"Retry-After": str(RETRY_AFTER_SECONDS[kind])}
                error = GatewayError(429, "TooManyRequests", message, headers)
                await refusal(scope, error, unread_body=True)(scope, receive, send)
                return
        for kind in kinds:
            self.held[kind][tenant] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            for kind in kinds:
                self.held[kind][tenant] -= 1
                if not self.held[kind][tenant]:
                    del self.held[kind][tenant]


__all__ = ["RETRY_AFTER_SECONDS", "TenantLimits", "is_stream"]
