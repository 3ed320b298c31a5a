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
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine

from parley.batches import BATCH_ID, Batch, submit_batch
from parley.client_runtime import Kicker, Runtime
from parley.coordination.redis_coordinator import RedisCoordinator
from parley.deployment import fleet_redis_url
from parley.embedded import embedded_kicker, local_coordinator
from parley.engine.call_admission import AdmissionSettings
from parley.errors import (
    BatchNotFound,
    InvalidRequest,
    ScheduleNotFound,
    SessionNotFound,
    StoreError,
)
from parley.fleet.settings import FleetSettings
from parley.host import Host
from parley.kickers import FleetKicker
from parley.ports.backend import Coordinator
from parley.ports.host import agent_path
from parley.replay import Replay, ReplayMany, replays_of_batch, start_many, start_replay
from parley.retention import check_retention, prune
from parley.runtime.batch_window import fill_batch_window
from parley.schedules import Schedule, checked_request
from parley.schemas.operations import PruneReport
from parley.schemas.schedules import DEFAULT_MISFIRE_GRACE_SECONDS
from parley.session import Session
from parley.settings import Settings
from parley.store.database import check_migrated, create_database_engine, migrate
from parley.store.sql_store import SqlStore
from parley.stored_reads import StoredReads
from parley.telemetry import tracing
from parley.turn_handle import TurnHandle, name_in_logs
from parley.validation import (
    check_id,
    check_metadata,
    check_title,
)
from parley.webhooks import check_webhook_url

log = logging.getLogger("parley.client")

DEFAULT_DATABASE_URL = "sqlite:///parley.db"

__all__ = [
    "DEFAULT_DATABASE_URL",
    "Client",
    "connect",
    "database_url_of",
]


def database_url_of(given: str | None, settings: Settings) -> str:
    """The database a client uses: ``given``, else ``settings``' ``PARLEY_DATABASE_URL``,
    else :data:`DEFAULT_DATABASE_URL`."""
    url: str = given or settings.database_url or DEFAULT_DATABASE_URL
    return url


def connect(
    database_url: str | None = None,
    *,
    host: Host | None = None,
    redis_url: str | None = None,
    broker_url: str | None = None,
    queue: str | None = None,
    migrate_schema: bool | None = None,
    settings: Settings | None = None,
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
    databases must be migrated with ``parley migrate`` (or ``migrate_schema=True``).

    The variables are read once, here (``settings``: what a process that read them
    already passes), and a malformed one is an :class:`InvalidRequest` naming it."""
    _check_host(host)
    settings = settings or Settings.from_environment()
    tracing.configure(settings)
    url = database_url_of(database_url, settings)
    if not isinstance(url, str):
        raise InvalidRequest(f"database_url must be a string, not {type(url).__name__}")
    engine = create_database_engine(url, pooler=settings.database_pooler)
    try:
        redis_url = fleet_redis_url(engine.dialect.name, redis_url, settings)
    except InvalidRequest:
        engine.dispose()
        raise
    store = SqlStore(_migrated(engine, migrate_schema))
    if redis_url is None:
        coordinator = local_coordinator(url, engine)
        kicker = embedded_kicker(store, coordinator, engine, host, settings)
        return Client(store, coordinator, kicker, host=host, settings=settings)
    try:
        fleet = _fleet_settings(url, redis_url, broker_url, queue, settings)
        weights = AdmissionSettings.from_settings(settings).tenant_weights
    except InvalidRequest:
        store.close()
        raise
    return _fleet_client(store, fleet, settings, weights)


def _check_host(host: object) -> None:
    """Refuse a ``host`` that is not a :class:`Host` (None is none)."""
    if host is not None and not isinstance(host, Host):
        raise InvalidRequest(
            f"host must be a parley.Host, not {type(host).__name__} "
            "(parley.load_host('module:attribute') loads one)"
        )


def _fleet_settings(
    url: str, redis_url: str, broker_url: str | None, queue: str | None, settings: Settings
) -> FleetSettings:
    """A fleet producer's settings: the arguments ``connect`` was given, else the
    variables' (the broker defaults to the Redis URL)."""
    return FleetSettings(
        database_url=url,
        redis_url=redis_url,
        broker_url=broker_url or settings.broker_url or redis_url,
        host=None,
        queue=queue or settings.queue,
        task_events=settings.task_events,  # (the kicks' "sent")
        trace_celery=settings.trace_celery,  # (their publish)
        queue_type=settings.broker_queue_type,  # (a kick declares its queue)
    )


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


def _fleet_client(
    store: SqlStore, fleet: FleetSettings, settings: Settings, weights: Mapping[str, float]
) -> Client:
    """A fleet producer on ``store``: its turns are Celery tasks for the workers."""
    try:
        fleet_coordinator = RedisCoordinator(fleet.redis_url)
    except ValueError as exc:
        store.close()
        raise InvalidRequest(f"not a Redis URL: {fleet.redis_url!r} ({exc})") from exc
    kicker = FleetKicker(
        fleet,
        lambda kick: fill_batch_window(
            store, fleet_coordinator, kick, window=settings.batch_window, weights=weights
        ),
    )
    return Client(store, fleet_coordinator, kicker, host=None, settings=settings)


class Client(StoredReads):
    """A client of one deployment (embedded or fleet; the same API either way).  Use it
    as a context manager, or call :meth:`close`."""

    def __init__(
        self,
        store: SqlStore,
        coordinator: Coordinator,
        kicker: Kicker,
        *,
        host: Host | None,
        settings: Settings,
    ) -> None:
        self.runtime = Runtime(store, coordinator, kicker, host=host, settings=settings)
        """What the client's sessions, turn handles and batches hold."""

    @property
    def coordinator(self) -> Coordinator:
        """The deployment's coordinator (Redis on a fleet, in process embedded)."""
        return self.runtime.coordinator

    @property
    def host(self) -> Host | None:
        """The host this client runs turns with (None: a fleet's, or none)."""
        return self.runtime.host

    @property
    def fleet(self) -> bool:
        """Whether the fleet's workers run this client's turns (else this process does)."""
        return self.runtime.fleet

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Stop accepting work; embedded, with ``wait``, let running turns finish first."""
        self.runtime.close(wait=wait, timeout=timeout)

    # ------------------------------------------------------------------ sessions

    def open_session(  # noqa: PLR0913 (the session's every option, by keyword)
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
        agent: str | None = None,
    ) -> Session:
        """Create a session about the workspace ``root`` (an existing directory).

        ``tenant`` names the gateway tenant that owns it (the gateway shows a tenant
        only its own sessions); ``session_id`` chooses its id (:class:`Conflict` if
        taken), else it gets a fresh one.  ``retention`` is its time to live once ended,
        past its newest activity (else the host's); ``webhook_url`` receives each of its
        turns' ends (else the host's URL): docs/operations.md.  ``title`` is what a list
        of sessions shows (else its first prompt, once submitted): one line of at most
        200 characters.  ``agent`` names a declared agent (a path, ``writer/critic``)
        whose turns the session's are: they run with its host (:meth:`Host.for_agent`), as
        its child turns do; :class:`InvalidRequest` if this client's host declares none
        of that name (a fleet's client, without the host, leaves that to the workers,
        which fail such a turn saying so)."""
        self.runtime.check_open()
        self._check_agent(agent)
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
            agent=agent,
        )
        if retention is not None or webhook_url is not None:
            self.runtime.kicker.housekeeping_wanted()
        return Session(self.runtime, record)

    def _check_agent(self, agent: object) -> None:
        if agent is None:
            return
        if not isinstance(agent, str) or not agent or len(agent) > 200:
            raise InvalidRequest("agent must be a declared agent's name or path (text)")
        if self.host is not None:
            self.host.for_agent(agent_path(agent))

    # ----------------------------------------------------------------- schedules

    def schedule(  # noqa: PLR0913 (a schedule's parts, by keyword, as SPEC names them)
        self,
        cron: str,
        prompt: str,
        *,
        timezone: str = "UTC",
        session_id: str | None = None,
        root: str | os.PathLike[str] | None = None,
        tenant: str | None = None,
        priority: str = "batch",
        overlap: str = "skip",
        name: str | None = None,
        misfire_grace: timedelta | float = DEFAULT_MISFIRE_GRACE_SECONDS,
    ) -> Schedule:
        """Submit ``prompt`` at every slot of ``cron`` (five fields) in the IANA
        ``timezone`` (docs/time.md#schedules), each slot once fleet-wide.  With
        ``session_id`` each firing is a turn of that session; without, each opens a
        session on ``root`` (else the working directory).  ``overlap`` says what a
        firing does while the previous one's turn runs: ``skip``, ``enqueue`` or
        ``interrupt``; a slot later than ``misfire_grace`` (seconds or a timedelta)
        when a beat comes to it is recorded missed.  A bad cron, an unknown zone, a bad
        overlap: :class:`InvalidRequest`, nothing stored."""
        self.runtime.check_open()
        asked = checked_request(
            cron,
            prompt,
            timezone=timezone,
            session_id=session_id,
            root=root,
            tenant=tenant,
            priority=priority,
            overlap=overlap,
            name=name,
            misfire_grace=misfire_grace,
        )
        record = self.store.create_schedule(
            cron=asked.cron,
            timezone=asked.timezone,
            prompt=asked.prompt,
            session_id=asked.session_id,
            root=asked.root,
            tenant=asked.tenant,
            priority=asked.priority,
            overlap=asked.overlap,
            name=asked.name,
            misfire_grace_seconds=asked.misfire_grace_seconds,
        )
        return Schedule(self.runtime, record)

    def schedules(self, *, tenant: str | None = None) -> list[Schedule]:
        """Every schedule (``tenant``'s only, if given), oldest first."""
        return [Schedule(self.runtime, r) for r in self.store.list_schedules(tenant)]

    def get_schedule(self, schedule_id: str) -> Schedule:
        """A schedule by id; :class:`ScheduleNotFound` if there is none."""
        check_id(schedule_id, ScheduleNotFound)
        return Schedule(self.runtime, self.store.get_schedule(schedule_id))

    def session(self, session_id: str) -> Session:
        """Reopen a session by id; :class:`SessionNotFound` if unknown.  The root comes
        from the store, not from the caller."""
        check_id(session_id, SessionNotFound)
        return Session(self.runtime, self.store.get_session(session_id))

    def attach(self, turn_id: str) -> TurnHandle:
        """A handle on any turn, from any process."""
        check_id(turn_id)
        record = self.store.get_turn(turn_id)
        name_in_logs(record)
        return TurnHandle(self.runtime, record)

    # -------------------------------------------------------------------- replay

    def replay(
        self,
        session_id: str,
        *,
        host: Host | None = None,
        model: Any = None,
        system_prompt: str | None = None,
        from_turn: int | str | None = None,
        tools: str = "recorded",
    ) -> Replay:
        """Re-run a recorded session's turns, their steers in their places, in a new
        session marked ``replay_of`` (docs/replay.md): with ``host`` (embedded only),
        ``model`` (a model, embedded only, or its name as ``PARLEY_MODEL`` gives one) or
        ``system_prompt`` instead of the host's, from ``from_turn`` (an index or a turn id
        of its history path; the turns before it are the replay's seeded history).
        ``tools="recorded"`` answers a call the original made with its recorded result,
        runs an unmatched one only if the policy's ``read_only_tools`` name it, and tells
        the model any other was not run; ``"live"`` runs every call under the policy.
        The original is not changed."""
        return start_replay(
            self.runtime,
            session_id,
            host=host,
            model=model,
            system_prompt=system_prompt,
            from_turn=from_turn,
            tools=tools,
        )

    def replay_many(self, session_ids: Sequence[str], **choices: Any) -> ReplayMany:
        """Replay many sessions at once (docs/replay.md#many), each as :meth:`replay`
        with the same ``choices``, as one batch (a line per session replayed, its turns
        in the ``batch`` lane: ``ReplayMany.batch_id``); an unknown id or a bad choice
        starts none."""
        return start_many(self.runtime, session_ids, **choices)

    def replay_batch(self, batch_id: str) -> ReplayMany:
        """The replays of the batch ``replay_many`` made (docs/replay.md#many), read back
        from the batch, from any process: their progress, their wait and their report."""
        return replays_of_batch(self.runtime, batch_id)

    # ------------------------------------------------------------------- batches

    def submit_batch(
        self,
        lines: Iterable[dict[str, Any]] | str | os.PathLike[str],
        *,
        root: str | os.PathLike[str] | None = None,
        tenant: str | None = None,
        request_id: str | None = None,
        endpoint: str = "/v1/responses",
    ) -> Batch:
        """Submit many turns as one batch (docs/batches.md): ``lines`` are OpenAI Batch
        lines (``{"custom_id", "method": "POST", "url": endpoint, "body"}``), parsed, or
        the path of their JSONL file; ``endpoint`` is ``/v1/responses`` (a body is a
        Responses request) or ``/v1/chat/completions`` (a chat completions request).  A
        line without ``previous_response_id`` or ``conversation`` (every chat completion)
        opens a session of its own, in ``root`` (else a directory of its own under
        ``PARLEY_WORKSPACES``); a malformed line is refused alone (it is in the error
        file).  Every turn is ``priority="batch"``.  ``tenant`` owns the batch and the
        sessions it opens; ``request_id`` makes the submission idempotent (the same id
        returns the batch it made)."""
        return submit_batch(
            self.runtime, lines, root=root, tenant=tenant, request_id=request_id, endpoint=endpoint
        )

    def batch(self, batch_id: str) -> Batch:
        """A handle on a batch; :class:`BatchNotFound` if unknown."""
        if not isinstance(batch_id, str) or not BATCH_ID.fullmatch(batch_id):
            raise BatchNotFound(f"no batch {batch_id!r}")
        self.store.get_batch(batch_id)
        return Batch(self.runtime, batch_id)

    def prune(
        self,
        older_than: timedelta | None = None,
        *,
        workspaces: bool = False,
        dry_run: bool = False,
    ) -> PruneReport:
        """Delete ended sessions idle for longer than ``older_than`` or past their time to
        live (their own, else this client's host's), each whole (in a transaction of its
        own on PostgreSQL, 200 to one on SQLite); never one with a turn queued, running or
        waiting.  ``workspaces`` also
        removes their workspace directories; ``dry_run`` only lists them.  What "ended"
        and "idle" mean: docs/operations.md "Retention"."""
        if older_than is not None and not isinstance(older_than, timedelta):
            raise InvalidRequest("older_than must be a datetime.timedelta or None")
        self.runtime.check_open()
        return prune(
            self.store,
            self.coordinator,
            older_than=older_than,
            default_retention=self.host.retention if self.host is not None else None,
            workspaces=workspaces,
            dry_run=dry_run,
        )
