"""Every FastAPI dependency of the gateway's routes, each an ``Annotated`` alias a route
declares in its signature: the client (:data:`ClientDep`), the settings
(:data:`SettingsDep`), the process's shared feeds (:data:`FeedsDep`), both at once for a
route that streams a turn (:data:`StreamsDep`), the threads of heavy work
(:data:`HeavyDep`), and the request's tenant (:data:`Tenant`, the one that can refuse:
401 without a known bearer token)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from parley.client import Client
from parley.gateway.authentication import tenant_of
from parley.gateway.ends_watch import EndsWatcher
from parley.gateway.errors import unauthorized
from parley.gateway.feeds import Feeds
from parley.gateway.settings import GatewaySettings
from parley.gateway.work import HeavyWork

bearer = HTTPBearer(auto_error=False, description="A token from PARLEY_GATEWAY_TOKENS")
"""The ``Authorization: Bearer`` credentials, if any (the OpenAPI document's scheme)."""


# The app's own objects are read on the event loop (async: no thread for a lookup).
async def client_of(request: Request) -> Client:
    """The gateway's client (embedded or fleet)."""
    client: Client = request.app.state.client
    return client


async def settings_of(request: Request) -> GatewaySettings:
    """The gateway's settings."""
    settings: GatewaySettings = request.app.state.settings
    return settings


async def feeds_of(request: Request) -> Feeds:
    """The process's feeds."""
    feeds: Feeds = request.app.state.feeds
    return feeds


async def heavy_of(request: Request) -> HeavyWork:
    """The process's threads of heavy work."""
    heavy: HeavyWork = request.app.state.heavy
    return heavy


async def ends_of(request: Request) -> EndsWatcher:
    """The process's watcher of the ends of turns requests wait for."""
    ends: EndsWatcher = request.app.state.ends
    return ends


@dataclass(frozen=True)
class TurnStreams:
    """What a route that streams a turn's events needs: the process's shared feeds, and
    the settings (a stream's keep-alive)."""

    feeds: Feeds
    settings: GatewaySettings


async def turn_streams_of(request: Request) -> TurnStreams:
    """The feeds and settings a turn's stream is made with."""
    return TurnStreams(await feeds_of(request), await settings_of(request))


async def tenant(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> str:
    """The tenant of the request's bearer token, checked before anything else of the
    request was read (``authentication.Authentication``; ``_credentials`` names the
    scheme in the OpenAPI document): 401 for a route outside what it checks."""
    found = tenant_of(request.scope)
    if found is None:
        raise unauthorized("this needs an Authorization: Bearer token")
    return found


ClientDep = Annotated[Client, Depends(client_of)]
"""A route parameter: the gateway's client."""

SettingsDep = Annotated[GatewaySettings, Depends(settings_of)]
"""A route parameter: the gateway's settings."""

FeedsDep = Annotated[Feeds, Depends(feeds_of)]
"""A route parameter: the process's shared feeds of turns' events (``feeds.Feeds``)."""

EndsDep = Annotated[EndsWatcher, Depends(ends_of)]
"""A route parameter: the process's watcher of turns' ends (``ends_watch.EndsWatcher``)."""

HeavyDep = Annotated[HeavyWork, Depends(heavy_of)]
"""A route parameter: the threads heavy work runs on (``work.HeavyWork``)."""

StreamsDep = Annotated[TurnStreams, Depends(turn_streams_of)]
"""A route parameter: the feeds and settings a turn's stream is made with."""

Tenant = Annotated[str, Depends(tenant)]
"""A route parameter: the tenant of the request's bearer token (401 without one)."""
