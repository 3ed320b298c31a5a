"""The gateway's ASGI application: its routers (``routers/``) on one client, the error
form, the bearer check before any body is read, the limits of bodies and uploads, a
tenant's bounds, CORS (its refusals in the error form), the JSON answers' headers,
conditional GETs (``conditional.py``), an access log without query strings, and the
OpenAPI document."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from parley.client import Client
from parley.gateway.a2a_handler import a2a_routes
from parley.gateway.authentication import Authentication
from parley.gateway.bodies import BodyLimit
from parley.gateway.conditional import ConditionalGet
from parley.gateway.ends_watch import EndsWatcher
from parley.gateway.errors import JSON_HEADERS, error_response, install_error_handlers
from parley.gateway.feeds import Feeds
from parley.gateway.openai_errors import openai_paths
from parley.gateway.routers import (
    agui,
    aisdk,
    batches,
    files,
    mcp,
    native,
    operations,
    page,
    responses,
    schedules,
)
from parley.gateway.settings import GatewaySettings
from parley.gateway.tenant_limits import TenantLimits
from parley.gateway.tenants import TokenTable
from parley.gateway.uploads import UploadBounds, UploadLimits
from parley.gateway.work import HeavyWork
from parley.schemas.events import PAYLOADS, payload_adapter
from parley.telemetry import tracing
from parley.telemetry.log_context import log_scope

access_log = logging.getLogger("parley.gateway.access")


def create_app(client: Client, settings: GatewaySettings) -> FastAPI:
    """The gateway on ``client`` (embedded or fleet), configured by ``settings``.  The
    client is closed with the application."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        feeds.close()
        ends.close()
        heavy.close()
        client.close(wait=False)

    app = FastAPI(
        title="parley gateway",
        summary="Durable, streamable, steerable LLM-agent conversations over HTTP.",
        version="1",
        lifespan=lifespan,
        docs_url=None,  # Swagger UI loads its scripts from a CDN: offline it is a blank page
        redoc_url=None,
    )
    feeds = Feeds(client)
    ends = EndsWatcher(client.coordinator)
    heavy = HeavyWork(threads=settings.heavy_threads, per_tenant=settings.tenant_heavy)
    app.state.client = client
    app.state.settings = settings
    app.state.feeds = feeds
    app.state.ends = ends
    app.state.heavy = heavy
    install_error_handlers(app)
    app.include_router(native.router)
    app.include_router(agui.router)
    app.include_router(aisdk.router)
    app.include_router(responses.router)
    app.include_router(mcp.router)
    app.router.routes.extend(a2a_routes(client, feeds, settings))
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(schedules.router)
    app.include_router(operations.router)
    app.include_router(page.router)
    page.mount_static(app)
    app.state.openai_paths = openai_paths([responses.router, files.router, batches.router])
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    _add_middleware(app, settings)
    _trace_requests(app)
    return app


def _add_middleware(app: FastAPI, settings: GatewaySettings) -> None:
    """Each added outside the ones before: the access log sees every answer, a GET's JSON
    answer is tagged (or a 304) with the JSON headers on it, the JSON headers go on
    every JSON answer (the refusals of the middleware inside too), CORS
    answers a preflight before any token is asked for, the token is checked before
    anything else of a request (its body above all), a tenant's bounds count its
    requests from then on, and the body and upload limits see every body."""
    upload_paths = frozenset({files.UPLOAD_PATH})
    app.add_middleware(
        UploadLimits,
        paths=upload_paths,
        bounds=UploadBounds(
            max_file=settings.max_file,
            floor_seconds=settings.body_timeout_seconds,
            rate=settings.upload_rate,
            per_tenant=settings.tenant_uploads,
            spool=settings.upload_spool,
            quota=settings.tenant_storage,
        ),
        stored=app.state.client.store.stored_bytes,
    )
    app.add_middleware(
        BodyLimit,
        limit=settings.max_body,
        timeout=settings.body_timeout_seconds,
        uploads=upload_paths,
    )
    app.add_middleware(
        TenantLimits, requests=settings.tenant_requests, streams=settings.tenant_streams
    )
    app.add_middleware(Authentication, tokens=TokenTable(settings.tokens))
    if settings.cors_origins:
        app.add_middleware(
            Cors,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "PATCH", "DELETE", "OPTIONS"],
            allow_headers=[
                "Authorization",
                "Content-Type",
                "Idempotency-Key",
                "If-None-Match",
                "Last-Event-ID",
                "Prefer",
            ],
            expose_headers=["ETag", "Location", "Preference-Applied"],
        )
    app.add_middleware(JsonHeaders)
    app.add_middleware(ConditionalGet)
    app.add_middleware(AccessLog)


def _trace_requests(app: FastAPI) -> None:
    """With tracing on, a server span per request (OpenTelemetry's FastAPI
    instrumentation, outermost), in the caller's trace when its ``traceparent`` names
    one: a submission's span, and so its turn's, hangs under it.  Not for probes and
    metrics, and no span per chunk an event stream sends."""
    if tracing.tracer() is None:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app, excluded_urls="/healthz,/readyz,/metrics", exclude_spans=["receive", "send"]
    )


class Cors(CORSMiddleware):
    """Starlette's CORS, with a refused preflight in the error form (it answers text)."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        reason = bytes(response.body).decode("utf-8", "replace")  # "Disallowed CORS origin"
        headers = {
            name: value
            for name, value in response.headers.items()
            if name not in ("content-length", "content-type")
        }
        return error_response(
            response.status_code,
            "InvalidRequest",
            f"the CORS preflight is refused: {reason.removeprefix('Disallowed CORS ')} "
            "not allowed (PARLEY_GATEWAY_CORS_ORIGINS)",
            headers,
        )


class JsonHeaders:
    """:data:`JSON_HEADERS` on every JSON answer, a refusal made before any route
    included (a header the answer sets itself is kept)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if headers.get("content-type", "").startswith("application/json"):
                    for name, value in JSON_HEADERS.items():
                        headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, sending)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, plus every event kind's payload schema (``<Kind>Payload``) and
    the event envelope whose ``data`` is one of them."""
    if app.openapi_schema:
        return app.openapi_schema
    document = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    variants = []
    for kind in PAYLOADS:
        # The wire form is what a reader validates (``index`` for a step's number, the
        # fields with defaults optional), and its nested types get an ``Event`` prefix so
        # that none collides with a resource's name (``Usage``).
        payload = payload_adapter(kind).json_schema(
            ref_template="#/components/schemas/Event{model}", mode="validation"
        )
        for name, definition in payload.pop("$defs", {}).items():
            schemas[f"Event{name}"] = definition
        name = f"{kind.value.title().replace('_', '')}Payload"
        schemas[name] = payload
        variants.append(
            {
                "type": "object",
                "required": ["turn_id", "seq", "kind", "data"],
                "properties": {
                    "turn_id": {"type": "string"},
                    "seq": {"type": "integer", "minimum": 1},
                    "kind": {"const": kind.value},
                    "data": {"$ref": f"#/components/schemas/{name}"},
                },
            }
        )
    schemas["Event"] = {
        "description": "One event of a turn (Event.to_json()), by kind.",
        "oneOf": variants,
        "discriminator": {"propertyName": "kind"},
    }
    schemas["ServerSentEvent"] = {
        "description": "One event of a turn's event stream: `id` its seq, `event` its "
        "kind, `data` the Event as JSON.",
        "type": "object",
        "required": ["id", "event", "data"],
        "properties": {
            "id": {"type": "string", "pattern": "^[1-9][0-9]*$"},
            "event": {"type": "string", "enum": [kind.value for kind in PAYLOADS]},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {"$ref": "#/components/schemas/Event"},
            },
        },
    }
    _parameters_are_never_null(document)
    app.openapi_schema = document
    return document


def _parameters_are_never_null(document: dict[str, Any]) -> None:
    """An optional query or header parameter is absent or a value: FastAPI declares one
    typed ``X | None`` as ``anyOf: [X, null]``, which a client reads as 'send null' and
    the gateway refuses (``after=null`` is not a seq).  Such a schema becomes ``X``."""
    for item in document.get("paths", {}).values():
        for operation in item.values():
            for parameter in operation.get("parameters", ()):
                schema = parameter.get("schema", {})
                options = [o for o in schema.get("anyOf", ()) if o != {"type": "null"}]
                if "anyOf" in schema and len(options) == 1:
                    rest = {k: v for k, v in schema.items() if k != "anyOf"}
                    parameter["schema"] = {**rest, **options[0]}


class AccessLog:
    """One line per request: method, path (never the query string, which may carry the
    page's token), status and duration.  uvicorn's own access log is off.

    Each request is an open log scope (:func:`parley.telemetry.log_context.log_scope`): once a
    route has resolved the session or turn it is about, every line it logs, this one
    included, carries their ids."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with log_scope():
            try:
                await self.app(scope, receive, sending)
            finally:
                access_log.info(
                    "%s %s %d %.1fms",
                    scope["method"],
                    scope["path"],
                    status,
                    (time.perf_counter() - started) * 1000,
                )


__all__ = ["create_app"]
