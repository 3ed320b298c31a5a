"""The gateway's configuration: its part of the process's settings, read once at start.

``PARLEY_GATEWAY_TOKENS``: ``TOKEN=TENANT`` pairs, comma-separated, or ``@path`` to a file
with one pair per line (blank lines and ``#`` comments allowed).  Without any, the gateway
serves loopback only, with one token of its own for the tenant ``local``, kept across
restarts (:mod:`parley.gateway.local_token`).
``PARLEY_WORKSPACES`` (default ``./workspaces``): where sessions' roots are made.
``PARLEY_GATEWAY_MAX_BODY`` (bytes, default 1 MiB), ``PARLEY_GATEWAY_MAX_FILE`` (an
uploaded file's bytes, default 200 MiB), ``PARLEY_GATEWAY_KEEPALIVE`` (seconds,
default 15), ``PARLEY_GATEWAY_CORS_ORIGINS`` (comma-separated origins; CORS is off
without).  ``PARLEY_GATEWAY_HEADER_TIMEOUT`` and ``PARLEY_GATEWAY_BODY_TIMEOUT`` (seconds,
default 10 and 30): how long a request's head, then its body, may take to arrive.
``PARLEY_GATEWAY_TENANT_REQUESTS`` and ``PARLEY_GATEWAY_TENANT_STREAMS`` (default 2000 and
1000): how many requests one tenant may have in flight, and how many of them streams.
``PARLEY_GATEWAY_UPLOAD_RATE`` (bytes a second, default 128 KiB): the slowest an upload
may arrive at (its deadline, if longer than the body's).  ``PARLEY_GATEWAY_UPLOAD_SPOOL``
(bytes, default 1 GiB, at least ``PARLEY_GATEWAY_MAX_FILE``) and
``PARLEY_GATEWAY_TENANT_UPLOADS`` (default 2): the uploads in flight in all, and of one
tenant.  ``PARLEY_GATEWAY_CONNECTIONS`` and ``PARLEY_GATEWAY_CLIENT_CONNECTIONS``
(default 4096 and 1024): the connections open at once, in all and from one address.
``PARLEY_TENANT_STORAGE`` (bytes, default 10 GiB): what one tenant's uploads may hold
in the store, fleet-wide.
``PARLEY_GATEWAY_HEAVY_THREADS`` and ``PARLEY_GATEWAY_TENANT_HEAVY`` (default 4 and 2):
the threads of heavy work (uploads stored, batches made, files read out), and how many
of them one tenant's work may hold at once.
``PARLEY_METRICS_TOKEN``: the bearer token ``GET /metrics`` then asks for (without, it is
open, like ``/healthz``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from parley.deployment import LOCAL_TENANT as LOCAL_TENANT  # (its name here too, as before)
from parley.errors import InvalidRequest
from parley.gateway.local_token import local_token
from parley.settings import Settings
from parley.workspaces import NAME, NAME_PATTERN, workspaces_dir

# The defaults are the settings' (parley/settings.py says why each is what it is).
_DEFAULTS = Settings()
DEFAULT_MAX_BODY = _DEFAULTS.gateway_max_body
DEFAULT_MAX_FILE = _DEFAULTS.gateway_max_file
DEFAULT_KEEPALIVE_SECONDS = _DEFAULTS.gateway_keepalive
DEFAULT_HEADER_TIMEOUT_SECONDS = _DEFAULTS.gateway_header_timeout
DEFAULT_BODY_TIMEOUT_SECONDS = _DEFAULTS.gateway_body_timeout
DEFAULT_TENANT_REQUESTS = _DEFAULTS.gateway_tenant_requests
DEFAULT_TENANT_STREAMS = _DEFAULTS.gateway_tenant_streams
DEFAULT_UPLOAD_RATE = _DEFAULTS.gateway_upload_rate
DEFAULT_UPLOAD_SPOOL = _DEFAULTS.gateway_upload_spool
DEFAULT_TENANT_UPLOADS = _DEFAULTS.gateway_tenant_uploads
DEFAULT_TENANT_STORAGE = _DEFAULTS.tenant_storage
DEFAULT_CONNECTIONS = _DEFAULTS.gateway_connections
DEFAULT_CLIENT_CONNECTIONS = _DEFAULTS.gateway_client_connections
DEFAULT_HEAVY_THREADS = _DEFAULTS.gateway_heavy_threads
DEFAULT_TENANT_HEAVY = _DEFAULTS.gateway_tenant_heavy
# What a bearer token may be (RFC 6750's b64token, at least 16 characters): a token that
# would need quoting in a header, or is short enough to guess, is refused at start.
TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]{16,512}=*")


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    """What the gateway serves and how (see the module docstring for the variables)."""

    tokens: Mapping[str, str]
    """Bearer token → tenant: the configured ones, else the local token's (once
    :meth:`with_local_token` added it)."""
    workspaces: Path
    max_body: int = DEFAULT_MAX_BODY
    max_file: int = DEFAULT_MAX_FILE
    keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS
    cors_origins: tuple[str, ...] = ()
    push_hosts: frozenset[str] = frozenset()
    """The hosts an A2A push notification may be posted to (``PARLEY_A2A_PUSH_HOSTS``):
    none, and the gateway serves no push (a tenant could make the fleet post anywhere)."""
    header_timeout_seconds: float = DEFAULT_HEADER_TIMEOUT_SECONDS
    """How long a request's head (request line and headers) may take to arrive."""
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    """How long a request's body may take to arrive, once its head has."""
    tenant_requests: int = DEFAULT_TENANT_REQUESTS
    """How many requests one tenant may have in flight at once."""
    tenant_streams: int = DEFAULT_TENANT_STREAMS
    """How many of them may be streams (or waits for a turn)."""
    upload_rate: int = DEFAULT_UPLOAD_RATE
    """The slowest an upload may arrive at, in bytes a second."""
    upload_spool: int = DEFAULT_UPLOAD_SPOOL
    """The bytes the uploads in flight may declare in all (their temporary files)."""
    tenant_uploads: int = DEFAULT_TENANT_UPLOADS
    """How many uploads one tenant may have in flight at once."""
    tenant_storage: int = DEFAULT_TENANT_STORAGE
    """The bytes one tenant's uploads may hold in the store (its quota)."""
    connections: int = DEFAULT_CONNECTIONS
    """How many connections the process keeps open at once."""
    client_connections: int = DEFAULT_CLIENT_CONNECTIONS
    """How many of them one peer address may hold."""
    heavy_threads: int = DEFAULT_HEAVY_THREADS
    """The threads heavy work runs on (``work.HeavyWork``)."""
    tenant_heavy: int = DEFAULT_TENANT_HEAVY
    """How many of them one tenant's heavy work may hold at once."""
    generated_token: str | None = None
    """The local token, when no token was configured (loopback only)."""
    metrics_token: str | None = None
    """The bearer token ``GET /metrics`` asks for (None: it is open)."""
    sample_files: bool = False
    """A workspace the gateway makes starts with sample files (``sample_files.py``):
    set by ``parley gateway`` when it runs the offline scripted agent."""
    agents_host: str | None = None
    """``PARLEY_HOST``: on a fleet (whose gateway runs no turns) the host whose agents the
    gateway offers as MCP tools and A2A skills, read for their declarations only: the
    workers' host, named in the gateway's environment too."""

    @classmethod
    def from_settings(cls, settings: Settings) -> GatewaySettings:
        """The gateway's part of ``settings``; :class:`InvalidRequest` naming the variable
        that is wrong.  Without configured tokens there are none yet: the server adds the
        local token once it knows it may serve (:meth:`with_local_token`)."""
        return cls(
            tokens=parse_tokens(settings.gateway_tokens),
            workspaces=workspaces_dir(settings),
            max_body=settings.gateway_max_body,
            max_file=settings.gateway_max_file,
            keepalive_seconds=settings.gateway_keepalive,
            cors_origins=settings.gateway_cors_origins,
            push_hosts=frozenset(host.lower() for host in settings.a2a_push_hosts),
            header_timeout_seconds=settings.gateway_header_timeout,
            body_timeout_seconds=settings.gateway_body_timeout,
            tenant_requests=settings.gateway_tenant_requests,
            tenant_streams=settings.gateway_tenant_streams,
            upload_rate=settings.gateway_upload_rate,
            upload_spool=settings.gateway_upload_spool,
            tenant_uploads=settings.gateway_tenant_uploads,
            tenant_storage=settings.tenant_storage,
            connections=settings.gateway_connections,
            client_connections=settings.gateway_client_connections,
            heavy_threads=settings.gateway_heavy_threads,
            tenant_heavy=settings.gateway_tenant_heavy,
            metrics_token=_metrics_token(settings.metrics_token),
            agents_host=settings.host,
        )

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> GatewaySettings:
        """The gateway's settings ``env`` names (:meth:`from_settings`)."""
        return cls.from_settings(Settings.from_environment(env))

    @property
    def loopback_only(self) -> bool:
        """No tokens were configured: only this machine may connect."""
        return not self.tokens or self.generated_token is not None

    def with_local_token(self, *, new: bool = False) -> GatewaySettings:
        """These settings with the local token kept in the workspaces directory (made if
        there is none; ``new``: a new one replaces it) as their one token, for the tenant
        ``local``.  Only without configured tokens."""
        if not self.loopback_only:
            raise InvalidRequest(
                "the gateway has a local token only without PARLEY_GATEWAY_TOKENS "
                "(--new-token renews it)"
            )
        token = local_token(self.workspaces, new=new)
        return replace(self, tokens={token: LOCAL_TENANT}, generated_token=token)


def parse_tokens(value: str) -> dict[str, str]:
    """``TOKEN=TENANT`` pairs from ``PARLEY_GATEWAY_TOKENS`` (or the file ``@path``).  The
    error never repeats a token: it says which pair (by position) is wrong."""
    value = value.strip()
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise InvalidRequest(
                f"PARLEY_GATEWAY_TOKENS names {str(path)!r}, which cannot be read: {exc.strerror}"
            ) from None
        pairs = [line.strip() for line in lines]
        pairs = [p for p in pairs if p and not p.startswith("#")]
    else:
        pairs = [p.strip() for p in value.split(",") if p.strip()]
    tokens: dict[str, str] = {}
    for number, pair in enumerate(pairs, 1):
        token, equals, tenant = pair.partition("=")
        token, tenant = token.strip(), tenant.strip()
        where = f"PARLEY_GATEWAY_TOKENS: pair {number}"
        if not equals or not TOKEN.fullmatch(token):
            raise InvalidRequest(
                f"{where} is not TOKEN=TENANT with a token of at least 16 characters "
                "from A-Z a-z 0-9 - . _ ~ + /"
            )
        if not NAME.fullmatch(tenant):
            raise InvalidRequest(f"{where}: the tenant must match {NAME_PATTERN}")
        if token in tokens:
            raise InvalidRequest(f"{where} repeats a token of an earlier pair")
        tokens[token] = tenant
    return tokens


def _metrics_token(token: str | None) -> str | None:
    if token and not TOKEN.fullmatch(token):
        raise InvalidRequest(
            "PARLEY_METRICS_TOKEN must be at least 16 characters from A-Z a-z 0-9 - . _ ~ + /"
        )
    return token or None
