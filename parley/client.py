"""``parley.connect`` and the client it opens: one deployment's sessions and turns.

Both deployments run on the very engine and store: the embedded one with the in-process
coordinator, a submitted turn being a *kick* handled on a background thread that holds
the session's lock and drains its turns in order (:mod:`parley.embedded`); the fleet one
with the Redis coordinator, the kick being a Celery task that a worker handles the same
way.  A :class:`~parley.session.Session` runs turns; a
:class:`~parley.turn_handle.TurnHandle` follows and steers one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine

from broker_config.settings import FleetSettings, read_flag, read_queue_type
from parley.batches import BATCH_ID, Batch, submit_batch
from parley.deployment import fleet_redis_url
from parley.embedded import embedded_kicker, local_coordinator
from parley.errors import BatchNotFound, InvalidRequest, SessionNotFound, StoreError
from parley.host import Host
from parley.kickers import EmbeddedKicker, FleetKicker
from parley.retention import check_retention, prune
from parley.session import Session
from parley.stored_reads import StoredReads
from parley.turn_handle import TurnHandle, name_in_logs
from parley.validation import (
    check_id,
    check_metadata,
    check_title,
)
from parley.webhooks import check_webhook_url
from schemas.operations import PruneReport
from workers.coordination.constants import TURN_QUEUE
from workers.coordination.redis_coordinator import RedisCoordinator
from workers.ports.backend import Coordinator
from workers.store.approvals import Answered
from workers.store.database import check_migrated, create_database_engine, migrate
from workers.store.sql_store import SqlStore
from workers.telemetry import tracing

log = logging.getLogger("parley.client")

DEFAULT_DATABASE_URL = "sqlite:///parley.db"

__all__ = [
    "DEFAULT_DATABASE_URL",
    "Client",
    "connect",
    "database_url_of",
]


def database_url_of(given: str | None) -> str:
    """The database a client uses: ``given``, else ``PARLEY_DATABASE_URL``, else
    :data:`DEFAULT_DATABASE_URL`."""
    url: str = given or os.environ.get("PARLEY_DATABASE_URL") or DEFAULT_DATABASE_URL
    return url


def connect(
    database_url: str | None = None,
    *,
    host: Host | None = None,
    redis_url: str | None = None,
    broker_url: str | None = None,
    queue: str | None = None,
    migrate_schema: bool | None = None,
) -> Client:
    """Open a client on ``database_url`` (default: ``PARLEY_DATABASE_URL``, else
    ``sqlite:///parley.db``).

    Without ``redis_url`` (or ``PARLEY_REDIS_URL``), and always on SQLite, the client is
    **embedded**: it runs turns in this process with ``host`` (or ``PARLEY_HOST``, or a
    default host around ``PARLEY_MODEL``'s model); without a host it can read but not
    run.  With it the client is a **fleet** producer: turns are enqueued for the
    Celery workers (broker: ``broker_url``, ``PARLEY_BROKER_URL``, else the Redis URL),
    which hold the host.

    SQLite databases are migrated on connect so a newcomer needs nothing else; other
    databases must be migrated with ``parley migrate`` (or ``migrate_schema=True``)."""
    if host is not None and not isinstance(host, Host):
        raise InvalidRequest(
            f"host must be a parley.Host, not {type(host).__name__} "
            "(parley.load_host('module:attribute') loads one)"
        )
    tracing.check_environment()
    url = database_url_of(database_url)
    if not isinstance(url, str):
        raise InvalidRequest(f"database_url must be a string, not {type(url).__name__}")
    engine = create_database_engine(url)
    try:
        redis_url = fleet_redis_url(engine.dialect.name, redis_url)
    except InvalidRequest:
        engine.dispose()
        raise
    store = SqlStore(_migrated(engine, migrate_schema))
    if redis_url is None:
        coordinator = local_coordinator(url, engine)
        kicker = embedded_kicker(store, coordinator, engine, host)
        return Client(store, coordinator, kicker, host=host)
    try:
        settings = FleetSettings(
            database_url=url,
            redis_url=redis_url,
            broker_url=broker_url or os.environ.get("PARLEY_BROKER_URL") or redis_url,
            host=None,
            queue=queue or os.environ.get("PARLEY_QUEUE") or TURN_QUEUE,
            task_events=read_flag(os.environ, "PARLEY_TASK_EVENTS"),  # (the kicks' "sent")
            trace_celery=read_flag(os.environ, "PARLEY_TRACE_CELERY"),  # (their publish)
            queue_type=read_queue_type(os.environ),  # (a kick declares its queue)
        )
    except InvalidRequest:
        store.close()
        raise
    return _fleet_client(store, settings)


def _migrated(engine: Engine, migrate_schema: bool | None) -> Engine:
    """``engine``, migrated (by default on SQLite only) or checked to be (disposed of,
    with :class:`StoreError`, if it is not)."""
    if migrate_schema is None:
        migrate_schema = engine.dialect.name == "sqlite"
    if migrate_schema:
        migrate(engine)
    else:
        try:
            check_migrated(engine)
        except StoreError:
            engine.dispose()
            raise
    return engine


def _fleet_client(store: SqlStore, settings: FleetSettings) -> Client:
    """A fleet producer on ``store``: its turns are Celery tasks for the workers."""
    try:
        fleet_coordinator = RedisCoordinator(settings.redis_url)
    except ValueError as exc:
        store.close()
        raise InvalidRequest(f"not a Redis URL: {settings.redis_url!r} ({exc})") from exc
    return Client(store, fleet_coordinator, FleetKicker(settings), host=None)


class Client(StoredReads):
    """A client of one deployment (embedded or fleet; the same API either way).  Use it
    as a context manager, or call :meth:`close`."""

    def __init__(
        self,
        store: SqlStore,
        coordinator: Coordinator,
        kicker: EmbeddedKicker | FleetKicker,
        *,
        host: Host | None,
    ) -> None:
        self.store = store
        self.coordinator = coordinator
        self.host = host
        self._kicker = kicker
        self._closed = False

    @property
    def fleet(self) -> bool:
        """Whether the fleet's workers run this client's turns (else this process does)."""
        return isinstance(self._kicker, FleetKicker)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Stop accepting work; embedded, with ``wait``, let running turns finish first."""
        self._closed = True
        self._kicker.close(wait=wait, timeout=timeout)
        self.coordinator.close()
        self.store.close()
        # Spans still buffered (a short script's whole turn) leave before it exits.
        tracing.flush()

    def _signal_answered(self, answered: Answered) -> None:
        """Committed answers: publish their events, and get a driver to a turn that is
        runnable again."""
        self.coordinator.publish(list(answered.events))
        if not answered.runnable:
            return
        try:
            self._kicker.ready()
        except InvalidRequest:
            # Embedded without a host: the answers are committed, and the turn goes on
            # when a client with the host resumes it (or its session gets a turn).
            log.info("turn %s is runnable again; no host here to run it", answered.turn_id)
            return
        if self.coordinator.mark_work(answered.session_id):
            self._kicker.kick(answered.session_id)

    def _check_open(self) -> None:
        """Refuse a write once closed (a closed store would quietly reconnect)."""
        if self._closed:
            raise InvalidRequest("the client is closed")

    # ------------------------------------------------------------------ sessions

    def open_session(
        self,
        root: str | os.PathLike[str],
        *,
        metadata: dict[str, Any] | None = None,
        token_ceiling: int | None = None,
        tenant: str | None = None,
        session_id: str | None = None,
        retention: timedelta | None = None,
        webhook_url: str | None = None,
        title: str | None = None,
    ) -> Session:
        """Create a session about the workspace ``root`` (an existing directory).

        ``tenant`` names the gateway tenant that owns it (the gateway shows a tenant
        only its own sessions); ``session_id`` chooses its id (:class:`Conflict` if
        taken), else it gets a fresh one.  ``retention`` is its time to live once ended,
        past its newest activity (else the host's); ``webhook_url`` receives each of its
        turns' ends (else the host's URL): docs/operations.md.  ``title`` is what a list
        of sessions shows (else its first prompt, once submitted): one line of at most
        200 characters."""
        self._check_open()
        check_retention(retention)
        check_webhook_url(webhook_url)
        if title is not None:
            check_title(title)
        if tenant is not None and (not isinstance(tenant, str) or not 0 < len(tenant) <= 64):
            raise InvalidRequest("tenant must be a non-empty string of at most 64 characters")
        if session_id is not None:
            check_id(session_id)
        given = os.fspath(root) if isinstance(root, (str, os.PathLike)) else None
        if not isinstance(given, str) or not given or "\0" in given:
            raise InvalidRequest(f"root must be a directory's path (a non-empty str), not {root!r}")
        root_path = os.path.realpath(given)
        if not os.path.isdir(root_path):
            raise InvalidRequest(f"root {given!r} is not a directory")
        if metadata is not None:
            check_metadata(metadata)
        if token_ceiling is not None and (
            not isinstance(token_ceiling, int)
            or isinstance(token_ceiling, bool)
            or token_ceiling < 1
        ):
            raise InvalidRequest("token_ceiling must be a positive integer or None")
        record = self.store.create_session(
            root=root_path,
            metadata=dict(metadata or {}),
            token_ceiling=token_ceiling,
            tenant=tenant,
            session_id=session_id,
            retention=retention,
            webhook_url=webhook_url,
            title=title,
        )
        if retention is not None or webhook_url is not None:
            self._kicker.housekeeping_wanted()
        return Session(self, record)

    def session(self, session_id: str) -> Session:
        """Reopen a session by id; :class:`SessionNotFound` if unknown.  The root comes
        from the store, not from the caller."""
        check_id(session_id, SessionNotFound)
        return Session(self, self.store.get_session(session_id))

    def attach(self, turn_id: str) -> TurnHandle:
        """A handle on any turn, from any process."""
        check_id(turn_id)
        record = self.store.get_turn(turn_id)
        name_in_logs(record)
        return TurnHandle(self, record)

    # ------------------------------------------------------------------- batches

    def submit_batch(
        self,
        lines: Iterable[dict[str, Any]] | str | os.PathLike[str],
        *,
        root: str | os.PathLike[str] | None = None,
        tenant: str | None = None,
        request_id: str | None = None,
    ) -> Batch:
        """Submit many turns as one batch (docs/batches.md): ``lines`` are OpenAI Batch
        lines over Responses (``{"custom_id", "method": "POST", "url": "/v1/responses",
        "body"}``), parsed, or the path of their JSONL file.  A line without
        ``previous_response_id`` or ``conversation`` opens a session of its own, in
        ``root`` (else a directory of its own under ``PARLEY_WORKSPACES``); a malformed
        line is refused alone (it is in the error file).  Every turn is
        ``priority="batch"``.  ``tenant`` owns the batch and the sessions it opens;
        ``request_id`` makes the submission idempotent (the same id returns the batch it
        made)."""
        return submit_batch(self, lines, root=root, tenant=tenant, request_id=request_id)

    def batch(self, batch_id: str) -> Batch:
        """A handle on a batch; :class:`BatchNotFound` if unknown."""
        if not isinstance(batch_id, str) or not BATCH_ID.fullmatch(batch_id):
            raise BatchNotFound(f"no batch {batch_id!r}")
        self.store.get_batch(batch_id)
        return Batch(self, batch_id)

    def prune(
        self,
        older_than: timedelta | None = None,
        *,
        workspaces: bool = False,
        dry_run: bool = False,
    ) -> PruneReport:
        """Delete ended sessions idle for longer than ``older_than`` or past their time to
        live (their own, else this client's host's), each whole in a transaction of its
        own; never one with a turn queued, running or waiting.  ``workspaces`` also
        removes their workspace directories; ``dry_run`` only lists them.  What "ended"
        and "idle" mean: docs/operations.md "Retention"."""
        if older_than is not None and not isinstance(older_than, timedelta):
            raise InvalidRequest("older_than must be a datetime.timedelta or None")
        self._check_open()
        return prune(
            self.store,
            self.coordinator,
            older_than=older_than,
            default_retention=self.host.retention if self.host is not None else None,
            workspaces=workspaces,
            dry_run=dry_run,
        )
