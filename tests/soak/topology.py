"""What the soak runs and breaks: a PostgreSQL and a Redis of its own (on their own ports,
so it may restart them), RabbitMQ of its own in the ``amqp`` variant, the fleet as the
Procfile runs it (two workers on its pool and concurrency, the sweeper) and two gateways
on fixed ports (a restarted one comes back where its readers look for it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

from parley.store.database import create_database_engine, migrate
from tests.support.fleet import Fleet, procfile_worker
from tests.support.gateway import printed_url_of
from tests.support.postgres_server import PostgresServer
from tests.support.processes import stop_group
from tests.support.rabbitmq import RabbitServer
from tests.support.redis_server import RedisServer

TENANT = "soak"
TOKEN = "soak-token-0123456789abcdef"
WORKERS = 2
"""Worker processes, one per core of the machine the soak was sized on."""
GATEWAYS = 2


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def rss_of(pid: int) -> int | None:
    """A process's resident set size in bytes (None once it is gone)."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


@dataclass
class SoakGateway:
    """One ``parley gateway`` process on a fixed port, restartable there."""

    port: int
    directory: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        stdout = self.directory / "gateway.out"
        with stdout.open("ab") as out, (self.directory / "gateway.err").open("ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "parley", "gateway", "--bind", f"127.0.0.1:{self.port}"],
                env=self.env,
                cwd=self.directory,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        printed_url_of(self.process, stdout, self.directory / "gateway.err")

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the gateway on {self.port} never answered; see {self.directory}")

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process)


@dataclass
class Topology:
    """Every process of the soak, started by :meth:`start` and stopped by :meth:`stop`.
    ``broker`` is ``redis`` (the coordination Redis carries the kicks too, as the
    Procfile deploys) or ``amqp`` (a RabbitMQ node of the soak's own)."""

    directory: Path
    broker: str = "redis"
    postgres: PostgresServer = field(init=False)
    redis: RedisServer = field(init=False)
    rabbit: RabbitServer | None = field(init=False, default=None)
    fleet: Fleet = field(init=False)
    workers: list[subprocess.Popen[bytes]] = field(init=False, default_factory=list)
    beat: subprocess.Popen[bytes] | None = field(init=False, default=None)
    gateways: list[SoakGateway] = field(init=False, default_factory=list)
    database_url: str = field(init=False, default="")

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.postgres = PostgresServer()
        self.postgres.start()
        with psycopg.connect(self.postgres.admin_url, autocommit=True) as admin:
            admin.execute("CREATE DATABASE soak")
        self.database_url = (
            self.postgres.admin_url.rsplit("/", 1)[0].replace(
                "postgresql://", "postgresql+psycopg://", 1
            )
            + "/soak"
        )
        engine = create_database_engine(self.database_url)
        migrate(engine)
        engine.dispose()
        self.redis = RedisServer(self.directory)
        self.redis.start()
        broker_url = None
        if self.broker == "amqp":
            self.rabbit = RabbitServer(self.directory)
            self.rabbit.start()
            broker_url = self.rabbit.url
        self.fleet = Fleet(
            database_url=self.database_url,
            host="tests.soak.host:soak_host",
            redis_url=self.redis.url,
            broker_url=broker_url,
            queue="parley.soak",
            log_dir=self.directory,
            # The shipped sweep period, not the tests' shorter one: the soak measures
            # what a deployment gets.
            environment={"PARLEY_SWEEP_SECONDS": "2", "PARLEY_SOAK_DIR": str(self.directory)},
        )
        for _ in range(WORKERS):
            self.workers.append(self.start_worker())
        self.beat = self.fleet.start_beat()
        env = {**self.fleet.env(), "PARLEY_GATEWAY_TOKENS": f"{TOKEN}={TENANT}"}
        env.pop("PARLEY_HOST")
        env["PARLEY_WORKSPACES"] = str(self.directory / "workspaces")
        for number in range(GATEWAYS):
            gateway = SoakGateway(free_port(), self.directory / f"gateway-{number}", env)
            gateway.start()
            self.gateways.append(gateway)
        self.fleet.wait_ready(timeout=60)
        for gateway in self.gateways:
            gateway.wait_ready()

    def start_worker(self) -> subprocess.Popen[bytes]:
        pool, concurrency = procfile_worker()
        return self.fleet.start_worker(concurrency, pool)

    def replace_worker(self, old: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        """Reap a killed worker and start another in its place."""
        old.wait(10)
        new = self.start_worker()
        self.workers[self.workers.index(old)] = new
        return new

    def restart_redis(self, *, down_seconds: float = 1.0) -> None:
        """Redis goes down (every key gone: it keeps nothing on disk) and comes back on
        its port."""
        self.redis.shutdown()
        time.sleep(down_seconds)
        self.redis.start()

    def flush_redis(self) -> None:
        client = self.redis.client()
        try:
            client.flushall()
        finally:
            client.close()

    def restart_postgres(self, mode: str, *, down_seconds: float = 1.0) -> None:
        self.postgres.stop(mode)
        time.sleep(down_seconds)
        self.postgres.start()

    def restart_broker(self) -> None:
        """RabbitMQ stops and comes back (its durable queues and persistent messages
        survive); on the Redis broker, that is a Redis restart."""
        if self.rabbit is None:
            self.restart_redis()
            return
        self.rabbit.shutdown()
        self.rabbit.start()

    def processes(self) -> dict[str, int]:
        """The pid of each live process, by role (``worker-0``, ``gateway-1``, …)."""
        roles: dict[str, int] = {}
        for number, worker in enumerate(self.workers):
            roles[f"worker-{number}"] = worker.pid
        if self.beat is not None:
            roles["beat"] = self.beat.pid
        for number, gateway in enumerate(self.gateways):
            if gateway.process is not None:
                roles[f"gateway-{number}"] = gateway.process.pid
        if self.redis.process is not None:
            roles["redis"] = self.redis.process.pid
        return roles

    def stop(self) -> None:
        for gateway in self.gateways:
            gateway.stop()
        for worker in self.workers:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGCONT)  # (one may be stopped)
        self.fleet.stop()
        self.redis.stop()
        if self.rabbit is not None:
            self.rabbit.stop()
        self.postgres.close()
