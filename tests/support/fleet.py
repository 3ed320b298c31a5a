"""Start and stop the Procfile's fleet processes for tests: real `parley worker` and
`parley beat` processes against the test run's PostgreSQL database and a dedicated Redis
database number."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

import parley
from parley.coordination.constants import BATCH_QUEUE_SUFFIX
from parley.fleet.app import is_amqp
from tests.support.rabbitmq import consumers, delete_queue, queue_type

REPO = Path(__file__).resolve().parents[2]
REDIS_TEST_URL = os.environ.get("PARLEY_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")


def procfile() -> dict[str, str]:
    """The Procfile's command lines, by process type."""
    lines = (REPO / "Procfile").read_text().splitlines()
    entries = (line.split(":", 1) for line in lines if line.strip() and not line.startswith("#"))
    return {name.strip(): command.strip() for name, command in entries}


def procfile_worker() -> tuple[str, int]:
    """The Celery pool and concurrency of the Procfile's worker line: what a deployment
    that copies it runs, and so what the fleet tests run on."""
    argv = shlex.split(procfile()["worker"])
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("-P", "--pool", default="prefork")  # (Celery's defaults)
    options.add_argument("-c", "--concurrency", type=int, default=os.cpu_count())
    known, _ = options.parse_known_args(argv[argv.index("worker") + 1 :])
    return str(known.pool), int(known.concurrency)


STARTED_LOGS: list[Path] = []
"""The logs of every fleet process started in this test process, in order: a failed
test's report shows the tails of those its test started (tests/conftest.py)."""


def log_tails(logs: list[Path], lines: int = 40) -> str:
    """The last ``lines`` of each of ``logs``, headed by its name."""
    parts = []
    for log in logs:
        try:
            tail = log.read_text(errors="replace").splitlines()[-lines:]
        except OSError as error:
            tail = [f"(unreadable: {error})"]
        parts.append(f"--- {log.name}\n" + "\n".join(tail))
    return "\n".join(parts)


@dataclass
class Fleet:
    """A set of worker and beat processes serving one queue, with the coordination Redis
    ``redis_url`` and the broker ``broker_url`` (default: that Redis; or RabbitMQ)."""

    database_url: str
    host: str = "tests.support.hosts:workspace_host"
    redis_url: str = REDIS_TEST_URL
    broker_url: str | None = None
    queue: str = field(default_factory=lambda: f"parley.test.{uuid.uuid4().hex[:8]}")
    log_dir: Path = field(default_factory=lambda: Path(os.environ.get("TMPDIR", "/tmp")))
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: dict[int, Path] = field(default_factory=dict)  # by pid
    worker_processes: dict[int, int] = field(default_factory=dict)  # by pid: its processes
    environment: dict[str, str] = field(default_factory=dict)
    """More variables for every fleet process (``PARLEY_LOG_FORMAT``, say)."""

    def env(self) -> dict[str, str]:
        """The environment every fleet process (and fleet client) gets."""
        return {
            **os.environ,
            "PARLEY_DATABASE_URL": self.database_url,
            "PARLEY_REDIS_URL": self.redis_url,
            "PARLEY_BROKER_URL": self.broker,
            "PARLEY_HOST": self.host,
            "PARLEY_QUEUE": self.queue,
            "PARLEY_SWEEP_SECONDS": "1",
            # src first: the package may be installed (editable) from another checkout
            # (a benchmark's other side), which the root alone would not shadow.
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
            **self.environment,
        }

    @property
    def broker(self) -> str:
        """The broker's URL."""
        return self.broker_url or self.redis_url

    def client(self) -> parley.Client:
        """A fleet client (producer and reader) of this fleet."""
        return parley.connect(
            self.database_url, redis_url=self.redis_url, broker_url=self.broker, queue=self.queue
        )

    def start_worker(
        self,
        concurrency: int = 2,
        pool: str = "prefork",
        *,
        processes: int = 1,
        celery_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """A `parley worker` of ``processes`` processes (one unless asked: tests run on
        few cores), each running ``concurrency`` kicks at a time on Celery's ``pool``
        (``prefork`` or ``threads``), in its own process group, so a test can kill it
        whole; ``celery_args`` and ``env`` are more of its arguments and its environment
        (its metrics port, say)."""
        argv = ("worker", "--processes", str(processes), "--concurrency", str(concurrency))
        process = self._start(*argv, "--pool", pool, *celery_args, env=env)
        self.worker_processes[process.pid] = processes
        return process

    def start_beat(self, *, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """The sweeper process (``env``: more of its environment)."""
        return self._start("beat", env=env)

    def log_of(self, process: subprocess.Popen[bytes]) -> Path:
        """Where ``process`` (one this fleet started) writes its output."""
        return self.logs[process.pid]

    def _start(self, *argv: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"{self.queue}-{argv[0]}-{len(self.processes)}.log"
        with log.open("wb") as out:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(
                [sys.executable, "-m", "parley", *argv],
                env={**self.env(), **(env or {})},
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.logs[process.pid] = log
        self.processes.append(process)
        STARTED_LOGS.append(log)
        return process

    def wait_ready(self, timeout: float = 30) -> None:
        """Block until every worker started so far is ready and the queue is consumed (a
        test that kills one expects another to take over at once)."""
        deadline = time.monotonic() + timeout
        workers = [p for p in self.processes if "worker" in p.args[3:4]]  # type: ignore[index]
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"a fleet process exited; see {self.log_dir}/{self.queue}-*.log")
            ready = all(
                self.log_of(w).read_bytes().count(b"ready.") >= self.worker_processes.get(w.pid, 1)
                for w in workers
            )
            if ready and self._consumed():
                self._check_queue_types()
                return
            time.sleep(0.1)
        raise TimeoutError("the fleet's workers did not become ready")

    def _check_queue_types(self) -> None:
        """On RabbitMQ, both lanes' queues are of the fleet's type: quorum, unless its
        environment says ``PARLEY_BROKER_QUEUE_TYPE=classic``."""
        if not is_amqp(self.broker):
            return
        wanted = self.env().get("PARLEY_BROKER_QUEUE_TYPE") or "quorum"
        for queue in (self.queue, self.queue + BATCH_QUEUE_SUFFIX):
            found = queue_type(self.broker, queue)
            assert found == wanted, f"RabbitMQ's {queue} is a {found} queue, not {wanted}"

    def _consumed(self) -> bool:
        """Whether a worker consumes the queue, as the broker sees it."""
        if is_amqp(self.broker):
            return consumers(self.broker, self.queue) > 0
        client = redis.Redis.from_url(self.broker)
        try:
            return bool(client.exists(f"_kombu.binding.{self.queue}"))
        finally:
            client.close()

    def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL)."""
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        self.processes.clear()
        if is_amqp(self.broker):
            # (RabbitMQ keeps a durable queue: both lanes')
            for queue in (self.queue, self.queue + BATCH_QUEUE_SUFFIX):
                delete_queue(self.broker, queue)


def flush_redis(url: str = REDIS_TEST_URL) -> None:
    """Empty the tests' Redis database."""
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()
