"""What a test measures of a running process from outside: its connections to Redis
(from Redis's ``CLIENT LIST``), its sockets' send queues, its memory and CPU (from
/proc)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import redis

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class ProcessProbes:
    """Measures of the process ``pid`` (a subclass says which)."""

    @property
    def pid(self) -> int:
        raise NotImplementedError

    def redis_readers(self, redis_url: str) -> tuple[int, int]:
        """(connections of this process to Redis whose last command was ``XREAD``,
        those of them blocked in it right now), from Redis's ``CLIENT LIST``.  The
        coordinator sends ``XREAD`` on a pool of its own, which grows only while reads
        overlap: its size is the most followers the process ever ran at once."""
        admin = redis.Redis.from_url(redis_url)
        ports = self.local_ports_to(admin.connection_pool.connection_kwargs.get("port", 6379))
        try:
            clients: list[dict[str, Any]] = admin.client_list()
        finally:
            admin.close()
        mine = [c for c in clients if int(str(c["addr"]).rsplit(":", 1)[1]) in ports]
        reading = [c for c in mine if c["cmd"] == "xread"]
        blocked = [c for c in reading if "b" in str(c["flags"])]
        return len(reading), len(blocked)

    def local_ports_to(self, remote_port: int) -> set[int]:
        """The local ports of this process's TCP connections to ``remote_port``."""
        inodes = set()
        for fd in Path(f"/proc/{self.pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        ports = set()
        for table in ("tcp", "tcp6"):
            lines = Path(f"/proc/{self.pid}/net/{table}").read_text().splitlines()[1:]
            for line in lines:
                fields = line.split()
                local, remote, inode = fields[1], fields[2], fields[9]
                if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                    ports.add(int(local.rsplit(":", 1)[1], 16))
        return ports

    def send_queue(self, remote_port: int) -> int:
        """Bytes this process has written to its connection from ``remote_port`` (a
        client's port) that the client has not acknowledged yet: its kernel send queue."""
        for table in ("tcp", "tcp6"):
            for line in Path(f"/proc/{self.pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == remote_port:
                    return int(fields[4].split(":")[0], 16)
        raise LookupError(f"no connection from port {remote_port}")

    def rss(self) -> int:
        """Resident set size, in bytes."""
        pages = int(Path(f"/proc/{self.pid}/statm").read_text().split()[1])
        return pages * PAGE_SIZE

    def peak_rss(self) -> int:
        """The most resident memory the process has had so far, in bytes (VmHWM)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise LookupError(f"no VmHWM for process {self.pid}")

    def cpu_seconds(self) -> float:
        """User plus system CPU time of the process (every thread) so far."""
        text = Path(f"/proc/{self.pid}/stat").read_text()
        fields = text[text.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
