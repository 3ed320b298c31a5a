"""``parley.connect`` and the embedded client: sessions and turns in one process.

Both clients run on the very engine and store: the embedded one with the in-process
coordinator, a submitted turn being a *kick* handled on a background thread that holds
the session's lock and drains its turns in order; the fleet one with the Redis
coordinator, the kick being a Celery task that a worker handles the same way.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from broker_config.settings import FleetSettings
from parley import transcript
from parley.deployment import fleet_redis_url
from parley.errors import (
    ForeignTurn,
    InvalidRequest,
    ParleyError,
    SessionNotFound,
    StoreError,
    WaitTimeout,
)
from parley.host import Host, host_from_environment
from parley.housekeeping import EmbeddedHousekeeping
from parley.kickers import EmbeddedKicker, FleetKicker
from parley.mcp.spec import McpServer
from parley.retention import check_retention, prune
from parley.seeding import seeded_turns
from parley.streaming import follow
from parley.webhooks import check_webhook_url
from schemas.events import Event
from schemas.operations import PruneReport, WebhookDelivery
from schemas.records import (
    Approval,
    Decision,
    IfBusy,
    SessionRecord,
    SteerKind,
    TaskContract,
    TurnRecord,
    TurnResult,
)
from workers.coordination.constants import SEEDED, TURN_QUEUE
from workers.coordination.local_coordinator import LocalCoordinator
from workers.coordination.redis_coordinator import RedisCoordinator
from workers.engine.turn_engine import TurnEngine
from workers.ports.backend import Coordinator
from workers.runtime.session_leases import ProcessLeases
from workers.store.approvals import Answered
from workers.store.database import (
    check_migrated,
    create_database_engine,
    in_memory,
    migrate,
    sqlite_file,
)
from workers.store.session_titles import title_problem
from workers.store.sql_store import SqlStore, storable, validate_ids
from workers.telemetry import metrics
from workers.telemetry.log_context import bind

log = logging.getLogger("parley.client")

DEFAULT_DATABASE_URL = "sqlite:///parley.db"
MAX_PROMPT_BYTES = 1_000_000
MAX_STEER_BYTES = 100_000
MAX_REQUEST_ID = 200
MAX_METADATA_BYTES = 100_000
MAX_CONTEXT_BYTES = 64_000
MAX_JSON_DEPTH = 64
"""How deep a stored JSON object may nest its objects and arrays (the object itself is
level 1).  Far below what would fail later: pydantic stops serializing at some 255
levels, so a deeper one would be stored and then fail every read that answers it."""
MAX_SEQ = 2**31 - 1  # the store's seq columns are 32-bit
WAIT_POLL_SECONDS = 0.5


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
    url = database_url_of(database_url)
    if not isinstance(url, str):
        raise InvalidRequest(f"database_url must be a string, not {type(url).__name__}")
    engine = create_database_engine(url)
    try:
        redis_url = fleet_redis_url(engine.dialect.name, redis_url)
    except InvalidRequest:
        engine.dispose()
        raise
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
    store = SqlStore(engine)
    if redis_url is None:
        coordinator = _local_coordinator(url, engine)

        def runner() -> TurnEngine | None:
            # Resolved at the first turn, not here: a client that only reads must not
            # fail on a model it will never call (PARLEY_MODEL without its key, say).
            chosen = host if host is not None else host_from_environment()
            return TurnEngine(store=store, coordinator=coordinator, host=chosen) if chosen else None

        housekeeping = EmbeddedHousekeeping(store, coordinator)
        if host is not None:
            # Deliveries an earlier process left, or the host's own URL or retention:
            # started now, not at the first turn (a restarted process may run none).
            housekeeping.touch(host)

        # Other processes may share the database (a file, or a server): a session's lock
        # is a lease in it too, this client's own (workers.runtime.session_leases).
        leases = None if in_memory(engine) else ProcessLeases(store)

        def strays() -> list[str]:
            undriven = coordinator.unattended(store.sessions_with_work())
            return undriven if leases is None or not undriven else leases.unheld(undriven)

        kicker = EmbeddedKicker(
            runner, store.expire_approvals, housekeeping, strays=strays, leases=leases
        )
        if host is not None:
            # Turns an earlier process left (killed mid-turn, say) go on from now, not
            # at this client's first turn: a restarted process may run none.  (Building
            # the engine starts its sweep for them.)
            kicker.ready()
        return Client(store, coordinator, kicker, host=host)
    settings = FleetSettings(
        database_url=url,
        redis_url=redis_url,
        broker_url=broker_url or os.environ.get("PARLEY_BROKER_URL") or redis_url,
        host=None,
        queue=queue or os.environ.get("PARLEY_QUEUE") or TURN_QUEUE,
    )
    try:
        fleet_coordinator = RedisCoordinator(redis_url)
    except ValueError as exc:
        store.close()
        raise InvalidRequest(f"not a Redis URL: {redis_url!r} ({exc})") from exc
    return Client(store, fleet_coordinator, FleetKicker(settings), host=None)


_LOCAL_COORDINATORS: weakref.WeakValueDictionary[str, LocalCoordinator] = (
    weakref.WeakValueDictionary()
)
_LOCAL_COORDINATORS_GUARD = threading.Lock()


def _local_coordinator(url: str, engine: Engine) -> LocalCoordinator:
    """The in-process coordinator of a database: one per database in a process, shared by
    every embedded client on it.  With one each, a second client's driver would see the
    first one's session lock free and take over a turn it is still running."""
    path = sqlite_file(url)
    if engine.dialect.name == "sqlite" and path is None:
        return LocalCoordinator()  # in memory: each engine is a database of its own
    key = str(path.resolve()) if path is not None else str(engine.url)
    with _LOCAL_COORDINATORS_GUARD:
        coordinator = _LOCAL_COORDINATORS.get(key)
        if coordinator is None:
            coordinator = _LOCAL_COORDINATORS[key] = LocalCoordinator()
        return coordinator


class Client:
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
            _check_id(session_id)
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
        _check_id(session_id, SessionNotFound)
        return Session(self, self.store.get_session(session_id))

    def attach(self, turn_id: str) -> TurnHandle:
        """A handle on any turn, from any process."""
        _check_id(turn_id)
        record = self.store.get_turn(turn_id)
        _name_in_logs(record)
        return TurnHandle(self, record)

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


class Session:
    """One durable conversation (a tree of turns and a head)."""

    def __init__(self, client: Client, record: SessionRecord) -> None:
        self._client = client
        self._record = record

    @property
    def id(self) -> str:
        """The session id: all a later process needs."""
        return self._record.session_id

    @property
    def root(self) -> str:
        """The workspace root, as stored."""
        return self._record.root

    @property
    def metadata(self) -> dict[str, Any]:
        """The metadata given at creation."""
        return dict(self._record.metadata)

    @property
    def tenant(self) -> str | None:
        """The gateway tenant that owns the session (None: created from Python)."""
        return self._record.tenant

    @property
    def created_at(self) -> datetime:
        """When the session was created (UTC)."""
        return self._record.created_at

    @property
    def head(self) -> str | None:
        """The turn the next one hangs under (None before the first)."""
        return self._client.store.get_session(self.id).head_turn_id

    @property
    def retention(self) -> timedelta | None:
        """The session's own time to live once ended (None: the host's, if any)."""
        return self._record.retention

    @property
    def webhook_url(self) -> str | None:
        """Where its turns' ends are posted (None: the host's URL, if any)."""
        return self._record.webhook_url

    @property
    def title(self) -> str | None:
        """What a list of sessions shows: the title given, else the first prompt's
        (None before the first turn).  Read from the store: a submission sets it."""
        return self._client.store.get_session(self.id).title

    def set_title(self, title: str) -> None:
        """Give the session ``title``: one line of at most 200 characters, without
        control characters (:class:`InvalidRequest` otherwise).  One write."""
        check_title(title)
        self._client._check_open()
        self._record = self._client.store.set_title(self.id, title)

    def webhook_deliveries(self) -> list[WebhookDelivery]:
        """Its turns' webhook deliveries, oldest first, each with its state."""
        return self._client.store.deliveries(self.id)

    def __repr__(self) -> str:
        return f"<parley.Session {self.id} root={self.root!r}>"

    def turn(
        self,
        prompt: str,
        *,
        contract: TaskContract | None = None,
        on_event: Callable[[Event], None] | None = None,
        request_id: str | None = None,
        if_busy: IfBusy | str = IfBusy.ENQUEUE,
        timeout: float | None = None,
        context: dict[str, Any] | None = None,
    ) -> TurnResult:
        """Run a turn and wait for its result; ``on_event`` sees every event as it happens.
        :class:`WaitTimeout` once ``timeout`` seconds have passed, events included."""
        if on_event is not None and not callable(on_event):
            raise InvalidRequest("on_event must be a callable taking an Event")
        _check_timeout(timeout)
        handle = self.submit(
            prompt, contract=contract, request_id=request_id, if_busy=if_busy, context=context
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        if on_event is not None:
            stop = threading.Event()
            # The events stop at the deadline (a turn that never ends must not hold the
            # call past it), and the wait after them then says why.
            timer = None if timeout is None else threading.Timer(timeout, stop.set)
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                for event in handle.events(stop=stop):
                    on_event(event)
            finally:
                if timer is not None:
                    timer.cancel()
        return handle._wait_until(deadline, timeout)

    def submit(
        self,
        prompt: str | bytes,
        *,
        contract: TaskContract | None = None,
        request_id: str | None = None,
        if_busy: IfBusy | str = IfBusy.ENQUEUE,
        context: dict[str, Any] | None = None,
    ) -> TurnHandle:
        """Queue a turn and return at once.  A repeated ``request_id`` returns the same turn.

        ``context`` is the host context of this turn: a JSON object (at most
        ``MAX_CONTEXT_BYTES``) stored with its run, which reaches ``before_turn`` (in
        ``TurnOptions``), every tool (``ToolContext.host_context``), the model request's
        context (never the conversation) and ``after_commit``'s receipt, on whichever
        worker runs the turn; a resume keeps it."""
        text = _check_text(prompt, "prompt", MAX_PROMPT_BYTES)
        if context is not None:
            check_json_object(context, "context", MAX_CONTEXT_BYTES)
        busy = _check_if_busy(if_busy)
        if contract is not None and not isinstance(contract, TaskContract):
            raise InvalidRequest("contract must be a parley.TaskContract")
        if contract is not None:
            for server in contract.mcp_servers:
                McpServer.from_json(server)  # a malformed server is refused before any write
        if request_id is not None and (
            not isinstance(request_id, str)
            or not request_id
            or len(request_id) > MAX_REQUEST_ID
            or not storable(request_id)
        ):
            raise InvalidRequest(
                f"request_id must be a non-empty string of at most {MAX_REQUEST_ID} characters "
                "(UTF-8, no NUL)"
            )
        client = self._client
        client._check_open()
        client._kicker.ready()  # a client that cannot run turns says so before any write
        receipt = client.store.submit_turn(
            session_id=self.id,
            prompt=text,
            request_id=request_id,
            contract=contract,
            if_busy=busy,
            host_context=dict(context) if context else None,
        )
        for turn_id, steer in receipt.interrupted:
            client.coordinator.push_steer(turn_id, steer)
        for answered in receipt.denied:
            client.coordinator.publish(list(answered.events))
        # Committed: now publish and kick.  (A repeated request kicks again, in case its
        # first kick was lost.)
        _name_in_logs(receipt.turn)
        self._announce(receipt.queued)
        if receipt.created:
            metrics.turn_submitted()
        return TurnHandle(client, receipt.turn, created=receipt.created)

    def _announce(self, queued: Event | None) -> None:
        """Publish a committed turn's ``queued`` event and get a driver to the session:
        one kick, unless a kick sent earlier is still waiting for a driver, or a driver
        holds the session (either sees this turn: the submission committed first)."""
        client = self._client
        if queued is None or client.coordinator.mark_work(self.id, [queued]):
            client._kicker.kick(self.id)

    def seed_history(
        self, messages: list[dict[str, Any]], raw_rows: list[Any] | None = None
    ) -> list[TurnRecord]:
        """Import an existing conversation before the session's first turn: ``messages``
        in the OpenAI chat format (``role`` user, assistant or tool; ``content``;
        ``tool_calls``; ``tool_call_id``), which become the session's first turns and
        replay like any others, checked like any others (:class:`CodecError` for a tool
        call without its result); ``raw_rows``, the host's lossless form of the same
        conversation, kept beside them (:meth:`seeded`).  :class:`Conflict` once the
        session has a turn."""
        turns = seeded_turns(messages)
        if raw_rows is not None:
            if not isinstance(raw_rows, list):
                raise InvalidRequest("raw_rows must be a list (of JSON values) or None")
            check_json_object({"raw_rows": raw_rows}, "raw_rows", MAX_PROMPT_BYTES * 10)
        check_json_object({"messages": list(messages)}, "messages", MAX_PROMPT_BYTES * 10)
        self._client._check_open()
        return self._client.store.seed_history(
            self.id,
            [(t.prompt, t.steps) for t in turns],
            messages=list(messages),
            raw_rows=raw_rows,
        )

    def transcript(self) -> list[transcript.Row]:
        """The history path's rows (root → head), typed: see :mod:`parley.transcript`."""
        store = self._client.store
        found: list[transcript.Row] = []
        for turn in store.history(self.id):
            state = store.run_state(turn.turn_id)
            found.extend(
                transcript.rows(
                    turn.turn_id,
                    turn.prompt,
                    store.steps_of(turn.turn_id),
                    partial=state.partial,
                    seeded=state.worker == SEEDED,
                )
            )
        return found

    def seeded(self) -> tuple[list[dict[str, Any]], list[Any] | None] | None:
        """The seeded messages and raw rows as they were given (None: not seeded)."""
        return self._client.store.seeded(self.id)

    def branch_from(self, turn_id: str) -> None:
        """Make ``turn_id`` the head: the next turn hangs under it.  One write."""
        if turn_id is None or turn_id == "":
            raise InvalidRequest("branch_from needs a turn id")
        _check_id(turn_id)
        self._client._check_open()
        self._client.store.branch(self.id, turn_id)

    def history(self) -> list[TurnRecord]:
        """The turns from the root to the head: what the model sees."""
        return self._client.store.history(self.id)

    def tree(self) -> list[TurnRecord]:
        """Every turn of every branch, in submission order."""
        return self._client.store.tree(self.id)

    def resume(self, turn_id: str) -> TurnHandle:
        """Continue a cancelled, failed or stranded turn from its last committed step,
        with the same turn id and run id.  Its end moves the head to it, so an ended turn
        is resumed only while nothing follows it: a turn under it, a turn still to run,
        or a head moved past it (or past its parent) is a :class:`Conflict`; to go on
        from such a turn, ``branch_from`` it and submit a new turn."""
        _check_id(turn_id)
        client = self._client
        client._check_open()
        turn = client.store.get_turn(turn_id)
        if turn.session_id != self.id:
            raise ForeignTurn(f"turn {turn_id!r} belongs to session {turn.session_id!r}")
        client._kicker.ready()
        turn, queued = client.store.resume_turn(turn_id, client.coordinator.last_seq(turn_id))
        _name_in_logs(turn)
        self._announce(queued)
        return TurnHandle(client, turn)


class TurnHandle:
    """A turn, seen from a caller: its events, its steering, its result."""

    def __init__(self, client: Client, record: TurnRecord, *, created: bool = False) -> None:
        self._client = client
        self.turn_id = record.turn_id
        self.run_id = record.run_id
        self.session_id = record.session_id
        self.created = created
        """Whether the call that returned this handle created the turn (False for a
        repeated ``request_id``, an attach or a resume)."""
        self.submitted = record
        """The turn as it was when this handle was made (``record()`` reads it anew)."""

    def __repr__(self) -> str:
        return f"<parley.TurnHandle {self.turn_id}>"

    def record(self) -> TurnRecord:
        """The turn as stored now."""
        return self._client.store.get_turn(self.turn_id)

    def events(self, after: int = 0, *, stop: threading.Event | None = None) -> Iterator[Event]:
        """Every event with seq > ``after``, once each and in order, ending after ``end``
        (or, without it, within half a second of ``stop`` being set)."""
        if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after <= MAX_SEQ:
            raise InvalidRequest(f"after must be a seq: an integer from 0 to {MAX_SEQ}")
        client = self._client
        return follow(
            self.turn_id,
            after,
            coordinator=client.coordinator,
            store=client.store,
            driver_failure=lambda: client._kicker.failure(self.session_id),
            stop=stop,
        )

    def latest_seq(self) -> int:
        """The newest seq the turn has published so far, without waiting for more:
        ``events(after=handle.latest_seq())`` shows only what comes next."""
        client = self._client
        return max(
            client.store.last_event_seq(self.turn_id), client.coordinator.last_seq(self.turn_id)
        )

    def say(self, text: str) -> int:
        """A message for the model at the next step boundary; :class:`TurnEnded` if the
        turn has ended (the message then goes nowhere, and you are told).  Returns its
        position in the turn's steer inbox (1 for the first steer, interrupts counted)."""
        text = _check_text(text, "say", MAX_STEER_BYTES)
        client = self._client
        client._check_open()
        steer = client.store.add_steer(self.turn_id, SteerKind.SAY, text)
        client.coordinator.push_steer(self.turn_id, steer)
        return steer.position

    def interrupt(self) -> int:
        """Stop the turn at the next step boundary (at once while the model streams);
        :class:`TurnEnded` if it has ended.  Returns the interrupt's position in the
        turn's steer inbox, as :meth:`say` does."""
        client = self._client
        client._check_open()
        # Accepted (durable) first, then listed: a streaming driver that sees it in the
        # turn's steer list stops at once, and the next boundary stops in any case.  A
        # turn waiting for answers has its pending calls denied with it, and goes on to
        # commit its held step and stop.
        receipt = client.store.accept_steer(self.turn_id, SteerKind.INTERRUPT, "")
        client.coordinator.push_steer(self.turn_id, receipt.steer)
        if receipt.denied is not None:
            client._signal_answered(receipt.denied)
        return receipt.steer.position

    def approvals(self) -> list[Approval]:
        """The calls of this turn that wait for a person's answer, oldest first."""
        return [a for a in self._client.store.approvals(self.turn_id) if a.pending]

    def approve(self, approval_id: str, reason: str | None = None) -> Approval:
        """Approve a waiting call, from any process (``reason``: a note kept with the
        answer): it runs once the step's last answer is in.  :class:`Conflict` if it has
        its answer already (naming it), :class:`InvalidRequest` if the turn has no such
        call."""
        return self._answer(approval_id, Decision.APPROVED, reason)

    def deny(self, approval_id: str, reason: str | None = None) -> Approval:
        """Deny a waiting call: the model gets a result saying the operator denied it,
        and why (``reason``).  Errors as :meth:`approve`."""
        return self._answer(approval_id, Decision.DENIED, reason)

    def _answer(self, approval_id: str, decision: Decision, reason: str | None) -> Approval:
        if (
            not isinstance(approval_id, str)
            or not approval_id
            or len(approval_id) > 36
            or not storable(approval_id)
        ):
            raise InvalidRequest(f"not an approval id: {approval_id!r}")
        if reason is not None:
            reason = _check_text(reason, "reason", MAX_STEER_BYTES)
        client = self._client
        client._check_open()
        answered = client.store.answer_approval(self.turn_id, approval_id, decision, reason)
        client._signal_answered(answered)
        return answered.approvals[0]

    def result(self) -> TurnResult | None:
        """The result if the turn has ended, else None."""
        return self._client.store.turn_result(self.turn_id)

    def wait(self, timeout: float | None = None) -> TurnResult:
        """Block until the turn ends; :class:`WaitTimeout` after ``timeout`` seconds (naming
        Redis if it could not be reached: the fleet cannot run the turn without it)."""
        _check_timeout(timeout)
        return self._wait_until(None if timeout is None else time.monotonic() + timeout, timeout)

    def _wait_until(self, deadline: float | None, timeout: float | None) -> TurnResult:
        """What :meth:`wait` does, until the monotonic ``deadline`` (that of ``timeout``,
        which its error names)."""
        client = self._client
        # The store, which holds the truth, is asked first, then after each end the
        # coordinator reports and after each silent poll (it may have lost the signal, or
        # never seen the turn).  Between, block on the turn's ends (one small key, not its
        # tokens); reading them from the start returns at once an end already there.
        seen = 0
        result = client.store.turn_result(self.turn_id)
        while result is None:
            self._raise_if_driver_died()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                outage = client.coordinator.outage()
                if outage is not None:
                    raise WaitTimeout(
                        f"turn {self.turn_id} did not end within {timeout}s: {outage}, and "
                        "the fleet's workers need it to run the turn"
                    )
                raise WaitTimeout(f"turn {self.turn_id} still running after {timeout}s")
            pause = WAIT_POLL_SECONDS if remaining is None else min(WAIT_POLL_SECONDS, remaining)
            seen = client.coordinator.wait_end(self.turn_id, seen, timeout=pause) or seen
            result = client.store.turn_result(self.turn_id)
        return result

    def _raise_if_driver_died(self) -> None:
        client = self._client
        failure = client._kicker.failure(self.session_id)
        if failure is not None and not client.store.run_state(self.turn_id).status.terminal:
            raise StoreError(f"the driver of this session stopped: {failure}") from failure


def _name_in_logs(turn: TurnRecord) -> None:
    """The lines logged from here on in an open log scope (a gateway request, a command)
    name this turn: the one the caller asked for or just made."""
    bind(session_id=turn.session_id, turn_id=turn.turn_id, run_id=turn.run_id)


def _check_timeout(timeout: Any) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout):
        raise InvalidRequest(f"timeout must be a number of seconds or None, not {timeout!r}")


def check_metadata(metadata: Any) -> None:
    """:class:`InvalidRequest` unless ``metadata`` is session metadata ``open_session``
    takes: JSON that comes back as it went in (string keys, no sets, NaN or infinity), at
    most :data:`MAX_METADATA_BYTES` of it."""
    check_json_object(metadata, "metadata", MAX_METADATA_BYTES)


def check_title(title: Any) -> None:
    """:class:`InvalidRequest` unless ``title`` is a session title (one line of printable
    text, at most :data:`~workers.store.session_titles.MAX_TITLE_CHARS` characters)."""
    problem = title_problem(title)
    if problem is not None:
        raise InvalidRequest(problem)


def check_json_object(value: Any, what: str, limit: int) -> None:
    """:class:`InvalidRequest` unless ``value`` is a JSON object that comes back as it
    went in (string keys, no sets, NaN or infinity, no NUL or lone surrogate in any
    string), of at most ``limit`` bytes and :data:`MAX_JSON_DEPTH` levels."""
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a dict")
    # Before json.dumps, which recurses (and a value that contains itself nests forever).
    if _nests_deeper_than(value, MAX_JSON_DEPTH):
        raise InvalidRequest(
            f"{what} must nest its objects and arrays at most {MAX_JSON_DEPTH} levels deep"
        )
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{what} must be JSON: {exc}") from exc
    if json.loads(text) != value:
        raise InvalidRequest(f"{what} must be JSON: string keys, and lists rather than tuples")
    if not all(storable(item) for item in _strings(value)):
        raise InvalidRequest(f"{what} must be JSON text without NUL characters or lone surrogates")
    if len(text.encode("utf-8")) > limit:
        raise InvalidRequest(f"{what} must be at most {limit} bytes of JSON")


def _nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` has dicts, lists or tuples more than ``limit`` levels deep (walked
    without recursion)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


def _strings(value: Any) -> Iterator[str]:
    """Every string of a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _check_id(value: Any, missing: type[ParleyError] = InvalidRequest) -> None:
    try:
        validate_ids(value)
    except InvalidRequest as exc:
        if missing is InvalidRequest:
            raise
        raise missing(str(exc)) from exc


def _check_text(value: str | bytes, what: str, limit: int) -> str:
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest(
                f"the {what} is not valid UTF-8: {exc.reason} at byte {exc.start}"
            ) from exc
    if not isinstance(value, str):
        raise InvalidRequest(f"the {what} must be text, not {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"the {what} is not valid UTF-8 (lone surrogate at {exc.start})"
        ) from exc
    if not value.strip():
        raise InvalidRequest(f"the {what} is empty")
    if "\x00" in value:
        raise InvalidRequest(f"the {what} contains a NUL character")
    if size > limit:
        raise InvalidRequest(f"the {what} is {size} bytes; the limit is {limit}")
    return value


def _check_if_busy(value: IfBusy | str) -> IfBusy:
    try:
        return IfBusy(value)
    except ValueError:
        raise InvalidRequest(
            f"if_busy must be one of {[b.value for b in IfBusy]}, not {value!r}"
        ) from None
