"""``parley gateway``: the application on uvicorn, bound where it may be.

Without configured tokens the gateway binds loopback only and prints the page's URL
with its local token (kept across restarts, :mod:`parley.gateway.local_token`); it
refuses any other address, so a forgotten ``PARLEY_GATEWAY_TOKENS`` cannot expose a
machine's agent to its network.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import resource
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import uvicorn

from parley.client import Client
from parley.errors import InvalidRequest
from parley.gateway.app import create_app
from parley.gateway.http_protocol import ConnectionCaps, protocol_with
from parley.gateway.local_token import TOKEN_FILE
from parley.gateway.settings import GatewaySettings

DEFAULT_PORT = 8000
SPARE_FILES = 256
"""Open files a gateway needs beside its connections (database, Redis, logs, uploads)."""

log = logging.getLogger("parley.gateway")


@dataclass(frozen=True, kw_only=True)
class Bind:
    """Where to listen."""

    host: str
    port: int

    @classmethod
    def parse(cls, value: str | None, default_port: int = DEFAULT_PORT) -> Bind:
        """``HOST:PORT`` (``[v6]:PORT``); default ``127.0.0.1:default_port`` (the
        settings' ``PORT``, default 8000)."""
        if not value:
            return cls(host="127.0.0.1", port=default_port)
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

    def listen(self) -> socket.socket:
        """A socket bound here, for uvicorn to serve on.  Bound before anything else is
        opened, so that an address in use is one line saying how to choose another,
        not a traceback after the database's log."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listening = socket.socket(family, socket.SOCK_STREAM)
        # As uvicorn binds: a port whose last gateway just stopped is free at once.
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listening.bind((self.host, self.port))
        except OSError as exc:
            listening.close()
            where = f"{self._host}:{self.port}"
            if exc.errno == errno.EADDRINUSE:
                other = self.port + 1 if self.port < 65535 else self.port - 1
                raise InvalidRequest(
                    f"{where} is in use (another gateway?): choose another port, "
                    f"--bind {self._host}:{other} or PORT={other}"
                ) from None
            raise InvalidRequest(f"cannot listen on {where}: {exc.strerror or exc}") from None
        return listening

    def url(self, port: int | None = None) -> str:
        """The base URL of the page at this address."""
        return f"http://{self._host}:{port or self.port}/"

    @property
    def _host(self) -> str:
        """The host as a URL spells it (an IPv6 address in brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host


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


def admitted(settings: GatewaySettings, bind: Bind, *, new_token: bool = False) -> GatewaySettings:
    """The settings to serve at ``bind``: as they are with configured tokens; without,
    loopback only, with the local token (``new_token``: a new one replaces the kept one).
    :class:`InvalidRequest` for any other address, or ``new_token`` with configured
    tokens.  Call it before opening anything: a refused start changes nothing."""
    if not settings.loopback_only:
        if new_token:
            raise InvalidRequest(
                "--new-token renews the local token, which the gateway has only without "
                "PARLEY_GATEWAY_TOKENS"
            )
        return settings
    if not bind.loopback:
        raise InvalidRequest(
            f"refusing to bind {bind.host}: without PARLEY_GATEWAY_TOKENS the gateway "
            "serves loopback only (set tokens, or --bind 127.0.0.1:PORT)"
        )
    return settings.with_local_token(new=new_token)


def serve(
    client: Client,
    bind: Bind,
    listening: socket.socket,
    settings: GatewaySettings,
    *,
    out: TextIO = sys.stdout,
) -> int:
    """Serve on ``listening`` (:meth:`Bind.listen`) until interrupted, with the settings
    :func:`admitted` gave; the exit status."""

    def announce(port: int) -> None:
        url = bind.url(port)
        if settings.generated_token:
            url += f"?token={settings.generated_token}"
        lines = []
        if settings.generated_token:
            path = settings.workspaces / TOKEN_FILE
            lines.append(f"parley gateway: the token is kept in {path} (--new-token renews it)")
        else:
            lines.append("parley gateway: with a token from PARLEY_GATEWAY_TOKENS")
        # Last, on a line of its own: what a person looks for, below uvicorn's log.
        lines.append(f"parley gateway: open {url}")
        out.write("\n".join(lines) + "\n")
        out.flush()

    room_for_connections(settings.connections)
    caps = ConnectionCaps(total=settings.connections, per_client=settings.client_connections)
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
        http=protocol_with(settings.header_timeout_seconds, caps),
    )
    server = _Server(config, announce)
    # run(), not asyncio.run(serve()): run() takes the event loop uvicorn's config names
    # (uvloop, installed with uvicorn's standard extra); asyncio.run would take asyncio's.
    server.run(sockets=[listening])
    return 0 if server.started else 1


def room_for_connections(connections: int) -> None:
    """Raise this process's limit of open files to hold ``connections`` and what else
    it opens, as far as the system's hard limit allows (a connection past the limit
    would fail to be accepted, unanswered, where past PARLEY_GATEWAY_CONNECTIONS it is
    answered); say so once if it cannot."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + SPARE_FILES
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    if raised < wanted:
        log.warning(
            "this process may open %d files (the system's hard limit): fewer than "
            "PARLEY_GATEWAY_CONNECTIONS (%d) and %d more; lower it, or raise the limit",
            raised,
            connections,
            SPARE_FILES,
        )
