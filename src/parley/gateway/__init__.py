"""The HTTP gateway (``parley gateway``, docs/http.md): the whole interface over HTTP, events as
Server-Sent Events, tenants by bearer token, and a web page.  :func:`create_app` builds
the ASGI application on a client; ``parley gateway`` serves it with uvicorn."""

from parley.gateway.app import create_app
from parley.gateway.settings import GatewaySettings

__all__ = ["GatewaySettings", "create_app"]
