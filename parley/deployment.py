"""Embedded or fleet: the one decision of which kind of client a database gets.

A fleet's workers share a PostgreSQL database and a Redis: a client of such a database
with a Redis URL (given, or ``PARLEY_REDIS_URL``) is a fleet producer.  A SQLite client
is always embedded, and an exported ``PARLEY_REDIS_URL`` (meant for the fleet) does not
make it a producer.  ``parley.connect`` and the command line both decide by this.
"""

from __future__ import annotations

import os

from parley.errors import InvalidRequest
from workers.store.database import create_database_engine


def fleet_redis_url(dialect: str, redis_url: str | None = None) -> str | None:
    """The Redis URL that makes a client of a ``dialect`` database (SQLAlchemy's name for
    it) a fleet producer: ``redis_url``, else ``PARLEY_REDIS_URL``; None when the client
    is embedded.  A Redis URL given for SQLite is refused."""
    if dialect == "sqlite":
        if redis_url:
            raise InvalidRequest("a fleet client needs PostgreSQL, not SQLite")
        return redis_url
    return redis_url or os.environ.get("PARLEY_REDIS_URL") or None


def is_fleet(database_url: str) -> bool:
    """Whether ``parley.connect(database_url)`` makes a fleet producer (this environment's
    ``PARLEY_REDIS_URL`` deciding)."""
    engine = create_database_engine(database_url)
    try:
        return fleet_redis_url(engine.dialect.name) is not None
    finally:
        engine.dispose()
