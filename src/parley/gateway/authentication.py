"""Every ``/v1`` request's bearer token, checked before anything else of the request is
read (docs/security.md#1-tokens-before-bodies).

FastAPI reads a route's body before it resolves the route's dependencies: with the
token checked there, a client without one made the gateway spool a whole upload to
disk, or wait as long as it liked for a body, before hearing ``401``.  Here the token
is checked as soon as the request's head has arrived: a request without one the gateway
knows is ``401`` at once, in the form of the route it is for, its body unread and its
connection closed.  The tenant a token names is the request's from then on
(:func:`tenant_of`): the tenant's bounds count the request and its routes serve it.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Receive, Scope, Send

from parley.gateway.errors import GatewayError, refusal, unauthorized
from parley.gateway.tenants import TokenTable

PROTECTED = re.compile(r"/(v1|mcp|a2a|tasks)(/|:|$)|/message:|/extendedAgentCard$")
"""The paths that need a token: the whole API, the MCP server and A2A's routes (the page,
probes, metrics and the Agent Card are outside)."""
TENANT = "parley.tenant"
"""Where the request's tenant is kept in its scope's state."""


class Authentication:
    """ASGI middleware: a ``/v1`` request without a bearer token ``tokens`` knows is
    ``401``, before anything reads its body; one with is the token's tenant's."""

    def __init__(self, app: ASGIApp, tokens: TokenTable) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not PROTECTED.match(scope["path"]):
            await self.app(scope, receive, send)
            return
        found = self._tenant(scope)
        if isinstance(found, GatewayError):
            await refusal(scope, found, unread_body=True)(scope, receive, send)
            return
        scope.setdefault("state", {})[TENANT] = found
        await self.app(scope, receive, send)

    def _tenant(self, scope: Scope) -> str | GatewayError:
        """The tenant of the request's token, or the refusal of a request without one
        (the first ``Authorization`` header counts; its scheme in any case, RFC 7235)."""
        header = next((v for n, v in scope["headers"] if n == b"authorization"), b"")
        scheme, _, credentials = header.decode("latin-1").partition(" ")
        credentials = credentials.strip()
        if scheme.lower() != "bearer" or not credentials:
            return unauthorized("this needs an Authorization: Bearer token")
        tenant = self.tokens.tenant_of(credentials)
        if tenant is None:
            return unauthorized("the bearer token is not one this gateway knows")
        return tenant


def tenant_of(scope: Scope) -> str | None:
    """The tenant :class:`Authentication` found the request to be of (None outside
    ``/v1``)."""
    found: str | None = scope.get("state", {}).get(TENANT)
    return found


__all__ = ["PROTECTED", "Authentication", "tenant_of"]
