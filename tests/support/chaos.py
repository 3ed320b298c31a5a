"""A fleet of real worker processes to break, for the fleet failure tests: workers that a
test kills with SIGKILL (a worker's whole process group) and starts again, the sweeper,
and a client of them, each test on a database and a Redis database of its own."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.databases import fresh_postgres_database
from tests.support.fleet import Fleet, flush_redis, procfile_worker
from tests.support.helpers import Control
from tests.support.waiting import wait_until

CHAOS_REDIS_URL = os.environ.get("PARLEY_TEST_CHAOS_REDIS_URL", "redis://127.0.0.1:6379/10")
WORKSPACE_HOST = "tests.support.hosts:workspace_host"


DEPLOYMENTS = ("prefork", "shipped", "amqp")
"""How a failure test's fleet may be deployed: ``prefork``, one kick at a time per worker
process (Celery's default pool); ``shipped``, the Procfile's worker line (its pool and
concurrency); ``amqp``, the same with RabbitMQ as the broker (Redis stays the
coordination store).  Every failure test runs on the first two; those marked
``also_amqp`` on the third as well (tests/acceptance/conftest.py)."""


def deployment_options(name: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """The :class:`Chaos` options of the deployment ``name`` (RabbitMQ's virtual host
    comes from the ``amqp_url`` fixture)."""
    if name == "prefork":
        return {"pool": "prefork"}
    pool, concurrency = procfile_worker()
    options: dict[str, Any] = {"pool": pool, "concurrency": concurrency}
    if name == "amqp":
        options["broker_url"] = request.getfixturevalue("amqp_url")
    return options


class Chaos:
    """A fleet of ``workers`` workers (two by default) of ``processes`` processes each
    (one by default) on Celery's ``pool``, each process running ``concurrency`` kicks at
    a time (``worker_env``: more of the workers' environment), plus the sweeper; and a
    client of it.  ``fleet`` are the :class:`Fleet`'s own options: its ``host``
    (default: ``workspace_host``), its coordination Redis ``redis_url`` (default: the
    chaos Redis database) and its broker ``broker_url`` (default: that Redis)."""

    def __init__(
        self,
        database_url: str,
        workspace: Path,
        *,
        pool: str,
        concurrency: int = 1,
        workers: int = 2,
        processes: int = 1,
        worker_env: dict[str, str] | None = None,
        **fleet: Any,
    ) -> None:
        options = {"redis_url": CHAOS_REDIS_URL, "host": WORKSPACE_HOST, **fleet}
        self.fleet = Fleet(database_url=database_url, **options)
        self.database_url = database_url
        self.redis_url = self.fleet.redis_url
        self.workspace = workspace
        self.pool = pool
        self.concurrency = concurrency
        self.processes = processes
        self.control = Control(workspace)
        self.workers = [
            self.fleet.start_worker(concurrency, pool, processes=processes, env=worker_env)
            for _ in range(workers)
        ]
        self.fleet.start_beat()
        self.fleet.wait_ready()
        self.client = self.fleet.client()

    def worker_group_of(self, pid: int) -> int:
        """The process group (one `parley worker`) that process ``pid`` belongs to."""
        group = os.getpgid(pid)
        assert group in {w.pid for w in self.workers}, f"{pid} is not one of our workers"
        return group

    def driver_pid(self, turn_id: str) -> int:
        """The pid of the worker process that claimed the turn last."""
        worker = self.client.store.run_state(turn_id).worker
        assert worker is not None
        return int(worker.split(":")[1])

    def kill(self, worker: subprocess.Popen[bytes]) -> None:
        """SIGKILL a worker's whole process group (its pool's children too), and reap it."""
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)

    def kill_workers(self) -> None:
        """SIGKILL every worker still alive: no process is left to drive anything."""
        for worker in self.workers:
            if worker.poll() is None:
                self.kill(worker)

    def start_worker(self) -> subprocess.Popen[bytes]:
        """Start one more worker like the others and wait until it consumes the queue."""
        worker = self.fleet.start_worker(self.concurrency, self.pool, processes=self.processes)
        self.workers.append(worker)
        log = self.fleet.log_of(worker)
        wait_until(
            lambda: (
                worker.poll() is not None or log.read_bytes().count(b"ready.") >= self.processes
            ),
            what="the new worker to be ready",
        )
        assert worker.poll() is None, f"the new worker exited; see {log}"
        return worker

    def close(self) -> None:
        self.client.close()
        self.fleet.stop()


@contextmanager
def chaos_fleet(workspace: Path, *, pool: str, **options: Any) -> Iterator[Chaos]:
    """A :class:`Chaos` fleet on a fresh database and the emptied chaos Redis database,
    stopped (and the database dropped) after."""
    with fresh_postgres_database("chaos") as url:
        flush_redis(options.get("redis_url", CHAOS_REDIS_URL))
        harness = Chaos(url, workspace, pool=pool, **options)
        try:
            yield harness
        finally:
            harness.close()
