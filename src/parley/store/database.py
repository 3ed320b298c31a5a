"""Engine creation and migrations for both back ends.

SQLite (embedded) and PostgreSQL (fleet) are the same schema.  SQLite gets WAL, a busy
timeout and ``BEGIN IMMEDIATE`` so that a transaction that reads then writes never fails
with a lock upgrade; transactions of one process are also serialised by a lock so that
threads of one process never see ``database is locked``.
"""

from __future__ import annotations

import os
import select
import threading
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

import parley.schemas as schemas
from parley.schemas.errors import InvalidRequest, StoreError

# The schemas package ships its migrations (package data); Alembic wants a directory.
MIGRATIONS = Path(schemas.__file__).resolve().parent / "migrations"
POOL_SIZE = 5
"""PostgreSQL connections an engine keeps, unless told otherwise."""
MAX_OVERFLOW = 10
"""PostgreSQL connections an engine opens beyond those in a burst, closed after."""
POOL_TIMEOUT = 60.0
"""How long a thread waits for a pooled PostgreSQL connection when every one is in use
(SQLAlchemy's default is 30 s): transactions are short, so a wait this long means the
server is not answering, and the caller gets a ``StoreError``."""
DEFAULT_ROLE = "parley"
"""What a process is to PostgreSQL unless it says (a fleet worker says ``parley-worker``,
the sweeper ``parley-beat``): its connections' ``application_name`` is the role and the
pid, ``parley-worker:4242``, so ``pg_stat_activity`` shows who holds each connection."""


def normalise_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` and drive them through psycopg 3."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def create_database_engine(
    url: str,
    *,
    pool_size: int = POOL_SIZE,
    max_overflow: int = MAX_OVERFLOW,
    role: str = DEFAULT_ROLE,
    pooler: str | None = None,
) -> Engine:
    """An engine for ``url``, configured for parley's transaction pattern.  On
    PostgreSQL it keeps up to ``pool_size`` connections and opens up to ``max_overflow``
    more in a burst; a thread that finds them all in use waits up to ``POOL_TIMEOUT``
    seconds for one (a fleet worker sizes them: :mod:`parley.runtime.concurrency`).
    Its connections name themselves ``<role>:<pid>`` (unless ``url`` names an
    ``application_name`` of its own).  ``pooler`` is ``PARLEY_DATABASE_POOLER``'s
    (``pgbouncer``, ``none``, or None: detected; docs/scaling.md#pgbouncer)."""
    url = normalise_url(url)
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise InvalidRequest(f"not a database URL: {url!r}") from exc
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url, in_memory=parsed.database in (None, "", ":memory:"))
    if parsed.get_backend_name() == "postgresql":
        return _postgres_engine(
            url, pool_size=pool_size, max_overflow=max_overflow, role=role, pooler=pooler
        )
    raise InvalidRequest(
        f"unsupported database {parsed.get_backend_name()!r}: use sqlite or postgresql"
    )


def in_memory(engine: Engine) -> bool:
    """Whether ``engine`` is SQLite in memory (a database no other process can open)."""
    url = engine.url
    if engine.dialect.name != "sqlite":
        return False
    return url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names (None for another database, or SQLite in memory)."""
    try:
        parsed = make_url(normalise_url(url))
    except (ArgumentError, InvalidRequest):
        return None  # connecting says what is wrong with it
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    if parsed.query.get("uri"):
        return None  # a SQLite URI (file:…?mode=…): its own rules
    return Path(parsed.database)


def _postgres_engine(
    url: str, *, pool_size: int, max_overflow: int, role: str, pooler: str | None
) -> Engine:
    # READ COMMITTED, whatever the server's default: a claim waits for a submission that
    # holds its session's row, then reads the runs it committed in a fresh snapshot.
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=POOL_TIMEOUT,
        isolation_level="READ COMMITTED",
    )

    @event.listens_for(engine, "do_connect")
    def _named(_dialect: Any, _record: Any, _args: Any, params: dict[str, Any]) -> None:
        # The pid when the connection opens, not when the engine was made: the process
        # that holds it.
        params.setdefault("application_name", f"{role}:{os.getpid()}")

    # Behind PgBouncer in transaction mode each transaction may run on another server
    # connection, where a statement psycopg prepared on the last one does not exist:
    # psycopg prepares none (prepare_threshold None).  parley keeps no other session
    # state (no SET, session advisory lock or LISTEN; the isolation level is set per
    # BEGIN, and the batch window's lock is its transaction's).
    behind: list[bool] = [] if pooler is None else [pooler == "pgbouncer"]

    @event.listens_for(engine, "connect")
    def _statements(dbapi_connection: Any, _record: Any) -> None:
        if not behind:
            behind.append(_behind_a_pooler(dbapi_connection))
        if behind[0]:
            dbapi_connection.prepare_threshold = None

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        # A pooled connection is silent while it idles (parley listens for no
        # notifications): something to read on its socket is the server's goodbye
        # (terminated backend, restart, idle timeout).  Raising makes the pool replace it,
        # as a ping would, without the round trip a ping costs on every transaction; at
        # worst a stray message costs a needless reconnect.
        if dbapi_connection.closed or _readable(dbapi_connection):
            raise DisconnectionError("the server closed this pooled connection")

    return engine


def _behind_a_pooler(dbapi_connection: Any) -> bool:
    """Whether the server answering on this connection listens on another port than the
    one it was reached on (a pooler forwards it); not over a Unix socket, where the
    server has no port to tell (set ``PARLEY_DATABASE_POOLER`` there)."""
    dialled = dbapi_connection.info.port
    row = dbapi_connection.execute("SELECT inet_server_port()").fetchone()
    dbapi_connection.rollback()
    return bool(row and row[0] is not None and int(row[0]) != int(dialled))


def behind_pooler(engine: Engine) -> bool:
    """Whether ``engine``'s connections run without server-side prepared statements (a
    pooler in transaction mode stands in front of PostgreSQL)."""
    if engine.dialect.name != "postgresql":
        return False
    with engine.connect() as connection:
        raw = connection.connection.driver_connection
        return getattr(raw, "prepare_threshold", 5) is None


def _readable(dbapi_connection: Any) -> bool:
    """Whether the connection's socket has input waiting (or cannot be polled at all).
    ``poll`` rather than ``select``, which refuses descriptors past 1023."""
    try:
        poller = select.poll()
        poller.register(dbapi_connection.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _sqlite_engine(url: str, *, in_memory: bool) -> Engine:
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": 30}}
    if in_memory:
        # One shared connection, or every thread would see its own empty database.
        kwargs["poolclass"] = StaticPool
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event emit BEGIN itself (pysqlite would defer it).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if not in_memory:
            cursor.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives an application crash; only an OS crash or power
        # loss can drop the last commits.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def transaction_lock(engine: Engine) -> threading.RLock | None:
    """The in-process lock that serialises SQLite transactions (None for PostgreSQL)."""
    if engine.dialect.name != "sqlite":
        return None
    lock: threading.RLock | None = getattr(engine, "_parley_lock", None)
    if lock is None:
        lock = threading.RLock()
        engine._parley_lock = lock  # type: ignore[attr-defined]
    return lock


def alembic_config() -> Config:
    """Alembic configuration pointing at the packaged migrations."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def migrate(engine: Engine) -> str:
    """Bring the schema to the newest revision; returns it."""
    config = alembic_config()
    lock = transaction_lock(engine)
    try:
        if lock is not None:
            lock.acquire()
        with engine.connect() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
            connection.commit()
    except SQLAlchemyError as exc:
        raise StoreError(f"migration failed: {exc}") from exc
    finally:
        if lock is not None:
            lock.release()
    return head_revision()


def head_revision() -> str:
    """The newest migration in the package."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None if never migrated)."""
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot reach the database: {exc}") from exc


def unmigrated(engine: Engine) -> StoreError | None:
    """The error to raise if the database is not at the package's newest revision, naming
    ``parley migrate`` (None if it is); ``StoreError`` if it cannot be reached."""
    if current_revision(engine) == head_revision():
        return None
    shown = engine.url.render_as_string(hide_password=True)
    return StoreError(f"the database at {shown} is not migrated: run `parley migrate`")


def check_migrated(engine: Engine) -> None:
    """``StoreError`` naming ``parley migrate`` unless the database is at the package's
    newest revision (or if it cannot be reached)."""
    error = unmigrated(engine)
    if error is not None:
        raise error
