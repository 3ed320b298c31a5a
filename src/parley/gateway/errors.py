"""The gateway's one error form, ``{"error": {"type": NAME, "message": TEXT}}``
(docs/http.md#5-requests-and-refusals), for every refusal: parley's errors by class, validation,
auth, unknown routes, an oversized body, and anything unexpected (a 5xx names no internals).

The OpenAI routes (Responses, Files, Batches) answer in OpenAI's form instead, their
refusals included (``openai_errors.py``); a refusal made before any route runs
(auth, a body's limits, a tenant's bounds, no such route or method) takes the form of
the route the request is for: :func:`refusal`."""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from parley import errors
from parley.models.errors import ProviderError, RateLimited
from parley.openai_api.errors import OpenAIError

log = logging.getLogger("parley.gateway")

# parley's errors by the status docs/http.md#5-requests-and-refusals gives them; a subclass takes
# its base's.
STATUS_OF: dict[type[errors.ParleyError], int] = {
    errors.SessionNotFound: 404,
    errors.TurnNotFound: 404,
    errors.CompactionNotFound: 404,
    errors.ScheduleNotFound: 404,
    errors.TurnEnded: 409,
    errors.SessionBusy: 409,
    errors.ForeignTurn: 409,
    errors.Conflict: 409,
    errors.PrefixFrozen: 409,
    errors.InvalidRequest: 422,
    errors.CodecError: 422,
    errors.StorageFull: 413,
}
# Starlette's own refusals (no such route, wrong method) in the same form.
TYPE_OF_STATUS = {
    404: "NotFound",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    411: "LengthRequired",
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


OPENAI_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}
"""The codes OpenAI gives these refusals of its own."""


def as_openai(error: GatewayError) -> OpenAIError:
    """A refusal of the gateway's in OpenAI's terms: its code OpenAI's for a 401 or a
    429, else the type's words in snake case (``PayloadTooLarge``: ``payload_too_large``);
    a 5xx is a ``server_error``."""
    code = OPENAI_CODES.get(error.status) or re.sub(r"(?<!^)(?=[A-Z])", "_", error.type_name)
    return OpenAIError(
        error.status,
        error.message,
        code=code.lower(),
        type_name="server_error" if error.status >= 500 else "invalid_request_error",
        headers=error.headers,
    )


def openai_answer(error: OpenAIError) -> JSONResponse:
    """An OpenAI refusal as an answer."""
    return JSONResponse(error.body.model_dump(), status_code=error.status, headers=error.headers)


def speaks_openai(scope: Scope) -> bool:
    """Whether the request is for one of the OpenAI routes (the paths under their
    prefixes, which ``app.create_app`` reads from the routes as ``openai_paths``)."""
    return scope["app"].state.openai_paths.match(scope["path"]) is not None


def refusal(scope: Scope, error: GatewayError, *, unread_body: bool = False) -> JSONResponse:
    """``error`` as the answer to the request ``scope``, in the form of the route it is
    for.  ``unread_body``: refused before its body was read, so that the connection is
    closed after the answer if it declares one: a client still sending its body would
    otherwise hold the connection for as long as it trickled it."""
    headers = dict(error.headers or {})
    if unread_body and declares_body(scope):
        headers["Connection"] = "close"
    fitted = GatewayError(error.status, error.type_name, error.message, headers)
    if speaks_openai(scope):
        return openai_answer(as_openai(fitted))
    return error_response(fitted.status, fitted.type_name, fitted.message, fitted.headers)


def declares_body(scope: Scope) -> bool:
    """Whether the request says a body follows its head."""
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


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
    if isinstance(error, ProviderError):
        return provider_error_response(error)
    status = status_of(error)
    if status >= 500:
        log.error("%s: %s", type(error).__name__, error)
        return error_response(status, "Unavailable", "the service is unavailable; retry later")
    return error_response(status, type(error).__name__, str(error))


def provider_error_response(error: ProviderError) -> JSONResponse:
    """A model call a route made itself (a compaction's summary) that the provider
    refused: ``502``, or ``503`` with the provider's ``Retry-After`` when it limited the
    rate; the gateway did not fail, and retrying may help.  The message names the
    provider's status only (its text stays in the log)."""
    log.warning("the model provider failed: %s", error)
    said = f" (HTTP {error.status})" if error.status is not None else ""
    message = f"the model's provider failed{said}; nothing was changed"
    if isinstance(error, RateLimited):
        after = (
            {} if error.retry_after is None else {"Retry-After": str(math.ceil(error.retry_after))}
        )
        return error_response(503, "ProviderError", message + "; retry later", after)
    return error_response(502, "ProviderError", message)


def describe_validation(exc: RequestValidationError) -> str:
    """pydantic's errors as one readable line: ``where: what`` for each."""
    parts = []
    for item in exc.errors():
        where = ".".join(str(p) for p in item.get("loc", ()) if p not in ("body", "query"))
        message = str(item.get("msg", "invalid"))
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal of ``app`` in the error form (no such route or method: in the form
    of the route the path is under)."""

    @app.exception_handler(errors.ParleyError)
    async def parley_error(_request: Request, exc: errors.ParleyError) -> JSONResponse:
        return parley_error_response(exc)

    @app.exception_handler(GatewayError)
    async def gateway_error(_request: Request, exc: GatewayError) -> JSONResponse:
        return error_response(exc.status, exc.type_name, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        if any(item.get("type") == "json_invalid" for item in exc.errors()):
            return _malformed()
        return error_response(422, "InvalidRequest", describe_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI could not read the body (not UTF-8, say)
            return _malformed()
        type_name = TYPE_OF_STATUS.get(exc.status_code, "HTTPError")
        message = exc.detail if isinstance(exc.detail, str) else type_name
        error = GatewayError(exc.status_code, type_name, message, dict(exc.headers or {}))
        return refusal(request.scope, error)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return error_response(500, "InternalError", "the gateway failed; retry later")


def _malformed() -> JSONResponse:
    """400 for a body that is not JSON (its token was checked before it was read)."""
    return error_response(400, "InvalidRequest", "the body is not valid JSON")
