"""The OpenAI Responses routes' refusals, in OpenAI's form
(``{"error": {"message", "type", "param", "code"}}``, with OpenAI's statuses): the error a
route raises, the answer any other error of theirs becomes, and the route class that
answers them so (auth and validation included)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from parley import errors
from parley.gateway.errors import GatewayError, status_of
from parley.openai_api.errors import OpenAIError

log = logging.getLogger("parley.gateway")


def answer(error: OpenAIError) -> JSONResponse:
    """The refusal as an answer."""
    return JSONResponse(error.body.model_dump(), status_code=error.status, headers=error.headers)


NOT_FOUND = (errors.TurnNotFound, errors.BatchNotFound, errors.FileNotFound)


def openai_error_of(exc: Exception) -> OpenAIError:
    """Any error of a Responses route as OpenAI would answer it (a 5xx names no internals)."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, RequestValidationError):
        return _invalid(exc)
    if isinstance(exc, GatewayError):
        code = "invalid_api_key" if exc.status == 401 else None
        return OpenAIError(exc.status, exc.message, code=code, headers=exc.headers)
    if isinstance(exc, StarletteHTTPException):  # FastAPI's own: a body it cannot parse
        if exc.status_code == 400:
            return OpenAIError(400, "the body is not valid JSON", code="invalid_json")
        detail = exc.detail if isinstance(exc.detail, str) else "refused"
        return OpenAIError(exc.status_code, detail, headers=dict(exc.headers or {}))
    if isinstance(exc, NOT_FOUND):
        return OpenAIError(404, str(exc), code="not_found")
    if isinstance(exc, errors.SessionNotFound):
        return OpenAIError(404, str(exc), param="conversation", code="not_found")
    if isinstance(exc, errors.ParleyError):
        status = status_of(exc)
        if status >= 500:
            log.error("%s: %s", type(exc).__name__, exc)
            return OpenAIError(
                status, "the service is unavailable; retry later", type_name="server_error"
            )
        # parley's 422 (a field it refuses) is OpenAI's 400; its 409s stay conflicts.
        return OpenAIError(400 if status == 422 else status, str(exc), code=type(exc).__name__)
    log.exception("unexpected error", exc_info=exc)
    return OpenAIError(500, "the gateway failed; retry later", type_name="server_error")


def _invalid(exc: RequestValidationError) -> OpenAIError:
    """The first of pydantic's complaints, with the parameter it concerns."""
    items = exc.errors()
    if any(item.get("type") == "json_invalid" for item in items):
        return OpenAIError(400, "the body is not valid JSON", code="invalid_json")
    item = items[0] if items else {}
    where = [str(p) for p in item.get("loc", ()) if p not in ("body", "query", "path")]
    param = where[0] if where else None
    name = ".".join(where)
    kind = item.get("type")
    if kind == "extra_forbidden":
        return OpenAIError(
            400, f"Unknown parameter: '{name}'.", param=param, code="unknown_parameter"
        )
    if kind == "missing":
        message, code = f"Missing required parameter: '{name}'.", "missing_required_parameter"
        return OpenAIError(400, message, param=param, code=code)
    detail = str(item.get("msg", "invalid"))
    return OpenAIError(400, f"Invalid '{name}': {detail}", param=param, code="invalid_value")


class OpenAIRoute(APIRoute):
    """A route whose refusals (auth, validation, parley's errors) are in OpenAI's form,
    not the rest of the gateway's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                return answer(openai_error_of(exc))

        return route
