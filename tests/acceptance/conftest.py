"""The acceptance suite runs every test body on each deployment its module declares
(``pytestmark = on_deployments()``, tests/support/deployments.py): embedded on SQLite,
embedded on PostgreSQL, and the fleet (real worker and sweeper processes) on PostgreSQL
and Redis.  Tests of in-process hooks carry ``@pytest.mark.embedded_only``; those marked
``also_amqp`` run on a second fleet too, whose broker is RabbitMQ.  A test that collects
fewer cases than it declares fails the run (:func:`pytest_collection_modifyitems`).

``PARLEY_TEST_FLEET_BROKER=amqp`` puts the main fleet on RabbitMQ as well, so that the
whole suite runs on it (``-k fleet`` for the fleet's share alone).  The failure tests'
fleets are deployed as ``deployment`` says (``on_fleet_deployments()``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import parley
from tests.support.databases import fresh_postgres_database
from tests.support.deployments import (
    AMQP,
    Declared,
    declared,
    marked,
    missing_cases,
    undeclared_parameter,
)
from tests.support.fleet import Fleet, flush_redis
from tests.support.helpers import Control
from tests.support.hosts import workspace_host
from tests.support.terminal import terminals as terminals  # (a fixture: tmux panes)

FLEET_BROKER = os.environ.get("PARLEY_TEST_FLEET_BROKER", "redis")
DECLARED = pytest.StashKey[dict[str, Declared]]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "deployments(*names, parameter): the deployments a test runs on, as the parameter"
        " named (tests/support/deployments.py)",
    )
    config.stash[DECLARED] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    found = declared(metafunc.definition)
    asked = undeclared_parameter(metafunc.fixturenames, found)
    if asked is not None:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid} asks for {asked!r} but declares no deployments:"
            " mark it (or its module) with on_deployments() or on_fleet_deployments()"
        )
    if found is None or found.parameter not in metafunc.fixturenames:
        return  # (a test of a declaring module that runs the same on every deployment)
    metafunc.config.stash[DECLARED][metafunc.definition.nodeid] = found
    metafunc.parametrize(found.parameter, [marked(name) for name in found.names])


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect any case
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the run if a test collected fewer cases of a deployment than it declares
    (unless the command line picked cases by their ids)."""
    if any("[" in arg for arg in config.args):
        return
    problems = missing_cases(items, config.stash[DECLARED])
    if problems:
        raise pytest.UsageError(
            "parametrised tests collected fewer cases than they declare:\n" + "\n".join(problems)
        )


@pytest.fixture(scope="session")
def fleet(fleet_postgres_url: str, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """One worker (two processes) and a sweeper for the whole acceptance run, on the
    broker ``PARLEY_TEST_FLEET_BROKER`` names (``redis``, the default, or ``amqp``)."""
    broker = request.getfixturevalue("amqp_url") if FLEET_BROKER == "amqp" else None
    yield from _fleet(fleet_postgres_url, broker)


@pytest.fixture(scope="session")
def amqp_fleet_postgres_url() -> Iterator[str]:
    """The RabbitMQ fleet's own database (a fleet's sweeper adopts every turn it finds in
    its database: with one database, the other fleet would drive this one's turns)."""
    with fresh_postgres_database("amqp_fleet") as url:
        yield url


@pytest.fixture(scope="session")
def amqp_fleet(amqp_fleet_postgres_url: str, amqp_url: str) -> Iterator[Fleet]:
    """The same fleet with RabbitMQ as its broker, for the tests marked ``also_amqp``;
    its Redis (the coordination store) is the main fleet's, whose keys name sessions
    and turns that are not its own."""
    yield from _fleet(amqp_fleet_postgres_url, amqp_url)


def _fleet(database_url: str, broker_url: str | None) -> Iterator[Fleet]:
    pool = Fleet(database_url=database_url, broker_url=broker_url)
    flush_redis(pool.redis_url)
    yield from _running(pool)


def _running(processes: Fleet, **worker: Any) -> Iterator[Fleet]:
    """``processes`` with a worker (``worker``: its options) and the sweeper, ready;
    stopped after."""
    processes.start_worker(**worker)
    processes.start_beat()
    try:
        processes.wait_ready()
        yield processes
    finally:
        processes.stop()


def fleet_of(backend: str, request: pytest.FixtureRequest) -> Fleet | None:
    """The fleet the backend ``backend`` runs on (None: embedded)."""
    if not backend.startswith("fleet"):
        return None
    pool: Fleet = request.getfixturevalue("amqp_fleet" if backend == AMQP else "fleet")
    return pool


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "embedded-sqlite":
        return f"sqlite:///{tmp_path / 'parley.db'}"
    pool = fleet_of(backend, request)
    url: str = pool.database_url if pool is not None else request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def control(workspace: Path) -> Control:
    """The test's handle on what ``workspace_host`` does."""
    return Control(workspace)


@pytest.fixture
def subprocess_env(backend: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """What a second process needs to reach the same deployment."""
    pool = fleet_of(backend, request)
    if pool is not None:
        env = pool.env()
        env.pop("PARLEY_HOST")
        return env
    return {
        "PARLEY_HOST": "tests.support.hosts:workspace_host",
        "PYTHONPATH": str(Path(__file__).parents[2]),
    }


ClientFactory = Callable[..., parley.Client]


@pytest.fixture
def make_client(
    backend: str, db_url: str, control: Control, request: pytest.FixtureRequest
) -> Iterator[ClientFactory]:
    """``make_client(rules, policy={...})`` sets this test's script and policy and returns
    a client of the deployment under test; ``make_client(host=...)`` (embedded only) runs
    an in-process host instead."""
    clients: list[parley.Client] = []
    pool = fleet_of(backend, request)
    if pool is not None:
        flush_redis(pool.redis_url)

    def factory(
        rules: list[dict[str, Any]] | None = None,
        *,
        policy: dict[str, Any] | None = None,
        host: parley.Host | None = None,
    ) -> parley.Client:
        if rules is not None:
            control.script(rules)
        if policy is not None:
            control.policy(**policy)
        if pool is not None:
            assert host is None, (
                "an in-process host cannot reach the fleet: mark the test embedded_only"
            )
            client = pool.client()
        else:
            client = parley.connect(db_url, host=host or workspace_host(), migrate_schema=True)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        client.close(timeout=10)


def host_fleet(host: str) -> Any:
    """A module-scoped fixture: a fleet (a threads-pool worker and a sweeper) whose
    workers load ``host``, on a database of its own (a sweeper adopts every turn of its
    database, so two fleets with different hosts must never share one)."""

    @pytest.fixture(scope="module")
    def fixture() -> Iterator[Fleet]:
        with fresh_postgres_database("host") as url:
            yield from _running(Fleet(database_url=url, host=host), concurrency=2, pool="threads")

    return fixture


@contextmanager
def deployed_client(
    deployment: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    *,
    fleet: str,
    host: Callable[[], parley.Host],
) -> Iterator[parley.Client]:
    """A client of ``deployment`` whose turns run on ``host``: in this process, or on the
    fleet the fixture named ``fleet`` (a :func:`host_fleet`) started with it."""
    if deployment.startswith("fleet"):
        pool: Fleet = request.getfixturevalue(fleet)
        flush_redis(pool.redis_url)
        with parley.connect(pool.database_url, redis_url=pool.redis_url, queue=pool.queue) as c:
            yield c
        return
    if deployment == "embedded-sqlite":
        url = f"sqlite:///{tmp_path / 'runs.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    with parley.connect(url, host=host(), migrate_schema=True) as embedded:
        yield embedded
