"""Opening a redis-py client for ``PARLEY_REDIS_URL``: one server (``redis://``,
``rediss://``, ``unix://``) or a Redis Cluster (``redis+cluster://HOST:PORT``, or
``rediss+cluster://`` over TLS, naming any one node: the client learns the others).

Both get blocking connection pools (per node, on a cluster): a thread that finds every
connection in use waits for one, as long as a command may take, rather than fail at once
as redis-py's default pool does past its limit ("Too many connections"), which a driver
would take for Redis being down.  Connections are opened as threads need them.

On a cluster every multi-key command parley sends keeps its keys in one hash slot (each
key carries its session or turn as a hash tag: :mod:`parley.coordination.constants`);
redis-py routes each command to the node that holds its slot, follows ``MOVED`` and
``ASK`` as slots move, and refreshes its map of the cluster when a node stops answering
(a replica promoted in its place).
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis._parsers.encoders import Encoder
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.exceptions import RedisClusterException

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""parley's schemes for a Redis Cluster, and redis-py's for one of its nodes."""


def is_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster."""
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def cluster_seeds(url: str) -> list[tuple[str, int]]:
    """The nodes a cluster URL names (``HOST:PORT``, comma-separated: any that answers
    is enough); ``ValueError`` unless each is a host and a port, and the database is 0
    (a cluster has no other)."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    seeds: list[tuple[str, int]] = []
    for seed in hosts.split(","):
        host, _, port = seed.strip().rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65_536:
            raise ValueError(
                f"a Redis Cluster URL names its nodes as HOST:PORT[,HOST:PORT...], "
                f"not {_shown(url)!r}"
            )
        seeds.append((host, int(port)))
    path = parts.path.strip("/")
    if path not in {"", "0"}:
        raise ValueError(f"a Redis Cluster has only database 0, not {path!r} ({_shown(url)})")
    return seeds


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
    if not is_cluster(url):
        return redis.Redis.from_pool(redis.BlockingConnectionPool.from_url(url, **options))
    return ClusterClient(url, options)


class ClusterClient:
    """A :class:`redis.cluster.RedisCluster` for ``url``, made when first used rather than
    at once (it asks the nodes for their map as it is made: a process starts while the
    cluster is out of reach, as it does while one server is), and failing as one server
    does: with ``redis.ConnectionError`` when no node answers or a slot has no node, not
    with redis-py's cluster errors, which are no ``RedisError``.  Anything else is the
    cluster client's own."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        parts = urlsplit(url)
        self.url = url
        self._seeds = [
            ClusterNode(host, port)  # type: ignore[no-untyped-call]
            for host, port in cluster_seeds(url)
        ]
        self._options = {
            **options,
            "connection_pool_class": redis.BlockingConnectionPool,
            "username": unquote(parts.username) if parts.username else None,
            "password": unquote(parts.password) if parts.password else None,
            "ssl": CLUSTER_SCHEMES[parts.scheme] == "rediss",
        }
        self._client: RedisCluster | None = None
        self._guard = threading.Lock()

    @property
    def cluster(self) -> RedisCluster:
        """The cluster client, made now if it was not yet."""
        client = self._client
        if client is not None:
            return client
        with self._guard:
            if self._client is None:
                try:
                    self._client = _Cluster(startup_nodes=self._seeds, **self._options)
                except RedisClusterException as exc:
                    raise redis.ConnectionError(
                        f"no node of the Redis Cluster answers: {exc}"
                    ) from exc
            return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cluster, name)

    def register_script(self, source: str) -> Script:
        """A script of this client, made without reaching the cluster (its sha is the
        source's; it is loaded on a node when the node first lacks it)."""
        return Script(self, source)  # type: ignore[arg-type]

    def get_encoder(self) -> Encoder:
        """How commands are encoded: redis-py's defaults, as the cluster client's."""
        return Encoder("utf-8", "strict", False)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        with self._guard:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class _Cluster(RedisCluster):
    """redis-py's cluster client, its cluster errors raised as ``redis.ConnectionError``
    (commands, pipelines): what parley's callers catch of one server too."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except RedisClusterException as exc:
            raise redis.ConnectionError(f"Redis Cluster: {exc}") from exc

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)  # type: ignore[no-untyped-call]
        execute = pipe.execute

        def converted(raise_on_error: bool = True) -> Any:
            try:
                return execute(raise_on_error)
            except RedisClusterException as exc:
                raise redis.ConnectionError(f"Redis Cluster: {exc}") from exc

        pipe.execute = converted
        return pipe


def address_of(url: str) -> str:
    """``host:port/db`` (or the socket's path) of ``url``, or ``cluster HOST:PORT,…`` of
    a cluster: what a log line names, never the password the URL may hold."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    if parts.scheme in CLUSTER_SCHEMES:
        return "cluster " + parts.netloc.rpartition("@")[2]
    return f"{parts.hostname}:{parts.port or 6379}/{parts.path.strip('/') or 0}"


def _shown(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return parts._replace(netloc=f"{user}:***@{hosts}").geturl()
