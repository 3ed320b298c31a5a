"""Embedded or fleet: the one decision of which kind of client a database gets.

A fleet's workers share a PostgreSQL database and a Redis: a client of such a database
with a Redis URL (given, or ``PARLEY_REDIS_URL``) is a fleet producer.  A SQLite client
is always embedded, and an exported ``PARLEY_REDIS_URL`` (meant for the fleet) does not
make it a producer.  ``parley.connect``, the command line and ``parley status`` all decide by this.

Embedded work on this machine has a tenant of its own, :data:`LOCAL_TENANT`: the gateway's
without configured tokens, and the command line's (docs/gateway.md#the-web-page).
"""

from __future__ import annotations

from parley.errors import InvalidRequest
from parley.settings import Settings
from parley.store.database import create_database_engine

LOCAL_TENANT = "local"
"""The tenant of this machine's own work: the gateway's local token names it (when no
``PARLEY_GATEWAY_TOKENS`` are set), and the sessions and batches the command line makes
embedded, with no ``--tenant``, belong to it, so the page shows them."""


def fleet_redis_url(dialect: str, redis_url: str | None, settings: Settings) -> str | None:
    """The Redis URL that makes a client of a ``dialect`` database (SQLAlchemy's name for
    it) a fleet producer: ``redis_url``, else ``settings``' ``PARLEY_REDIS_URL``; None
    when the client is embedded.  A Redis URL given for SQLite is refused."""
    if dialect == "sqlite":
        if redis_url:
            raise InvalidRequest("a fleet client needs PostgreSQL, not SQLite")
        return redis_url
    return redis_url or settings.redis_url or None


def is_fleet(database_url: str, settings: Settings) -> bool:
    """Whether ``parley.connect(database_url)`` makes a fleet producer (``settings``'
    ``PARLEY_REDIS_URL`` deciding)."""
    engine = create_database_engine(database_url)
    try:
        return fleet_redis_url(engine.dialect.name, None, settings) is not None
    finally:
        engine.dispose()
