"""kombu's Redis transport, with one synchronous Redis client per channel, and channels
that can still reach Redis after their connection let go of them.

kombu builds a new ``redis.Redis`` for every synchronous command it sends: each publish,
and the unacked bookkeeping of each delivery and each ack.  redis-py's constructor fills
a table of some 170 response callbacks, so on this machine that is about 0.13 ms of CPU
per client, three per kick (one in the producer, two in the worker), for a client that
only wraps the channel's connection pool.  This channel keeps the one it built, for as
long as the pool it wraps is the channel's.  Everything else, including the connection
pool and what goes over the wire, is kombu's.

Selected by name (``parley.fleet.app.transport_for``), so that kombu imports this
module, and with it kombu's Redis transport, when a connection is made rather than on
``import parley``.  Naming a transport class by hand skips the TLS default kombu gives
the ``rediss`` scheme, so ``rediss://`` URLs get :class:`TlsTransport`, which applies it.
Two things show that the transport was named: a connection's URI (the worker's banner,
the "Connected to" line) reads ``parley.fleet.transport:Transport://host:port/db``, and
a fail-over list of URLs (``redis://a;redis://b``) is on kombu's own channel again after
kombu switches to the next one.

The second change keeps a worker alive through a broker restart.  When Celery loses the
broker it calls ``Connection.collect()`` and then ``close()``.  A channel's close can stop
half-way on a connection error (the pending BRPOP it reads first, the fan-out bindings
it deletes, the unacked messages it restores), and so can the transport's loop closing
its channels; ``collect()`` then clears the transport's ``client`` all the same.  The
second ``close()`` reaches a surviving channel again, its restore of the unacked
messages needs a new connection pool, and kombu builds one from
``self.connection.client.hostname``: an ``AttributeError``, not a connection error, so
it ends Celery's reconnect loop ("Unrecoverable error") and the worker stops.  The same
happens to the ack of a kick that finishes after the reconnect.  This channel works out
its connection parameters while the client is there and keeps them.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

from kombu.transport import redis as kombu_redis

log = logging.getLogger("parley.broker")


class Channel(kombu_redis.Channel):
    """A kombu Redis channel that reuses its synchronous client and keeps its connection
    parameters."""

    _sync_client: Any = None
    _params: dict[bool, dict[str, Any]] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        # (Its ping took the asynchronous parameters; these are for acks and restores.)
        self._connparams(asynchronous=False)

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self._params is None:
            self._params = {}
        params = self._params.get(asynchronous)
        if params is None:
            params = super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]
            self._params[asynchronous] = params
        return dict(params)  # (a pool is free to keep or change what it is given)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous or self._closing:
            # (A closing channel may still restore its unacked messages: with a client of
            # its own, as kombu's does, that nothing keeps afterwards.)
            return super()._create_client(asynchronous=asynchronous)  # type: ignore[no-untyped-call]
        client = self._sync_client
        if client is None or client.connection_pool is not self.pool:
            client = self._sync_client = super()._create_client()  # type: ignore[no-untyped-call]
        return client

    def _disconnect_pools(self) -> None:
        # After a fork, a failed ping or on close: the client goes with its pool.
        self._sync_client = None
        super()._disconnect_pools()  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel


class TlsTransport(Transport):
    """:class:`Transport` for ``rediss://`` brokers, with kombu's TLS default."""

    def __init__(self, client: Any, **kwargs: Any) -> None:
        if not client.ssl:
            # kombu's Connection gives a `rediss` URL with no TLS options (none in its
            # query, no broker_use_ssl) this default and warning, but only when the scheme
            # picks the transport.
            log.warning(
                "Secure redis scheme specified (rediss) with no ssl options, defaulting "
                "to insecure SSL behaviour."
            )
            client.ssl = {"ssl_cert_reqs": ssl.CERT_NONE}
        super().__init__(client, **kwargs)  # type: ignore[no-untyped-call]
