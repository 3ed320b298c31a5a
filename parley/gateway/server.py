"""``parley gateway``: the application on uvicorn, bound where it may be.

Without configured tokens the gateway binds loopback only and prints the page's URL
with the token it generated; it refuses any other address, so a forgotten
``PARLEY_GATEWAY_TOKENS`` cannot expose a machine's agent to its network.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TextIO

import uvicorn

from parley.client import Client
from parley.errors import InvalidRequest
from parley.gateway.app import create_app
from parley.gateway.http_protocol import protocol_with
from parley.gateway.settings import GatewaySettings

DEFAULT_PORT = 8000


@dataclass(frozen=True, kw_only=True)
class Bind:
    """Where to listen."""

    host: str
    port: int

    @classmethod
    def parse(cls, value: str | None, env: Mapping[str, str] = os.environ) -> Bind:
        """``HOST:PORT`` (``[v6]:PORT``); default ``127.0.0.1:$PORT`` (``PORT`` default
        8000)."""
        if not value:
            return cls(host="127.0.0.1", port=_port(env.get("PORT") or str(DEFAULT_PORT)))
        host, colon, port = value.rpartition(":")
        if not colon or not host:
            raise InvalidRequest(f"--bind takes HOST:PORT, not {value!r}")
        return cls(host=host.removeprefix("[").removesuffix("]"), port=_port(port))

    @property
    def loopback(self) -> bool:
        """Whether only this machine can reach the address."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def url(self, port: int | None = None) -> str:
        """The base URL of the page at this address."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port or self.port}/"


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise InvalidRequest(f"not a port: {value!r}") from None
    if not 0 <= port <= 65535:
        raise InvalidRequest(f"not a port: {value!r}")
    return port


class _Server(uvicorn.Server):
    """uvicorn's server, saying where the page is once it listens (on port 0 the URL
    names the port the system chose)."""

    def __init__(self, config: uvicorn.Config, announce: Callable[[int], None]) -> None:
        super().__init__(config)
        self._announce = announce

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            port = self.servers[0].sockets[0].getsockname()[1] if self.servers else 0
            self._announce(port)


def serve(
    client: Client,
    bind: Bind,
    settings: GatewaySettings,
    *,
    out: TextIO = sys.stdout,
    note: str | None = None,
) -> int:
    """Serve until interrupted; the exit status."""
    if settings.loopback_only and not bind.loopback:
        client.close(wait=False)
        raise InvalidRequest(
            f"refusing to bind {bind.host}: without PARLEY_GATEWAY_TOKENS the gateway "
            "serves loopback only (set tokens, or --bind 127.0.0.1:PORT)"
        )

    def announce(port: int) -> None:
        url = bind.url(port)
        if settings.generated_token:
            url += f"?token={settings.generated_token}"
        lines = [f"parley gateway: open {url}"]
        if note:
            lines.append(f"parley gateway: {note}")
        if not settings.generated_token:
            lines.append("parley gateway: with a token from PARLEY_GATEWAY_TOKENS")
        out.write("\n".join(lines) + "\n")
        out.flush()

    # Logging is the command line's (parley.logs): uvicorn's loggers propagate to it.
    config = uvicorn.Config(
        create_app(client, settings),
        host=bind.host,
        port=bind.port,
        access_log=False,  # parley's own access log leaves query strings out (tokens)
        log_config=None,
        timeout_graceful_shutdown=5,
        # A page left open holds an event stream; shutdown must not wait on it forever.
        timeout_keep_alive=30,
        # h11, with a deadline on each request's head (httptools, uvicorn's choice when
        # installed, has none either, and refuses in text).
        http=protocol_with(settings.header_timeout_seconds),
    )
    server = _Server(config, announce)
    # run(), not asyncio.run(serve()): run() takes the event loop uvicorn's config names
    # (uvloop, installed with uvicorn's standard extra); asyncio.run would take asyncio's.
    server.run()
    return 0 if server.started else 1
