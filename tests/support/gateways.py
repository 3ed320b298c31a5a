"""Real `parley gateway` processes on a test fleet, an EventSource-like reader of their
event streams, and what a test measures of a gateway from outside (its Redis readers,
its sockets' queues, its memory and CPU, from /proc and Redis's ``CLIENT LIST``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from schemas.events import Event, EventKind
from tests.support.fleet import REPO, Fleet

TOKEN = "gateway-test-token-0123456789"
TENANT = "alpha"
# The URL line, printed last (after the lines saying how the gateway runs).
ANNOUNCEMENT = re.compile(r"^parley gateway: open (http://127\.0\.0\.1:\d+)/", re.MULTILINE)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Gateway:
    """One `parley gateway` process of a fleet."""

    process: subprocess.Popen[bytes]
    url: str
    """``http://127.0.0.1:PORT``, as the process announced it on stdout."""
    log: Path
    token: str = TOKEN

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def kill(self) -> None:
        """SIGKILL, no goodbye to any connection."""
        os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(10)

    # ------------------------------------------------------------- seen from outside

    def redis_readers(self, redis_url: str) -> tuple[int, int]:
        """(connections of this process to Redis whose last command was ``XREAD``,
        those of them blocked in it right now), from Redis's ``CLIENT LIST``.  The
        coordinator sends ``XREAD`` on a pool of its own, which grows only while reads
        overlap: its size is the most followers the process ever ran at once."""
        ports = self.local_ports_to(6379)
        admin = redis.Redis.from_url(redis_url)
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

    def cpu_seconds(self) -> float:
        """User plus system CPU time of the process (every thread) so far."""
        text = Path(f"/proc/{self.pid}/stat").read_text()
        fields = text[text.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def start_gateway(
    fleet: Fleet, workspaces: Path, *, checkout: Path = REPO, **extra_env: str
) -> Gateway:
    """A `parley gateway --bind 127.0.0.1:0` on ``fleet``'s database, Redis and queue (no
    host: on a fleet the workers hold it), serving tenant ``alpha`` with :data:`TOKEN`
    and making sessions' roots under ``workspaces/alpha``; from ``checkout``'s code (a
    benchmark compares two).  Stopped with the fleet."""
    env = fleet.env()
    env.pop("PARLEY_HOST")
    env.update(
        PYTHONPATH=str(checkout),
        PARLEY_WORKSPACES=str(workspaces),
        PARLEY_GATEWAY_TOKENS=f"{TOKEN}={TENANT}",
        **extra_env,
    )
    name = f"{fleet.queue}-gateway-{len(fleet.logs)}"
    log, out = fleet.log_dir / f"{name}.log", fleet.log_dir / f"{name}.out"
    with log.open("wb") as err, out.open("wb") as said:  # the child keeps its copies
        process = subprocess.Popen(
            [sys.executable, "-m", "parley", "gateway", "--bind", "127.0.0.1:0"],
            env=env,
            cwd=checkout,
            stdout=said,
            stderr=err,
            start_new_session=True,
        )
    fleet.processes.append(process)
    fleet.logs[process.pid] = log
    deadline = time.monotonic() + 30
    while (found := ANNOUNCEMENT.search(out.read_text())) is None:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the gateway did not announce its URL on stdout; see {log}")
        time.sleep(0.02)
    return Gateway(process=process, url=found.group(1), log=log)


# ---------------------------------------------------------------- the HTTP side


def open_session(gateway: Gateway, workspace: str = "x") -> str:
    """A new session of tenant alpha in ``workspaces/alpha/<workspace>``: its id."""
    answer = httpx.post(
        f"{gateway.url}/v1/sessions", json={"workspace": workspace}, headers=gateway.headers
    )
    assert answer.status_code == 201, answer.text
    session_id: str = answer.json()["id"]
    return session_id


def submit(gateway: Gateway, session_id: str, prompt: str) -> str:
    """Submit a turn over HTTP: its id."""
    answer = httpx.post(
        f"{gateway.url}/v1/sessions/{session_id}/turns",
        json={"prompt": prompt},
        headers=gateway.headers,
    )
    assert answer.status_code == 202, answer.text
    turn_id: str = answer.json()["turn_id"]
    return turn_id


def result(gateway: Gateway, turn_id: str, wait: float = 60) -> dict[str, Any]:
    """``GET /v1/turns/{id}/result?wait=``: the turn once ended."""
    answer = httpx.get(
        f"{gateway.url}/v1/turns/{turn_id}/result",
        params={"wait": wait},
        headers=gateway.headers,
        timeout=wait + 10,
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


@dataclass
class Frame:
    """One event as it came over SSE."""

    id: int
    kind: str
    event: Event


class FrameParser:
    """SSE frames from a stream's lines, one line at a time (comments and keep-alives
    skipped)."""

    def __init__(self) -> None:
        self._fields: dict[str, str] = {}

    def feed(self, line: str) -> Frame | None:
        """The frame this line completes, if any."""
        if not line:
            fields, self._fields = self._fields, {}
            if "data" not in fields:
                return None
            event = Event.from_json(json.loads(fields["data"]))
            return Frame(id=int(fields["id"]), kind=fields["event"], event=event)
        if not line.startswith(":"):
            name, _, value = line.partition(":")
            self._fields[name] = value.removeprefix(" ")
        return None


def parse_frames(lines: Iterable[str]) -> Iterator[Frame]:
    """Every frame of a stream's lines."""
    parser = FrameParser()
    for line in lines:
        frame = parser.feed(line)
        if frame is not None:
            yield frame


@dataclass
class Reader:
    """A browser's ``EventSource`` on one turn: it remembers the last id it saw and
    reconnects with ``Last-Event-ID``, to the same gateway or another."""

    turn_id: str
    token: str = TOKEN
    events: list[Event] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    """The gateway each event came from."""
    connections: int = 0
    drops: int = 0

    @property
    def last_id(self) -> int:
        return self.events[-1].seq if self.events else 0

    @property
    def ended(self) -> bool:
        return bool(self.events) and self.events[-1].kind is EventKind.END

    def read(
        self, base_url: str, *, until: Callable[[Event], bool] | None = None, timeout: float = 60
    ) -> bool:
        """Connect to ``base_url`` (with ``Last-Event-ID`` once it has seen an event) and
        read: True at ``end``; False once ``until(event)`` holds (it closes the stream
        itself) or the connection dropped (the server died or closed early)."""
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream"}
        if self.events:
            headers["Last-Event-ID"] = str(self.last_id)
        self.connections += 1
        try:
            with httpx.stream(
                "GET",
                f"{base_url}/v1/turns/{self.turn_id}/events",
                headers=headers,
                timeout=httpx.Timeout(timeout, connect=5),
            ) as answer:
                assert answer.status_code == 200, answer.read()
                assert answer.headers["content-type"].startswith("text/event-stream")
                for frame in parse_frames(answer.iter_lines()):
                    assert frame.id == frame.event.seq and frame.kind == frame.event.kind.value
                    assert frame.event.turn_id == self.turn_id
                    self.events.append(frame.event)
                    self.origins.append(base_url)
                    if frame.event.kind is EventKind.END:
                        return True
                    if until is not None and until(frame.event):
                        return False
        except httpx.TransportError:
            pass
        self.drops += 1
        return False

    def follow(self, base_urls: list[str], *, deadline: float) -> None:
        """Read to ``end``, reconnecting (to the next of ``base_urls`` in turn, as a load
        balancer might send it) after each drop, a little later each time."""
        attempt = 0
        while not self.read(base_urls[attempt % len(base_urls)]):
            assert time.monotonic() < deadline, f"no end after {self.connections} connections"
            attempt += 1
            time.sleep(min(0.05 * attempt, 0.5))
