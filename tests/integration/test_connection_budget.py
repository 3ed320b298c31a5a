"""A worker process holds the connection budget it states, whatever the load: a real
worker on the Procfile's line (threads pool, its concurrency) that starts under a backlog
of slow turns and is sent as many again at once, some of its busy PostgreSQL connections
terminated under it, never holds more than the ``pool+overflow`` PostgreSQL connections
it logs, nor more Redis connections than its pools' sizes allow, and every turn still
finishes (docs/operations.md#concurrency).

Connections are counted as the servers see them (``pg_stat_activity``, Redis's ``CLIENT
LIST``), sampled every 100 ms, and attributed to the worker by the local ports of the
worker's own sockets (``/proc``), so the count does not trust what the worker says of
itself.  Before the fix the worker held 22 to 27 with a pool of 3+3.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
import redis

import parley
from tests.support.chaos import chaos_fleet
from tests.support.databases import PG_ADMIN_URL
from tests.support.fleet import procfile_worker

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TURNS = 400
DATABASE_POOL_SIZE = 3
"""The worker's PostgreSQL pool, small beside its drivers so that every run keeps it
busy to the last connection: a process that opens connections beside the pool then
shows it at once."""
SAMPLE_SECONDS = 0.1
TERMINATIONS = 40
"""How many times the test terminates some of the worker's busy PostgreSQL connections
(at each sample, until it has)."""
TERMINATED_EACH_TIME = 2
SUBMITTERS = 8
"""Threads submitting the turns, so that their kicks reach the idle worker all at once,
as a batch's do."""
POSTGRES_PORT = 5432
REDIS_PORT = 6379
CELERY_OWN_REDIS = 8
"""Redis connections of Celery's own beside the pools (the consumer, its event and
control channels, the heartbeat's), which its configuration does not size."""

SLOW_STEP = {"text": "ok " * 10, "chunk_chars": 3, "delay_ms": 100}
"""A model call that streams for about a second, as the issue's slow provider did."""

SIZES = re.compile(rb"up to (\d+) Redis connections per pool, (\d+)\+(\d+) PostgreSQL")


def socket_ports(pid: int, remote_port: int) -> set[int]:
    """The local ports of process ``pid``'s TCP connections to ``remote_port`` (on any
    address), read from ``/proc``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


@dataclass
class Sampler:
    """Counts, every ``SAMPLE_SECONDS``, the connections of worker ``pid`` that
    PostgreSQL (to ``database``) and Redis (``redis_url``'s server) serve, and keeps the
    largest; also terminates a few of its PostgreSQL connections now and then."""

    pid: int
    database: str
    redis_url: str
    most_postgres: int = 0
    most_redis: int = 0
    names: set[str] = field(default_factory=set)
    terminated: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        admin_url = PG_ADMIN_URL.replace("+psycopg", "")
        with psycopg.connect(admin_url, autocommit=True) as admin:
            server = redis.Redis.from_url(self.redis_url)
            try:
                while not self.stop.wait(SAMPLE_SECONDS):
                    ports = self._sample(admin, server)
                    if self.terminated < TERMINATIONS * TERMINATED_EACH_TIME:
                        self._terminate(admin, sorted(ports)[:TERMINATED_EACH_TIME])
            finally:
                server.close()

    def _sample(self, admin: psycopg.Connection, server: redis.Redis) -> set[int]:
        """One sample; returns the ports of the worker's PostgreSQL connections."""
        pg_ports = socket_ports(self.pid, POSTGRES_PORT)
        rows = admin.execute(
            "SELECT client_port, application_name, state FROM pg_stat_activity WHERE datname = %s",
            (self.database,),
        ).fetchall()
        mine = {port: (name, state) for port, name, state in rows if port in pg_ports}
        self.most_postgres = max(self.most_postgres, len(mine))
        self.names |= {name for name, _ in mine.values()}
        redis_ports = socket_ports(self.pid, REDIS_PORT)
        clients = server.client_list()
        held = sum(1 for c in clients if int(c["addr"].rsplit(":", 1)[1]) in redis_ports)
        self.most_redis = max(self.most_redis, held)
        # Those in a transaction or a statement: terminating one of them is what a
        # driver meets mid-transaction (an idle one is replaced at its checkout).
        return {port for port, (_, state) in mine.items() if state != "idle"}

    def _terminate(self, admin: psycopg.Connection, ports: list[int]) -> None:
        if not ports:
            return
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND client_port = ANY(%s)",
            (self.database, ports),
        )
        self.terminated += len(ports)


def submit(session: parley.Session) -> parley.TurnHandle:
    return session.submit("a slow turn")


@pytest.mark.timeout(600)
def test_a_worker_under_load_holds_the_connections_it_states(workspace: Path) -> None:
    pool, concurrency = procfile_worker()
    small = {"PARLEY_DATABASE_POOL_SIZE": str(DATABASE_POOL_SIZE)}
    with chaos_fleet(
        workspace, pool=pool, concurrency=concurrency, workers=1, environment=small
    ) as chaos:
        chaos.control.script([{"when": ".", "steps": [SLOW_STEP]}])
        # Half the turns wait in the queue for a worker that starts after them: its kicks
        # all ask at once for the runtime it has not built yet.  The other half arrive
        # at once on the busy worker.
        chaos.kill(chaos.workers[0])
        sessions = [chaos.client.open_session(chaos.workspace) for _ in range(TURNS)]
        submitters = ThreadPoolExecutor(SUBMITTERS)
        try:
            handles = list(submitters.map(submit, sessions[: TURNS // 2]))
            worker = chaos.start_worker()
            log = chaos.fleet.log_of(worker)
            sizes = SIZES.search(log.read_bytes())
            assert sizes is not None, log.read_text()[-2000:]
            redis_pool, database, overflow = (int(n) for n in sizes.groups())
            sampler = Sampler(worker.pid, chaos.database_url.rsplit("/", 1)[1], chaos.redis_url)
            sampling = threading.Thread(target=sampler.run, daemon=True)
            sampling.start()
            try:
                handles += submitters.map(submit, sessions[TURNS // 2 :])
                deadline = time.monotonic() + 400
                results = [h.wait(max(1.0, deadline - time.monotonic())) for h in handles]
            finally:
                sampler.stop.set()
                sampling.join(10)
        finally:
            submitters.shutdown()
        outcomes = [r.outcome for r in results]
        assert outcomes == [parley.TurnStatus.FINISHED] * TURNS, [
            (r.outcome, r.error) for r in results if r.outcome != parley.TurnStatus.FINISHED
        ][:5]
        assert sampler.terminated > 0  # the dispose path was taken
        # The pool's own and its overflow, never more: before the fix a broken
        # connection's engine.dispose() left every connection other threads held open in
        # the old pool while a new pool opened as many again, and kicks racing to build
        # the process's runtime each built pools of their own.
        assert 0 < sampler.most_postgres <= database + overflow, sampler
        # The coordinator's two pools and kombu's, each of the stated size, and Celery's
        # own few.
        assert sampler.most_redis <= 3 * redis_pool + CELERY_OWN_REDIS, sampler
        assert sampler.names == {f"parley-worker:{worker.pid}"}
