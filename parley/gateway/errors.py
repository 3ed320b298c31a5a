"""The gateway's one error form, ``{"error": {"type": NAME, "message": TEXT}}``
(docs/http.md#5-requests-and-refusals), for every refusal: parley's errors by class, validation,
auth, unknown routes, an oversized body, and anything unexpected (a 5xx names no internals)."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from parley import errors

log = logging.getLogger("parley.gateway")

# parley's errors by the status docs/http.md#5-requests-and-refusals gives them; a subclass takes
# its base's.
STATUS_OF: dict[type[errors.ParleyError], int] = {
    errors.SessionNotFound: 404,
    errors.TurnNotFound: 404,
    errors.TurnEnded: 409,
    errors.SessionBusy: 409,
    errors.ForeignTurn: 409,
    errors.Conflict: 409,
    errors.PrefixFrozen: 409,
    errors.InvalidRequest: 422,
    errors.CodecError: 422,
}
# Starlette's own refusals (no such route, wrong method) in the same form.
TYPE_OF_STATUS = {
    404: "NotFound",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    413: "PayloadTooLarge",
    415: "UnsupportedMediaType",
    429: "TooManyRequests",
}


JSON_HEADERS = {
    # A browser never reads an answer as anything but JSON (a message or a tool's output
    # echoed in it can be made to look like HTML), and nothing keeps a tenant's data.
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
"""The headers of every JSON answer (``app.JsonHeaders`` adds them)."""


class GatewayError(Exception):
    """A refusal the gateway itself makes (auth, a body too large)."""

    def __init__(
        self, status: int, type_name: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type_name = type_name
        self.message = message
        self.headers = headers


def error_body(type_name: str, message: str) -> dict[str, Any]:
    """The error form."""
    return {"error": {"type": type_name, "message": message}}


def error_response(
    status: int, type_name: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The error form as a response."""
    return JSONResponse(error_body(type_name, message), status_code=status, headers=headers)


def unauthorized(message: str) -> GatewayError:
    """401, with the challenge RFC 6750 asks for."""
    return GatewayError(401, "Unauthorized", message, {"WWW-Authenticate": "Bearer"})


def status_of(error: errors.ParleyError) -> int:
    """The HTTP status of a parley error (503 for a store that failed, 500 otherwise)."""
    for cls in type(error).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return 503 if isinstance(error, errors.StoreError) else 500


def parley_error_response(error: errors.ParleyError) -> JSONResponse:
    """A parley error in the error form; a server-side failure names no internals."""
    status = status_of(error)
    if status >= 500:
        log.error("%s: %s", type(error).__name__, error)
        return error_response(status, "Unavailable", "the service is unavailable; retry later")
    return error_response(status, type(error).__name__, str(error))


def describe_validation(exc: RequestValidationError) -> str:
    """pydantic's errors as one readable line: ``where: what`` for each."""
    parts = []
    for item in exc.errors():
        where = ".".join(str(p) for p in item.get("loc", ()) if p not in ("body", "query"))
        message = str(item.get("msg", "invalid"))
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal of ``app`` in the error form."""

    @app.exception_handler(errors.ParleyError)
    async def parley_error(_request: Request, exc: errors.ParleyError) -> JSONResponse:
        return parley_error_response(exc)

    @app.exception_handler(GatewayError)
    async def gateway_error(_request: Request, exc: GatewayError) -> JSONResponse:
        return error_response(exc.status, exc.type_name, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if any(item.get("type") == "json_invalid" for item in exc.errors()):
            return _malformed(request)
        return error_response(422, "InvalidRequest", describe_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI could not read the body (not UTF-8, say)
            return _malformed(request)
        type_name = TYPE_OF_STATUS.get(exc.status_code, "HTTPError")
        message = exc.detail if isinstance(exc.detail, str) else type_name
        return error_response(exc.status_code, type_name, message, dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return error_response(500, "InternalError", "the gateway failed; retry later")


def _malformed(request: Request) -> JSONResponse:
    """400 for a body that is not JSON.  FastAPI parses a body before it resolves the
    route's dependencies, the bearer check among them: a caller without a known token
    hears 401 first, as from every other /v1 request, not how its body was malformed."""
    refusal = _unauthenticated(request)
    if refusal is not None:
        return error_response(401, refusal.type_name, refusal.message, refusal.headers)
    return error_response(400, "InvalidRequest", "the body is not valid JSON")


def _unauthenticated(request: Request) -> GatewayError | None:
    """The 401 of a request without a bearer token the gateway knows, if it is one (the
    check the ``tenant`` dependency makes, for a refusal made before that could run)."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not credentials:
        return unauthorized("this needs an Authorization: Bearer token")
    if request.app.state.tokens.tenant_of(credentials) is None:
        return unauthorized("the bearer token is not one this gateway knows")
    return None


MAX_BODY_DEPTH = 100
"""How deep a request body may nest its objects and arrays.  Deeper than any stock
client's body, and far below what fails later (pydantic stops serializing at some 255
levels, ``json.loads`` at some 1000): a deep body is refused before any route sees it."""

# A JSON string (its escapes included), and every byte that is not a bracket: what is
# left of a body without them is its nesting.  The closing quote is optional so that a
# match never fails: one that must (a body of many escaped quotes after an opening one)
# would be tried from every quote to the end, in time that grows with the square of the
# body, on the event loop, before any token is checked.  An unterminated string takes the
# rest of the body, which is malformed anyway.
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
    sends half a body and waits does not hold its connection."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        timeout: float,
        uploads: frozenset[str] = frozenset(),
        upload_limit: int = 0,
    ) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout
        self.uploads = uploads
        self.upload_limit = upload_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if scope["method"] == "POST" and scope["path"] in self.uploads:
            # A file upload (multipart): streamed to the route, which reads it in parts,
            # never buffered here; its size is bounded by its declared length.
            refusal = self._upload_refusal(headers)
            if refusal is not None:
                await self._refuse(scope, receive, send, *refusal)
                return
            await self.app(scope, receive, send)
            return
        if b"content-type" not in headers and scope["method"] in ("POST", "PUT", "PATCH"):
            # A body sent without saying what it is (curl -d with -H dropped, a bare
            # fetch) is read as the JSON every route takes, not refused as "not a dict".
            scope = {
                **scope,
                "headers": [*scope["headers"], (b"content-type", b"application/json")],
            }
        refused = self._head_refusal(headers)
        if refused is not None:
            await self._refuse(scope, receive, send, *refused)
            return
        try:
            async with asyncio.timeout(self.timeout):
                body = await self._read(receive)
        except TimeoutError:
            message = (
                f"the body did not arrive within {self.timeout:g} s (PARLEY_GATEWAY_BODY_TIMEOUT)"
            )
            # The rest of the body may still come: the connection cannot carry another.
            await error_response(408, "RequestTimeout", message, {"Connection": "close"})(
                scope, receive, send
            )
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

    def _upload_refusal(self, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if kind != b"multipart/form-data":
            return 415, "send the file as multipart/form-data (file, purpose)"
        declared = headers.get(b"content-length")
        if declared is None:
            return 411, "an upload declares its Content-Length"
        try:
            size = int(declared)
        except ValueError:
            return 400, "Content-Length is not a number"
        if size > self.upload_limit:
            return 413, (
                f"the file is over the limit of {self.upload_limit} bytes (PARLEY_GATEWAY_MAX_FILE)"
            )
        return None

    async def _refused_body(
        self, scope: Scope, receive: Receive, send: Send, body: bytes | None
    ) -> bool:
        """Refuse a body over the limit (None) or nested too deep; whether it was."""
        if body is None:
            await self._refuse(scope, receive, send, 413, self._over())
            return True
        if not nests_deeper_than(body, MAX_BODY_DEPTH):
            return False
        # (as for a malformed body: a caller without a known token hears 401 first)
        refusal = _unauthenticated(Request(scope))
        if refusal is not None:
            await error_response(401, refusal.type_name, refusal.message, refusal.headers)(
                scope, receive, send
            )
            return True
        await self._refuse(
            scope,
            receive,
            send,
            422,
            f"the body nests its objects and arrays over {MAX_BODY_DEPTH} levels deep",
        )
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
        self, scope: Scope, receive: Receive, send: Send, status: int, message: str
    ) -> None:
        type_name = TYPE_OF_STATUS.get(status, "InvalidRequest")
        await error_response(status, type_name, message)(scope, receive, send)
