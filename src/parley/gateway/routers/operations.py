"""The operations routes, outside ``/v1``: liveness (``/healthz``), readiness
(``/readyz``: the database, and Redis on a fleet) and Prometheus's ``/metrics``."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from starlette.responses import Response

from parley.gateway import resources as r
from parley.gateway.dependencies import ClientDep, SettingsDep, bearer
from parley.gateway.errors import unauthorized
from parley.metrics_export import exposition

router = APIRouter()


@router.get("/healthz", response_model=r.Health, tags=["operations"])
def healthz() -> r.Health:
    """Liveness: the process answers."""
    return r.Health(status="ok")


@router.get(
    "/readyz",
    response_model=r.Health,
    tags=["operations"],
    responses={503: {"model": r.Health, "description": "A dependency does not answer"}},
)
def readyz(client: ClientDep) -> JSONResponse:
    """Readiness: ``200`` only while the database (and Redis, on a fleet) answer."""
    checks = {"database": "ok" if client.ping() else "unavailable"}
    if client.fleet:
        checks["redis"] = "ok" if client.coordinator.ping() else "unavailable"
    ready = all(value == "ok" for value in checks.values())
    body = r.Health(status="ok" if ready else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


# Outside /v1 and open by default, like /healthz: it holds no tenant's data (counts,
# and the host's model, tool and rule names), and a tenant's token is the wrong key
# for numbers about every tenant.  A gateway reachable from where its metrics should
# not be names a token of their own, PARLEY_METRICS_TOKEN, which a scraper sends.
@router.get("/metrics", include_in_schema=False)
def metrics(
    request: Request,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Response:
    """Prometheus's text exposition of this process's metrics."""
    if settings.metrics_token:
        expected = settings.metrics_token.encode()
        given = credentials.credentials if credentials is not None else ""
        if not hmac.compare_digest(expected, given.encode("utf-8", "surrogateescape")):
            raise unauthorized("/metrics needs the bearer token PARLEY_METRICS_TOKEN names")
    body, content_type = exposition(request.headers.get("accept"))
    return Response(body, media_type=content_type)
