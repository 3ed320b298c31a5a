"""The OpenAI routes' refusals (Responses, Files, Batches), in OpenAI's form
(``{"error": {"message", "type", "param", "code"}}``, with OpenAI's statuses): the error a
route raises, the answer any other error of theirs becomes, the route class that
answers them so (validation included), and the paths whose refusals made before any
route runs take that form too (:func:`openai_paths`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from parley import errors
from parley.gateway.errors import GatewayError, as_openai, openai_answer, status_of
from parley.openai_api.errors import OpenAIError

log = logging.getLogger("parley.gateway")


NOT_FOUND = (errors.TurnNotFound, errors.BatchNotFound, errors.FileNotFound)


def openai_error_of(exc: Exception, content_type: str = "application/json") -> OpenAIError:
    """Any error of an OpenAI route as OpenAI would answer it (a 5xx names no internals);
    ``content_type``: the request's, which says what a body that cannot be read is not."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, RequestValidationError):
        return _invalid(exc)
    if isinstance(exc, GatewayError):
        return as_openai(exc)
    if isinstance(exc, StarletteHTTPException):  # FastAPI's own: a body it cannot parse
        return _unreadable(exc, content_type)
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


def _unreadable(exc: StarletteHTTPException, content_type: str) -> OpenAIError:
    """FastAPI's refusal of a body it cannot read (400), as what the body is not."""
    detail = exc.detail if isinstance(exc.detail, str) else "refused"
    if exc.status_code != 400:
        return OpenAIError(exc.status_code, detail, headers=dict(exc.headers or {}))
    if content_type.startswith("multipart/form-data"):
        message = f"the body is not valid multipart/form-data (file, purpose): {detail}"
        return OpenAIError(400, message, code="invalid_multipart")
    return OpenAIError(400, "the body is not valid JSON", code="invalid_json")


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
                kind = request.headers.get("content-type", "application/json").lower()
                return openai_answer(openai_error_of(exc, kind))

        return route


def openai_paths(routers: Sequence[APIRouter]) -> re.Pattern[str]:
    """The paths under the prefixes of the OpenAI routes of ``routers`` (``/v1/files``,
    …): a request for one (an unknown one, a method not served) is refused in OpenAI's
    form, as the routes themselves refuse."""
    prefixes = sorted(
        {
            "/".join(route.path.split("/")[:3])
            for router in routers
            for route in router.routes
            if isinstance(route, OpenAIRoute)
        }
    )
    if not prefixes:
        raise ValueError("no OpenAI route among these routers")
    return re.compile("|".join(f"{re.escape(prefix)}(/|$)" for prefix in prefixes))
