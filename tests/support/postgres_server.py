"""A PostgreSQL server of a test's own, on a free loopback port, for tests that restart
the database under a fleet.  (The machine's server is shared: never restart it.)"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def _bin(name: str) -> str:
    """A PostgreSQL server program: on PATH, or in Debian's versioned directory."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name)
    assert versions, f"{name} is not installed"
    return str(versions[-1] / name)


class PostgresServer:
    """A fresh cluster (trust authentication, user ``postgres``) that a test stops and
    starts again; its data survives, as a real server's does.  Run as the ``postgres``
    user when the test runs as root (the server refuses root), in a directory of its own
    under the system's temporary directory (pytest's are private to root)."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self.directory = Path(tempfile.mkdtemp(prefix=f"parley-postgres-{self.port}-"))
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.directory, owner.pw_uid, owner.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run(_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N")

    def _run(self, *argv: str) -> None:
        subprocess.run([*self._as, *argv], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.directory}"
        self._run(
            _bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        """What an operator's `systemctl stop postgresql` does (``mode`` ``fast``): every
        connection is closed, transactions in flight roll back, and the server exits.
        ``immediate`` is a crash: the server exits at once and recovers from its log at
        the next start."""
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def close(self) -> None:
        """Stop the server if it runs, and remove its files."""
        probe = subprocess.run(
            [*self._as, _bin("pg_ctl"), "-D", str(self.data), "status"], capture_output=True
        )
        if probe.returncode == 0:
            self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
