"""Debian's PgBouncer of a test's own, in transaction mode, in front of the tests'
PostgreSQL: every database name the server has is served under the same name, so a URL
of :func:`tests.support.databases.fresh_postgres_database` goes through it with only
its port changed.  (It refuses to run as root: started as root, it runs as ``postgres``.)
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from tests.support.databases import PG_ADMIN_URL


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgBouncer:
    """A ``pgbouncer`` in ``pool_mode = transaction`` on a free loopback port, with
    ``pool_size`` server connections per database and user.  Its files are in a
    directory of its own under the system's temporary directory (the ``postgres``
    account it runs as cannot reach a test's ``tmp_path``), removed when it stops."""

    def __init__(self, *, pool_size: int = 20) -> None:
        server = urlsplit(PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://"))
        self.server_port = server.port or 5432
        self.server_host = server.hostname or "127.0.0.1"
        self.user = server.username or "postgres"
        self.port = _free_port()
        self.directory = directory = Path(tempfile.mkdtemp(prefix="parley-pgbouncer-"))
        self.log = directory / "pgbouncer.log"
        (directory / "users.txt").write_text(f'"{self.user}" ""\n')
        self.config = directory / "pgbouncer.ini"
        self.config.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={self.server_host} port={self.server_port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    f"unix_socket_dir = {directory}",
                    "auth_type = trust",
                    f"auth_file = {directory / 'users.txt'}",
                    "pool_mode = transaction",
                    f"default_pool_size = {pool_size}",
                    "max_client_conn = 1000",
                    f"logfile = {self.log}",
                    f"pidfile = {directory / 'pgbouncer.pid'}",
                    "",
                ]
            )
        )
        self.process: subprocess.Popen[bytes] | None = None

    def url_of(self, database_url: str) -> str:
        """``database_url`` (a database on the tests' server) through this PgBouncer."""
        parts = urlsplit(database_url)
        netloc = parts.netloc.replace(f":{self.server_port}", f":{self.port}")
        if f":{self.port}" not in netloc:
            netloc = f"{netloc}:{self.port}"
        return parts._replace(netloc=netloc).geturl()

    def start(self) -> None:
        """Start it and wait until it answers a query."""
        argv = [_program(), str(self.config)]
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            shutil.chown(self.directory, account.pw_uid, account.pw_gid)
            for path in self.directory.iterdir():
                shutil.chown(path, account.pw_uid, account.pw_gid)
            argv[1:1] = ["-u", "postgres"]
        with (self.directory / "pgbouncer.out").open("ab") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        url = f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"
        deadline = time.monotonic() + 15
        while True:
            try:
                with psycopg.connect(url, prepare_threshold=None, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                assert self.process.poll() is None, f"pgbouncer exited; see {self.log}"
                assert time.monotonic() < deadline, f"pgbouncer did not start; see {self.log}"
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop it (SIGTERM: it closes its connections)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None
        shutil.rmtree(self.directory, ignore_errors=True)


def _program() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    assert found, "pgbouncer is not installed (.ci/run installs Debian's)"
    return found


@contextmanager
def pgbouncer(**options: int) -> Iterator[PgBouncer]:
    """A started :class:`PgBouncer`, stopped after."""
    bouncer = PgBouncer(**options)
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


def server_connections(database_url: str) -> int:
    """How many connections the server itself holds to ``database_url``'s database
    (through the pooler or not)."""
    database = database_url.rsplit("/", 1)[1]
    admin = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)
        ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def peak_server_connections(database_url: str) -> Iterator[list[int]]:
    """While the block runs, the most connections the server held to ``database_url``'s
    database at once (sampled every 50 ms): the list's one item, read after the block."""
    peak = [0]
    done = threading.Event()

    def watch_the_server() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], server_connections(database_url))
            done.wait(0.05)

    watcher = threading.Thread(target=watch_the_server, daemon=True)
    watcher.start()
    try:
        yield peak
    finally:
        done.set()
        watcher.join(10)
