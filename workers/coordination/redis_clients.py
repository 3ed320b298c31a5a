"""Opening a redis-py client for ``PARLEY_REDIS_URL``: one server (``redis://``,
``rediss://``, ``unix://``) or a Redis Cluster (``redis+cluster://HOST:PORT``, or
``rediss+cluster://`` over TLS, naming any one node: the client learns the others).

Both get blocking connection pools (per node, on a cluster): a thread that finds every
connection in use waits for one, as long as a command may take, rather than fail at once
as redis-py's default pool does past its limit ("Too many connections"), which a driver
would take for Redis being down.  Connections are opened as threads need them.

On a cluster every multi-key command parley sends keeps its keys in one hash slot (each
key carries its session or turn as a hash tag: :mod:`workers.coordination.constants`);
redis-py routes each command to the node that holds its slot, follows ``MOVED`` and
``ASK`` as slots move, and refreshes its map of the cluster when a node stops answering
(a replica promoted in its place).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from redis.cluster import RedisCluster

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""parley's schemes for a Redis Cluster, and redis-py's for one of its nodes."""


def is_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster."""
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def check_cluster_url(url: str) -> None:
    """Raise ``ValueError`` unless ``url`` names one node of a cluster: a host and a
    port, database 0 (a cluster has no other), nothing else."""
    parts = urlsplit(url)
    path = parts.path.strip("/")
    if not parts.hostname or parts.port is None:
        raise ValueError(f"a Redis Cluster URL names a node as HOST:PORT, not {_shown(url)!r}")
    if path not in {"", "0"}:
        raise ValueError(f"a Redis Cluster has only database 0, not {path!r} ({_shown(url)})")


def open_client(
    url: str,
    *,
    max_connections: int,
    socket_timeout: float,
    connect_timeout: float | None = None,
) -> Any:
    """A client of the server or cluster ``url``: at most ``max_connections`` connections
    (per node, on a cluster), a command may wait ``socket_timeout`` for a free one and
    for its answer, and ``connect_timeout`` (default: ``socket_timeout``) to connect."""
    options: dict[str, Any] = {
        "max_connections": max_connections,
        "timeout": socket_timeout,  # the blocking pool's wait for a free connection
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout or socket_timeout,
    }
    parts = urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        return redis.Redis.from_pool(redis.BlockingConnectionPool.from_url(url, **options))
    check_cluster_url(url)
    node_url = parts._replace(scheme=CLUSTER_SCHEMES[parts.scheme], path="").geturl()
    return RedisCluster.from_url(
        node_url, connection_pool_class=redis.BlockingConnectionPool, **options
    )


def address_of(url: str) -> str:
    """``host:port/db`` (or the socket's path) of ``url``, with ``cluster`` before it for
    a cluster: what a log line names, never the password the URL may hold."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    where = f"{parts.hostname}:{parts.port or 6379}"
    if parts.scheme in CLUSTER_SCHEMES:
        return f"cluster {where}"
    return f"{where}/{parts.path.strip('/') or 0}"


def _shown(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")).geturl()
