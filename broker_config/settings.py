"""Fleet settings, from the environment only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from schemas.errors import InvalidRequest
from workers import constants as c


@dataclass(frozen=True, kw_only=True)
class FleetSettings:
    """Where the fleet's state, signals and kicks live."""

    database_url: str
    redis_url: str
    broker_url: str
    host: str | None
    queue: str = c.TURN_QUEUE
    sweep_seconds: float = c.SWEEP_SECONDS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FleetSettings:
        """``PARLEY_DATABASE_URL``, ``PARLEY_REDIS_URL``, ``PARLEY_HOST``, and optionally
        ``PARLEY_BROKER_URL`` (default: the Redis URL), ``PARLEY_QUEUE`` and
        ``PARLEY_SWEEP_SECONDS``."""
        env = os.environ if env is None else env
        missing = [k for k in ("PARLEY_DATABASE_URL", "PARLEY_REDIS_URL") if not env.get(k)]
        if missing:
            raise InvalidRequest(f"the fleet needs {', '.join(missing)} in the environment")
        redis_url = env["PARLEY_REDIS_URL"]
        try:
            sweep_seconds = float(env.get("PARLEY_SWEEP_SECONDS", c.SWEEP_SECONDS))
        except ValueError:
            raise InvalidRequest("PARLEY_SWEEP_SECONDS must be a number") from None
        return cls(
            database_url=env["PARLEY_DATABASE_URL"],
            redis_url=redis_url,
            broker_url=env.get("PARLEY_BROKER_URL") or redis_url,
            host=env.get("PARLEY_HOST") or None,
            queue=env.get("PARLEY_QUEUE") or c.TURN_QUEUE,
            sweep_seconds=sweep_seconds,
        )
