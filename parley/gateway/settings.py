"""The gateway's configuration, read from the environment once at start.

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
``PARLEY_GATEWAY_TENANT_REQUESTS`` and ``PARLEY_GATEWAY_TENANT_STREAMS`` (default 64 and
16): how many requests one tenant may have in flight, and how many of them streams.
``PARLEY_METRICS_TOKEN``: the bearer token ``GET /metrics`` then asks for (without, it is
open, like ``/healthz``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from parley.errors import InvalidRequest
from parley.gateway.local_token import local_token

LOCAL_TENANT = "local"
DEFAULT_MAX_BODY = 1 << 20
# A batch's input file (OpenAI's limit for one: 200 MB).
DEFAULT_MAX_FILE = 200 << 20
DEFAULT_KEEPALIVE_SECONDS = 15.0
DEFAULT_HEADER_TIMEOUT_SECONDS = 10.0
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0
# A tenant is an application, whose users each may follow a turn: its bounds are what
# one gateway process can give one tenant and still serve the others, not one person's.
DEFAULT_TENANT_REQUESTS = 2000
DEFAULT_TENANT_STREAMS = 1000
# A tenant's name is a directory under PARLEY_WORKSPACES, and a workspace's a directory
# under that: one pattern for both, which no path trick gets through.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
NAME = re.compile(NAME_PATTERN)
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
    header_timeout_seconds: float = DEFAULT_HEADER_TIMEOUT_SECONDS
    """How long a request's head (request line and headers) may take to arrive."""
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    """How long a request's body may take to arrive, once its head has."""
    tenant_requests: int = DEFAULT_TENANT_REQUESTS
    """How many requests one tenant may have in flight at once."""
    tenant_streams: int = DEFAULT_TENANT_STREAMS
    """How many of them may be streams (or waits for a turn)."""
    generated_token: str | None = None
    """The local token, when no token was configured (loopback only)."""
    metrics_token: str | None = None
    """The bearer token ``GET /metrics`` asks for (None: it is open)."""
    sample_files: bool = False
    """A workspace the gateway makes starts with sample files (``sample_files.py``):
    set by ``parley gateway`` when it runs the offline scripted agent."""

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> GatewaySettings:
        """The settings the variables name; :class:`InvalidRequest` naming the variable
        that is wrong.  Without configured tokens there are none yet: the server adds the
        local token once it knows it may serve (:meth:`with_local_token`)."""
        return cls(
            tokens=parse_tokens(env.get("PARLEY_GATEWAY_TOKENS", "")),
            workspaces=Path(env.get("PARLEY_WORKSPACES") or "workspaces").absolute(),
            max_body=_positive_int(env, "PARLEY_GATEWAY_MAX_BODY", DEFAULT_MAX_BODY),
            max_file=_positive_int(env, "PARLEY_GATEWAY_MAX_FILE", DEFAULT_MAX_FILE),
            keepalive_seconds=_positive_float(
                env, "PARLEY_GATEWAY_KEEPALIVE", DEFAULT_KEEPALIVE_SECONDS
            ),
            cors_origins=tuple(
                origin.strip()
                for origin in env.get("PARLEY_GATEWAY_CORS_ORIGINS", "").split(",")
                if origin.strip()
            ),
            header_timeout_seconds=_positive_float(
                env, "PARLEY_GATEWAY_HEADER_TIMEOUT", DEFAULT_HEADER_TIMEOUT_SECONDS
            ),
            body_timeout_seconds=_positive_float(
                env, "PARLEY_GATEWAY_BODY_TIMEOUT", DEFAULT_BODY_TIMEOUT_SECONDS
            ),
            tenant_requests=_positive_int(
                env, "PARLEY_GATEWAY_TENANT_REQUESTS", DEFAULT_TENANT_REQUESTS, "requests"
            ),
            tenant_streams=_positive_int(
                env, "PARLEY_GATEWAY_TENANT_STREAMS", DEFAULT_TENANT_STREAMS, "streams"
            ),
            metrics_token=_metrics_token(env),
        )

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


def _metrics_token(env: Mapping[str, str]) -> str | None:
    token = env.get("PARLEY_METRICS_TOKEN", "").strip()
    if token and not TOKEN.fullmatch(token):
        raise InvalidRequest(
            "PARLEY_METRICS_TOKEN must be at least 16 characters from A-Z a-z 0-9 - . _ ~ + /"
        )
    return token or None


def _positive_int(env: Mapping[str, str], name: str, default: int, unit: str = "bytes") -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be a whole number of {unit}, not {raw!r}") from None
    if value < 1:
        raise InvalidRequest(f"{name} must be positive, not {value}")
    return value


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be a number of seconds, not {raw!r}") from None
    if not 0 < value < 3600:
        raise InvalidRequest(f"{name} must be between 0 and 3600 seconds, not {value}")
    return value
