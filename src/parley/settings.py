"""Every ``PARLEY_*`` variable parley reads, read once where a process starts.

:meth:`Settings.from_environment` is the one place parley reads its configuration from
the environment (docs/reference.md#configuration lists the variables): the command line,
a worker, the sweeper, the gateway and ``parley.connect()`` build a :class:`Settings` as
they start and pass it, or the values cut from it, down; the engine and the store take
values, never the environment.  A value that does not parse stops the start on one
error naming its variable, before anything runs.

It parses scalars: numbers (through one reader, :func:`_number`), flags, choices and
text.  What a value's structure means (``PARLEY_GATEWAY_TOKENS``'s pairs,
``PARLEY_MODEL_LIMITS``, ``PARLEY_HOST``'s module) is for the module that uses it, which
checks it as the process starts too.

This module stands under every other layer: it imports only the standard library and
the error hierarchy (so a bad value is the same ``InvalidRequest`` it always was).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from parley.schemas.errors import InvalidRequest

PROVIDER_VARIABLES = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
)
"""The model providers' credentials and endpoints: kept for the models parley makes,
never stored or logged (the field holding them is left out of the repr)."""

TELEMETRY_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)
"""The standard OpenTelemetry variables parley looks at, to decide whether it traces
(the SDK reads these and the others itself, as it starts exporting)."""

DAY = 86_400


# Readers: each takes the variable's name and its text (not blank).

Reader = Callable[[str, str], Any]


def _number(
    *,
    whole: bool = False,
    least: float = 0.0,
    above: bool = True,
    most: float = math.inf,
    below: bool = False,
    unit: str = "",
) -> Callable[[str, str], float]:
    """The one number reader: a finite number (whole with ``whole``) from ``least``
    (excluded with ``above``) up to ``most`` (excluded with ``below``)."""
    number = "whole number" if whole else "number"
    positive = above and least == 0
    bounds = [] if positive else [f"{'more than' if above else 'at least'} {_shown(least)}"]
    if most < math.inf:
        bounds.append(f"{'below' if below else 'at most'} {_shown(most)}")
    what = f"{'a positive' if positive else 'a'} {number}{f' of {unit}' if unit else ''}"
    what += f" {' and '.join(bounds)}" if bounds else ""

    def read(name: str, raw: str) -> float:
        text = raw.strip()
        try:
            value = float(int(text)) if whole else float(text)
        except ValueError:
            value = _integral(text) if whole else math.nan
        low_ok = value > least if above else value >= least
        high_ok = value < most if below else value <= most
        if not (low_ok and high_ok and math.isfinite(value)):  # (NaN is neither)
            raise InvalidRequest(f"{name} must be {what}, not {raw!r}")
        return int(value) if whole else value

    return read


def _shown(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def _integral(text: str) -> float:
    """``3.0`` as a whole number (as the webhook and replay settings always took it)."""
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if value.is_integer() else math.nan


def _flag(name: str, raw: str) -> bool:
    text = raw.strip()
    if text not in ("0", "1"):
        raise InvalidRequest(f"{name} must be 1 or 0, not {raw!r}")
    return text == "1"


def _choice(*choices: str, lower: bool = False) -> Callable[[str, str], str]:
    def read(name: str, raw: str) -> str:
        text = raw.strip().lower() if lower else raw
        if text not in choices:
            raise InvalidRequest(f"{name} must be {' or '.join(choices)}, not {raw!r}")
        return text

    return read


def _switch(name: str, raw: str) -> bool:
    return _choice("on", "off", lower=True)(name, raw) == "on"


def _text(name: str, raw: str) -> str:
    return raw


def _stripped(name: str, raw: str) -> str | None:
    return raw.strip() or None


def _listed(name: str, raw: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in raw.split(",") if item.strip())


_COUNT = _number(whole=True)
_BYTES = _number(whole=True, unit="bytes")
_SECONDS = _number(unit="seconds")
_GATEWAY_SECONDS = _number(unit="seconds", most=3600, below=True)
# Redis refuses an EXPIRE far enough out; no replay needs more than a year.
_REPLAY_SECONDS = _number(whole=True, unit="seconds", most=365 * DAY)
# Readers see streamed text up to this much later: at most a second.
_FLUSH_SECONDS = _number(unit="seconds", above=False, most=1.0)
_PORT = _number(whole=True, least=0, above=False, most=65535)
_POOLERS = _choice("pgbouncer", "none", lower=True)


def _var(variable: str, read: Reader, default: Any = None, *, secret: bool = False) -> Any:
    """A field read from ``variable`` by ``read`` (its default when unset or blank);
    ``secret``: left out of the repr."""
    return field(default=default, metadata={"variable": variable, "read": read}, repr=not secret)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The process's configuration: each field is the variable named in its metadata
    (``Settings.variables()`` lists them), parsed, or its default."""

    # Where the state, the signals and the kicks live.
    database_url: str | None = _var("PARLEY_DATABASE_URL", _text)
    database_direct_url: str | None = _var("PARLEY_DATABASE_DIRECT_URL", _stripped)
    database_pooler: str | None = _var("PARLEY_DATABASE_POOLER", _POOLERS)
    database_pool_size: int = _var("PARLEY_DATABASE_POOL_SIZE", _COUNT, 10)
    redis_url: str | None = _var("PARLEY_REDIS_URL", _text)
    broker_url: str | None = _var("PARLEY_BROKER_URL", _text)
    broker_queue_type: str = _var(
        "PARLEY_BROKER_QUEUE_TYPE", _choice("quorum", "classic"), "quorum"
    )
    queue: str = _var("PARLEY_QUEUE", _text, "parley.turns")
    # What runs the turns.
    host: str | None = _var("PARLEY_HOST", _text)
    model: str | None = _var("PARLEY_MODEL", _stripped)
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The providers' variables that are set (:data:`PROVIDER_VARIABLES`)."""
    telemetry: Mapping[str, str] = field(default_factory=dict)
    """The OpenTelemetry variables that are set (:data:`TELEMETRY_VARIABLES`)."""
    # The fleet's timing.
    sweep_seconds: float = _var("PARLEY_SWEEP_SECONDS", _SECONDS, 2.0)
    replay_seconds: int = _var("PARLEY_REPLAY_SECONDS", _REPLAY_SECONDS, 3_600)
    stream_flush_seconds: float = _var("PARLEY_STREAM_FLUSH_SECONDS", _FLUSH_SECONDS, 0.05)
    task_events: bool = _var("PARLEY_TASK_EVENTS", _flag, False)
    worker_processes: int | None = _var("PARLEY_WORKER_PROCESSES", _COUNT)
    trace_celery: bool = _var("PARLEY_TRACE_CELERY", _flag, False)
    trace_content: bool = _var("PARLEY_TRACE_CONTENT", _flag, False)
    # Admission and the batch window.
    admission: bool = _var("PARLEY_ADMISSION", _switch, True)
    model_limits: str = _var("PARLEY_MODEL_LIMITS", _text, "")
    tenant_weights: str = _var("PARLEY_TENANT_WEIGHTS", _text, "")
    max_retry_after: float = _var("PARLEY_MAX_RETRY_AFTER", _SECONDS, 60.0)
    batch_window: int = _var("PARLEY_BATCH_WINDOW", _COUNT, 64)
    # The gateway.
    port: int = _var("PORT", _PORT, 8000)
    workspaces: str | None = _var("PARLEY_WORKSPACES", _text)
    gateway_tokens: str = _var("PARLEY_GATEWAY_TOKENS", _text, "", secret=True)
    gateway_max_body: int = _var("PARLEY_GATEWAY_MAX_BODY", _BYTES, 1 << 20)
    # A batch's input file (OpenAI's limit for one: 200 MB).
    gateway_max_file: int = _var("PARLEY_GATEWAY_MAX_FILE", _BYTES, 200 << 20)
    gateway_keepalive: float = _var("PARLEY_GATEWAY_KEEPALIVE", _GATEWAY_SECONDS, 15.0)
    gateway_cors_origins: tuple[str, ...] = _var("PARLEY_GATEWAY_CORS_ORIGINS", _listed, ())
    # Where an A2A push notification may be posted (none: the gateway serves none).
    a2a_push_hosts: tuple[str, ...] = _var("PARLEY_A2A_PUSH_HOSTS", _listed, ())
    gateway_header_timeout: float = _var("PARLEY_GATEWAY_HEADER_TIMEOUT", _GATEWAY_SECONDS, 10.0)
    gateway_body_timeout: float = _var("PARLEY_GATEWAY_BODY_TIMEOUT", _GATEWAY_SECONDS, 30.0)
    # A tenant is an application, whose users each may follow a turn: its bounds are what
    # one gateway process can give one tenant and still serve the others, not one person's.
    gateway_tenant_requests: int = _var("PARLEY_GATEWAY_TENANT_REQUESTS", _COUNT, 2000)
    gateway_tenant_streams: int = _var("PARLEY_GATEWAY_TENANT_STREAMS", _COUNT, 1000)
    # An upload as slow as a 1 Mbit/s line still arrives; 200 MiB may take 27 minutes.
    gateway_upload_rate: int = _var(
        "PARLEY_GATEWAY_UPLOAD_RATE",
        _number(whole=True, unit="bytes a second"),
        128 << 10,
    )
    gateway_upload_spool: int = _var("PARLEY_GATEWAY_UPLOAD_SPOOL", _BYTES, 1 << 30)
    gateway_tenant_uploads: int = _var("PARLEY_GATEWAY_TENANT_UPLOADS", _COUNT, 2)
    # Connections: room for the tenants' streams; an address may hold a quarter of them
    # (an application's backend following its users' turns holds many from one address).
    gateway_connections: int = _var("PARLEY_GATEWAY_CONNECTIONS", _COUNT, 4096)
    gateway_client_connections: int = _var("PARLEY_GATEWAY_CLIENT_CONNECTIONS", _COUNT, 1024)
    # Heavy work holds a database connection each: four of the gateway's fifteen.
    gateway_heavy_threads: int = _var("PARLEY_GATEWAY_HEAVY_THREADS", _COUNT, 4)
    gateway_tenant_heavy: int = _var("PARLEY_GATEWAY_TENANT_HEAVY", _COUNT, 2)
    # Fifty of the largest files (OpenAI's organisations may hold 100 GB).
    tenant_storage: int = _var("PARLEY_TENANT_STORAGE", _BYTES, 10 << 30)
    # Watching.
    log_format: str = _var("PARLEY_LOG_FORMAT", _choice("text", "json"), "text")
    metrics_port: str | None = _var("PARLEY_METRICS_PORT", _stripped)
    metrics_token: str | None = _var("PARLEY_METRICS_TOKEN", _stripped, secret=True)
    # Webhooks.
    webhook_secret: str | None = _var("PARLEY_WEBHOOK_SECRET", _text, secret=True)
    webhook_timeout: float = _var("PARLEY_WEBHOOK_TIMEOUT", _SECONDS, 10.0)
    webhook_max_attempts: int = _var("PARLEY_WEBHOOK_MAX_ATTEMPTS", _COUNT, 40)
    webhook_backoff: float = _var("PARLEY_WEBHOOK_BACKOFF", _SECONDS, 1.0)
    webhook_max_backoff: float = _var("PARLEY_WEBHOOK_MAX_BACKOFF", _SECONDS, 3600.0)
    webhook_concurrency: int = _var("PARLEY_WEBHOOK_CONCURRENCY", _COUNT, 4)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """The settings ``environ`` names (the process's environment by default);
        :class:`InvalidRequest` naming the first variable whose value does not parse."""
        values: dict[str, Any] = {}
        for each in fields(cls):
            variable = each.metadata.get("variable")
            if variable is None:
                continue
            raw = environ.get(variable, "")
            if raw.strip():  # (unset, empty or blank: the default)
                values[each.name] = each.metadata["read"](variable, raw)
        values["credentials"] = {k: environ[k] for k in PROVIDER_VARIABLES if k in environ}
        values["telemetry"] = {k: environ[k] for k in TELEMETRY_VARIABLES if k in environ}
        settings = cls(**values)
        settings._check_together()
        return settings

    @classmethod
    def variables(cls) -> tuple[str, ...]:
        """The name of every variable a :class:`Settings` is read from."""
        named = tuple(f.metadata["variable"] for f in fields(cls) if "variable" in f.metadata)
        return named + PROVIDER_VARIABLES + TELEMETRY_VARIABLES

    def _check_together(self) -> None:
        if self.gateway_upload_spool < self.gateway_max_file:
            raise InvalidRequest(
                f"PARLEY_GATEWAY_UPLOAD_SPOOL ({self.gateway_upload_spool}) must be at least "
                f"PARLEY_GATEWAY_MAX_FILE ({self.gateway_max_file}): a file that large "
                "could never arrive"
            )
