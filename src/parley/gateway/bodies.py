"""What a JSON request body may be, checked before the route sees it
(docs/http.md#5-requests-and-refusals): its size, its type, its depth, and how long it
may take to arrive.  An upload (multipart) is :mod:`parley.gateway.uploads`' instead.

By the time a body is read here its bearer token has been checked
(:mod:`parley.gateway.authentication`): a client without one is refused before it can
make the gateway read, or wait for, a byte of it.
"""

from __future__ import annotations

import asyncio
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from parley.gateway.errors import TYPE_OF_STATUS, GatewayError, refusal

MAX_BODY_DEPTH = 100
"""How deep a request body may nest its objects and arrays.  Deeper than any stock
client's body, and far below what fails later (pydantic stops serializing at some 255
levels, ``json.loads`` at some 1000): a deep body is refused before any route sees it."""

# A JSON string (its escapes included), and every byte that is not a bracket: what is
# left of a body without them is its nesting.  The closing quote is optional so that a
# match never fails: one that must (a body of many escaped quotes after an opening one)
# would be tried from every quote to the end, in time that grows with the square of the
# body, on the event loop.  An unterminated string takes the rest of the body, which is
# malformed anyway.
JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")


def nests_deeper_than(body: bytes, limit: int) -> bool:
    """Whether the JSON text ``body`` nests objects and arrays more than ``limit`` deep
    (read without parsing it: a body too deep to parse is what this is for)."""
    depth = 0
    for bracket in JSON_STRING.sub(b"", body).translate(None, NOT_BRACKETS):
        depth += 1 if bracket in b"[{" else -1
        if depth > limit:
            return True
    return False


class BodyLimit:
    """Read a request's body before the route sees it, and refuse it in the error form:
    ``413`` over ``limit`` bytes (by its ``Content-Length``, or, without one, as it
    arrives), ``415`` declared as anything but JSON (FastAPI would not parse it, and a
    form-encoded prompt would be refused as "not an object", which says nothing),
    ``422`` nested deeper than :data:`MAX_BODY_DEPTH`, and ``408`` (closing the
    connection) unless it has all arrived within ``timeout`` seconds: a client that
    sends half a body and waits does not hold its connection.  The ``uploads`` paths
    (``POST`` only) are left to :class:`parley.gateway.uploads.UploadLimits`."""

    def __init__(
        self, app: ASGIApp, limit: int, timeout: float, uploads: frozenset[str] = frozenset()
    ) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout
        self.uploads = uploads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"] == "POST" and scope["path"] in self.uploads):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if b"content-type" not in headers and scope["method"] in ("POST", "PUT", "PATCH"):
            # A body sent without saying what it is (curl -d with -H dropped, a bare
            # fetch) is read as the JSON every route takes, not refused as "not a dict".
            scope = {
                **scope,
                "headers": [*scope["headers"], (b"content-type", b"application/json")],
            }
        refused = self._head_refusal(headers)
        if refused is not None:
            await self._refuse(scope, receive, send, *refused, unread_body=True)
            return
        try:
            async with asyncio.timeout(self.timeout):
                body = await self._read(receive)
        except TimeoutError:
            message = (
                f"the body did not arrive within {self.timeout:g} s (PARLEY_GATEWAY_BODY_TIMEOUT)"
            )
            # The rest of the body may still come: the connection cannot carry another.
            await self._refuse(scope, receive, send, 408, message, unread_body=True)
            return
        if await self._refused_body(scope, receive, send, body):
            return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def _head_refusal(self, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        """The status and message of a request refused by its headers alone, if it is."""
        kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if kind and not (kind == b"application/json" or kind.endswith(b"+json")):
            return 415, "send the body as JSON (Content-Type: application/json)"
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                return 400, "Content-Length is not a number"
            if size > self.limit:
                return 413, self._over()
        return None

    async def _refused_body(
        self, scope: Scope, receive: Receive, send: Send, body: bytes | None
    ) -> bool:
        """Refuse a body over the limit (None) or nested too deep; whether it was."""
        if body is None:
            await self._refuse(scope, receive, send, 413, self._over(), unread_body=True)
            return True
        if not nests_deeper_than(body, MAX_BODY_DEPTH):
            return False
        message = f"the body nests its objects and arrays over {MAX_BODY_DEPTH} levels deep"
        await self._refuse(scope, receive, send, 422, message)
        return True

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body, or None once it is over the limit."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _over(self) -> str:
        return f"the body is over the limit of {self.limit} bytes (PARLEY_GATEWAY_MAX_BODY)"

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        status: int,
        message: str,
        *,
        unread_body: bool = False,
    ) -> None:
        error = GatewayError(status, TYPE_OF_STATUS.get(status, "InvalidRequest"), message)
        await refusal(scope, error, unread_body=unread_body)(scope, receive, send)


__all__ = ["MAX_BODY_DEPTH", "BodyLimit", "nests_deeper_than"]
