"""The store's connection: SQLAlchemy's, with statements on PostgreSQL run on psycopg.

SQLAlchemy keeps what it is good at: the pool, transactions, isolation levels and the
SQL itself, built once per statement in :mod:`parley.store.statements`.  Executing a built
statement through SQLAlchemy still costs about 30 µs of Python per call (parameter
construction, execution context, result metadata) on top of psycopg's own work, and a
turn runs a dozen statements between producer and worker.  So on PostgreSQL a statement
is compiled once into PostgreSQL's own SQL (``$1`` placeholders, which psycopg's raw
cursor sends as they are: no query parsing per call), its fixed values and its bind
processors; each call binds values and runs it on the same DBAPI connection, inside the
same transaction.

An insert of a few rows runs as one multi-row statement rather than psycopg's
``executemany`` (a statement per row through a pipeline, which costs more Python than
the insert).  Statements that need what only SQLAlchemy does at execution time
(expanding ``IN`` lists, Python-side column defaults, ``RETURNING`` over many rows) go
through SQLAlchemy.  Errors become SQLAlchemy's, so callers handle one kind, and
``before_cursor_execute`` listeners see every statement either way (with no execution
context on the direct path).
"""

from __future__ import annotations

import json
import re
import threading
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

import psycopg
from sqlalchemy import JSON, Connection, CursorResult, Engine, Insert, Table
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    InvalidRequestError,
    MultipleResultsFound,
    NoResultFound,
    SQLAlchemyError,
)
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement, Executable

from parley.schemas.errors import ParleyError, StoreError
from parley.store import statements as q
from parley.store.database import transaction_lock
from parley.store.statements.binds import MAX_INSERT_ROWS, many_rows, row_key

Params = Mapping[str, Any]


EXECUTE_MANY = -1
MAX_COMPILED = 512

_PLACEHOLDER = re.compile(r"%\(([^)]+)\)s|%%")


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A statement as psycopg runs it."""

    sql: str
    names: tuple[str, ...]
    """The bind names, in the order of their placeholders ``$1``, ``$2``…"""
    fixed: dict[str, Any]
    """Values the statement carries itself (literals SQLAlchemy turned into binds)."""
    processors: tuple[tuple[str, Callable[[Any], Any]], ...]
    statement: Executable  # held so that its id, the cache key, stays its own


class DirectStatements:
    """The compiled forms of one dialect's statements (PostgreSQL only), built on first
    use.  One per store; safe to share between threads (a race compiles twice)."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._compiled: dict[tuple[int, tuple[str, ...], int], _Compiled | None] = {}

    def get(self, statement: Executable, keys: tuple[str, ...], rows: int) -> _Compiled | None:
        """``statement`` compiled for bind names ``keys``, to run once (``rows`` 0), once
        per item of a list (``EXECUTE_MANY``), or as one insert of ``rows`` rows whose
        binds are named by :func:`row_key`; None if it needs SQLAlchemy."""
        key = (id(statement), keys, rows)
        try:
            return self._compiled[key]
        except KeyError:
            found = self._compile(statement, keys, rows)
            if len(self._compiled) < MAX_COMPILED:
                # parley's statements are built once; past this, something builds them
                # per call, and they are compiled per call rather than kept alive.
                self._compiled[key] = found
            return found

    def _compile(self, statement: Executable, keys: tuple[str, ...], rows: int) -> _Compiled | None:
        held = statement
        if rows > 0:
            assert isinstance(statement, Insert)
            try:
                statement = many_rows(statement, keys, rows)
            except ArgumentError:
                return None  # an insert with values of its own: SQLAlchemy runs it per row
        many = rows == EXECUTE_MANY
        assert isinstance(statement, ClauseElement)
        compiled = statement.compile(dialect=self._dialect, column_keys=list(keys))
        assert isinstance(compiled, SQLCompiler)
        binds = compiled.bind_names
        if (
            compiled.insert_prefetch
            or compiled.update_prefetch
            or compiled.literal_execute_params
            or any(bind.expanding for bind in binds)
            or (many and compiled.effective_returning)
        ):
            return None
        fixed = {name: bind.effective_value for bind, name in binds.items() if not bind.required}
        processors = {}  # by name: binds sharing a name share one value, processed once
        for bind, name in binds.items():
            process = bind.type.dialect_impl(self._dialect).bind_processor(self._dialect)
            if process is not None:
                processors[name] = process
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return "%"  # a literal percent sign, escaped for the pyformat style
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        return _Compiled(
            sql=_PLACEHOLDER.sub(number, compiled.string),
            names=tuple(names),
            fixed=fixed,
            processors=tuple(processors.items()),
            statement=held,
        )


class StoreConnection:
    """What the store's methods run their statements on: one SQLAlchemy connection (and
    whatever transaction it is in), with ``direct`` statements run on psycopg."""

    __slots__ = ("_connection", "_direct")

    def __init__(self, connection: Connection, direct: DirectStatements | None) -> None:
        self._connection = connection
        self._direct = direct

    def execute(
        self, statement: Executable, params: Params | Sequence[Params] | None = None
    ) -> Rows | CursorResult[Any]:
        """Run ``statement`` with ``params`` (a list of them: once per item)."""
        if self._direct is not None:
            many = [] if params is None or isinstance(params, Mapping) else list(params)
            if params is not None and not isinstance(params, Mapping) and not many:
                params = None  # an empty list runs the statement once, as SQLAlchemy does
            first = many[0] if many else params
            assert first is None or isinstance(first, Mapping)
            keys = tuple(sorted(first or ()))
            if 0 < len(many) <= MAX_INSERT_ROWS and isinstance(statement, Insert):
                # One statement, where executemany runs one per row through a pipeline.
                rows = self._direct.get(statement, keys, len(many))
                if rows is not None:
                    flat = {row_key(i, k): v for i, row in enumerate(many) for k, v in row.items()}
                    return self._run(rows, _bind(rows, flat), False)
            compiled = self._direct.get(statement, keys, EXECUTE_MANY if many else 0)
            if compiled is not None:
                if many:
                    return self._run(compiled, [_bind(compiled, p) for p in many], True)
                return self._run(compiled, _bind(compiled, first), False)
        return self._connection.execute(statement, params)

    def rollback(self) -> None:
        """Roll back the transaction now (the caller returns without changes)."""
        self._connection.rollback()

    def insert_bulk(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert ``rows`` (each every column of ``table`` that is given, the same keys
        in each) in as few round trips as the database allows: ``COPY`` on PostgreSQL
        (a hundred thousand rows in a second or so, where a statement per row takes a
        minute), one ``executemany`` on SQLite (which has no network to save)."""
        if not rows:
            return
        if self._connection.dialect.name != "postgresql":
            self._connection.execute(table.insert(), list(rows))
            return
        keys = list(rows[0])
        as_json = {k for k in keys if isinstance(table.c[k].type, JSON)}
        raw = self._connection.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        columns = ", ".join(f'"{k}"' for k in keys)
        try:
            with (
                raw.cursor() as cursor,
                cursor.copy(f'COPY "{table.name}" ({columns}) FROM STDIN') as copy,
            ):
                for row in rows:
                    copy.write_row([_json_text(row[k]) if k in as_json else row[k] for k in keys])
        except psycopg.Error as exc:
            raise DBAPIError.instance(f"COPY {table.name}", None, exc, psycopg.Error) from exc

    def _run(self, compiled: _Compiled, bound: Any, many: bool) -> Rows:
        connection = self._connection
        raw = connection.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        try:
            cursor = psycopg.RawCursor(raw)
            if connection.dispatch.before_cursor_execute:
                connection.dispatch.before_cursor_execute(
                    connection, cursor, compiled.sql, bound, None, many
                )
            if many:
                cursor.executemany(compiled.sql, bound)
                return Rows((), (), cursor.rowcount)
            cursor.execute(compiled.sql, bound)
            result = cursor.pgresult
            if result is None or not result.nfields:
                return Rows((), (), cursor.rowcount)
            names = tuple((result.fname(i) or b"").decode() for i in range(result.nfields))
            return Rows(names, cursor.fetchall(), cursor.rowcount)
        except psycopg.Error as exc:
            broken = raw.broken or raw.closed
            if broken:
                # As SQLAlchemy does on a disconnect: this connection is discarded, and
                # every one opened before it is replaced at its next checkout (a server
                # that dropped one may have dropped them all).  The pool itself stays:
                # engine.dispose() would put a new pool in its place while the
                # connections other threads hold went back to the old one and stayed
                # open there, each disconnect adding up to a pool's worth to what the
                # process holds (docs/operations.md#concurrency).
                connection.engine.pool._invalidate(connection.connection, exc)
                connection.invalidate(exc)
            raise DBAPIError.instance(
                compiled.sql, bound, exc, psycopg.Error, connection_invalidated=bool(broken)
            ) from exc


def _bind(compiled: _Compiled, params: Params | None) -> list[Any]:
    """The values of ``compiled``'s placeholders, in order."""
    bound = {**compiled.fixed, **(params or {})}
    for name, process in compiled.processors:
        if name in bound:
            bound[name] = process(bound[name])
    try:
        return [bound[name] for name in compiled.names]
    except KeyError as missing:
        raise InvalidRequestError(f"a value is required for bind parameter {missing}") from None


class Rows:
    """A statement's result as the store reads it: SQLAlchemy's ``Result`` methods it
    uses, over rows read at once, each with attribute access and ``_mapping``."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, names: tuple[str, ...], values: Sequence[tuple[Any, ...]], count: int):
        make = _row_type(names)._make if names else tuple
        self._rows = [make(v) for v in values]
        self.rowcount = count

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def all(self) -> list[Any]:
        return list(self._rows)

    def one(self) -> Any:
        if len(self._rows) != 1:
            raise (NoResultFound if not self._rows else MultipleResultsFound)(
                f"expected one row, got {len(self._rows)}"
            )
        return self._rows[0]

    def one_or_none(self) -> Any:
        if len(self._rows) > 1:
            raise MultipleResultsFound(f"expected at most one row, got {len(self._rows)}")
        return self._rows[0] if self._rows else None

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalar_one_or_none(self) -> Any:
        row = self.one_or_none()
        return None if row is None else row[0]

    def scalars(self) -> list[Any]:
        return [row[0] for row in self._rows]


@lru_cache(maxsize=256)
def _row_type(names: tuple[str, ...]) -> Any:
    """A tuple type with the columns as attributes and ``_mapping``, as SQLAlchemy's
    rows have (columns whose names cannot be attributes are renamed, not lost)."""
    base: Any = namedtuple("Row", names, rename=True)  # type: ignore[misc]

    class Row(base):
        __slots__ = ()

        @property
        def _mapping(self) -> dict[str, Any]:
            return dict(zip(names, self, strict=True))

    return Row


class IntegrityConflict(StoreError):
    """A write violated a constraint (e.g. two submissions racing on one request_id)."""


@contextmanager
def store_errors() -> Iterator[None]:
    """Driver errors become :class:`StoreError` (a violated constraint the subclass
    :class:`IntegrityConflict`); parley's own errors pass through."""
    try:
        yield
    except ParleyError:
        raise
    except IntegrityError as exc:
        raise IntegrityConflict(f"constraint violated: {exc.orig}") from exc
    except SQLAlchemyError as exc:
        raise StoreError(f"database error: {exc.__class__.__name__}: {exc}") from exc


def _dropped(error: StoreError) -> bool:
    """Whether ``error`` came of a connection the server had dropped."""
    cause = error.__cause__
    return isinstance(cause, DBAPIError) and bool(cause.connection_invalidated)


_T = TypeVar("_T")


class Transactions:
    """A store's transaction plumbing on one engine: a transaction per call (driver
    errors translated), autocommit reads on PostgreSQL, the dialect's statements
    (:attr:`q`), and the counts benchmarks and logs read.  One per store, held by each
    of its repositories (:class:`~parley.store.sql_store.SqlStore`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = transaction_lock(engine)
        self.q = q.DialectStatements(engine.dialect.name)
        postgres = engine.dialect.name == "postgresql"
        self._direct = DirectStatements(engine.dialect) if postgres else None
        self.transactions = 0  # counted for logs and benchmarks: the process's, and
        self._thread = threading.local()  # each thread's (a driver's, on a threads pool)

    def close(self) -> None:
        """Release every pooled connection."""
        self.engine.dispose()

    @property
    def thread_transactions(self) -> int:
        """How many transactions the calling thread has begun (:attr:`transactions`
        counts the whole process's)."""
        count: int = getattr(self._thread, "transactions", 0)
        return count

    def count_transaction(self) -> None:
        self.transactions += 1
        self._thread.transactions = self.thread_transactions + 1

    @contextmanager
    def tx(self) -> Iterator[StoreConnection]:
        """One transaction; driver errors become :class:`StoreError`."""
        if self._lock is not None:
            self._lock.acquire()
        self.count_transaction()
        try:
            with store_errors(), self.engine.begin() as connection:
                yield StoreConnection(connection, self._direct)
        finally:
            if self._lock is not None:
                self._lock.release()

    def reading(self, read: Callable[[StoreConnection], _T]) -> _T:
        """Run ``read``, whose statements need no snapshot shared between them: on
        PostgreSQL each runs on its own (autocommit), sparing a ``BEGIN`` and a ``COMMIT``
        round trip per call, which readers polling a turn pay often.  SQLite reads in a
        transaction."""
        if self._lock is not None:
            with self.tx() as db:
                return read(db)
        try:
            return self._read_once(read)
        except StoreError as exc:
            if not _dropped(exc):
                raise
        # The server dropped the pooled connection just before it was checked out (its
        # goodbye not yet on the socket, so the checkout's look missed it).  SQLAlchemy
        # has discarded it and every connection pooled before; a read changes nothing,
        # so it runs once more on a fresh connection.
        return self._read_once(read)

    def _read_once(self, read: Callable[[StoreConnection], _T]) -> _T:
        with self.autocommit() as db:
            return read(db)

    @contextmanager
    def autocommit(self) -> Iterator[StoreConnection]:
        """A PostgreSQL connection on which each statement commits on its own."""
        with (
            store_errors(),
            self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as db,
        ):
            yield StoreConnection(db, self._direct)


def _json_text(value: Any) -> str | None:
    """A JSON column's value as ``COPY`` takes it: its text (None stays NULL)."""
    return None if value is None else json.dumps(value, separators=(",", ":"))
