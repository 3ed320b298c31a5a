"""Shared fixtures: a database per back end (SQLite file, and a fresh PostgreSQL database
per test run, dropped after), a workspace, and clients that are closed after each test.

PostgreSQL is never skipped: if the server named by PARLEY_TEST_PG_URL (default: the
machine's, on 127.0.0.1) is unreachable, the tests that need it fail."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.databases import fresh_postgres_database  # (neither reads the Redis settings)
from tests.support.rabbitmq import run_vhost


def _redis_databases_per_process() -> None:
    """Under pytest-xdist, each test process empties Redis databases of its own: the
    first keeps the defaults (9 and 10), the second 11 and 12, the third 13 and 14.  Set
    here, before any test module reads them (``PYTEST_XDIST_WORKER`` is set before the
    conftest files load); a variable set by the caller wins."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    number = int(worker.removeprefix("gw") or 0)
    if number == 0:
        return
    if number > 2:
        raise pytest.UsageError("the suite has Redis databases for at most three processes (-n 3)")
    base = 9 + 2 * number
    os.environ.setdefault("PARLEY_TEST_REDIS_URL", f"redis://127.0.0.1:6379/{base}")
    os.environ.setdefault("PARLEY_TEST_CHAOS_REDIS_URL", f"redis://127.0.0.1:6379/{base + 1}")


_redis_databases_per_process()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report ends with the tails of the fleet logs written while it ran
    (a fleet's worker explains most fleet failures, and its log is gone after CI)."""
    from tests.support.fleet import STARTED_LOGS, log_tails

    report = yield
    if report.failed:
        started = STARTED_LOGS[item.stash.get(_LOGS_BEFORE, len(STARTED_LOGS)) :]
        if started:
            report.sections.append(("fleet logs", log_tails(started)))
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    from tests.support.fleet import STARTED_LOGS

    item.stash[_LOGS_BEFORE] = len(STARTED_LOGS)


_LOGS_BEFORE = pytest.StashKey[int]()


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


_SHARED_DATABASES: list[str] = []
"""The run's shared PostgreSQL databases made so far in this process."""


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The embedded tests' PostgreSQL database."""
    with fresh_postgres_database("test") as url:
        _SHARED_DATABASES.append(url)
        yield url


@pytest.fixture(scope="session")
def fleet_postgres_url() -> Iterator[str]:
    """The fleet's own database: its sweeper adopts every turn it finds without a Redis
    lock, so it must not share a database with embedded clients (nor should a real
    deployment: a database is served by one kind of deployment)."""
    with fresh_postgres_database("fleet") as url:
        _SHARED_DATABASES.append(url)
        yield url


@pytest.fixture(autouse=True)
def _no_schedule_outlives_its_test() -> Iterator[None]:
    """A schedule a test made in a shared database is deleted after it: left there, it
    would fire in every later test's client with a host (an embedded client's recovery
    thread fires the schedules of its database, as a fleet's beat does), adding turns,
    hook calls and webhook deliveries to tests that made none."""
    yield
    for url in _SHARED_DATABASES:
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as db:
            db.execute("DELETE FROM schedule_runs")
            db.execute("DELETE FROM schedules")


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """RabbitMQ for the fleet tests that use it as their broker: the server
    ``PARLEY_TEST_AMQP_URL`` names, on a virtual host of this run's own."""
    with run_vhost() as url:
        yield url


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The database URL of each back end in turn."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'parley.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A small workspace root with a file to read and a secrets folder."""
    root = tmp_path / "workspace"
    (root / "secrets").mkdir(parents=True)
    (root / "retry.py").write_text("RETRY_ON = (502, 504)\n")
    (root / "secrets" / "token.txt").write_text("hunter2\n")
    return root
