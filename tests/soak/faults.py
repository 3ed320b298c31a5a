"""The soak's faults: each kind on its own period with jitter, all through the run, and for
each crash of a worker the time until another took its turns over.

A run shorter than a period still gets every kind at least once: the kinds that would not
come round are spread over the run, so a three-minute soak breaks everything once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from tests.soak.topology import Topology

STOP_PAST_LOCK_SECONDS = 10.0
"""How long a stopped worker stays stopped: well past its lock's TTL (LOCK_TTL_MS, 3 s)."""
RESUME_TIMEOUT = 90.0
BUSY_WAIT_SECONDS = 10.0
"""How long a worker fault waits for a worker that drives turns before it strikes any."""


def worker_pid(worker: str) -> int:
    """The pid in a run's ``worker`` (``host:pid:thread``, what the engine writes)."""
    return int(worker.split(":")[1])


@dataclass(frozen=True)
class Kind:
    name: str
    period: float
    """Seconds between two faults of this kind (jittered by a fifth either way)."""
    limit: int | None = None
    """At most this many in a run (the broker restarts once)."""


KINDS = (
    Kind("kill_worker", 20),
    Kind("stop_worker", 150),
    Kind("kill_gateway", 120),
    Kind("restart_redis", 300),
    Kind("flush_redis", 300, limit=1),
    Kind("restart_postgres", 300),
    Kind("crash_postgres", 300, limit=1),
    Kind("restart_broker", 600, limit=1),
)


def plan(start: float, end: float, rng: random.Random) -> list[tuple[float, str]]:
    """When each fault comes (offsets in seconds from the run's start), sorted."""
    span = end - start
    planned: list[tuple[float, str]] = []
    late: list[str] = []
    for number, kind in enumerate(KINDS):
        # Each kind starts at its own offset, so two slow faults rarely coincide.
        at = start + kind.period * (0.3 + 0.07 * number)
        count = 0
        while at < end and (kind.limit is None or count < kind.limit):
            planned.append((at, kind.name))
            count += 1
            at += kind.period * rng.uniform(0.8, 1.2)
        if not count:
            late.append(kind.name)
    for number, name in enumerate(late):
        planned.append((start + span * (number + 1) / (len(late) + 1), name))
    return sorted(planned)


@dataclass
class Fault:
    kind: str
    at: float
    """Wall time it struck."""
    target: str = ""
    seconds: float = 0.0
    """How long the fault took to inject and undo (a restart's downtime)."""
    resumed: list[float] = field(default_factory=list)
    """For a worker killed or stopped: seconds until each of its running turns was taken
    over by another worker (or ended)."""
    error: str | None = None


@dataclass
class Faults:
    topology: Topology
    schedule: list[tuple[float, str]]
    rng: random.Random
    log: list[Fault] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _watchers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="soak-faults", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No more faults; wait for the one in progress and every takeover watch."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)
        for watcher in self._watchers:
            watcher.join(RESUME_TIMEOUT + 5)

    def _run(self) -> None:
        actions: dict[str, Callable[[Fault], None]] = {
            "kill_worker": self._kill_worker,
            "stop_worker": self._stop_worker,
            "kill_gateway": self._kill_gateway,
            "restart_redis": lambda f: self.topology.restart_redis(),
            "flush_redis": lambda f: self.topology.flush_redis(),
            "restart_postgres": lambda f: self.topology.restart_postgres("fast"),
            "crash_postgres": lambda f: self.topology.restart_postgres("immediate"),
            "restart_broker": lambda f: self.topology.restart_broker(),
        }
        for at, kind in self.schedule:
            if self._stop.wait(max(0.0, at - time.monotonic())):
                return
            fault = Fault(kind, time.time())
            began = time.monotonic()
            try:
                actions[kind](fault)
            except Exception as exc:  # (recorded and reported: a fault that failed to strike)
                fault.error = f"{type(exc).__name__}: {exc}"
            fault.seconds = time.monotonic() - began
            self.log.append(fault)

    def _running_on(self, pid: int) -> set[str]:
        """The turns worker ``pid`` drives now (empty if the database is down)."""
        try:
            with psycopg.connect(self._admin_url(), connect_timeout=2) as conn:
                rows = conn.execute(
                    "SELECT turn_id, worker FROM runs WHERE status = 'running'"
                ).fetchall()
        except psycopg.Error:
            return set()
        return {turn for turn, worker in rows if worker and worker_pid(worker) == pid}

    def _admin_url(self) -> str:
        return self.topology.database_url.replace("postgresql+psycopg://", "postgresql://")

    def _kill_worker(self, fault: Fault) -> None:
        victim = self._strike_worker(fault, signal.SIGKILL)
        self.topology.replace_worker(victim)

    def _stop_worker(self, fault: Fault) -> None:
        victim = self._strike_worker(fault, signal.SIGSTOP)
        time.sleep(STOP_PAST_LOCK_SECONDS)
        os.killpg(victim.pid, signal.SIGCONT)

    def _busy_worker(self) -> subprocess.Popen[bytes]:
        """A live worker, one driving turns if one does within ``BUSY_WAIT_SECONDS``: a
        crash is meant to catch turns mid-run (struck at random, it once fell between
        turns through a whole short soak, which then showed no takeover at all)."""
        live = [w for w in self.topology.workers if w.poll() is None]
        deadline = time.monotonic() + BUSY_WAIT_SECONDS
        while True:
            busy = [w for w in live if self._running_on(w.pid)]
            if busy or time.monotonic() > deadline:
                return self.rng.choice(busy or live)
            time.sleep(0.1)

    def _strike_worker(self, fault: Fault, signal_number: int) -> subprocess.Popen[bytes]:
        """Send a live worker's group ``signal_number``, and watch its running turns go to
        another worker; the worker struck."""
        victim = self._busy_worker()
        fault.target = f"pid {victim.pid}"
        turns = self._running_on(victim.pid)
        os.killpg(victim.pid, signal_number)
        self._watch(fault, victim.pid, turns, time.monotonic())
        return victim

    def _kill_gateway(self, fault: Fault) -> None:
        number = self.rng.randrange(len(self.topology.gateways))
        gateway = self.topology.gateways[number]
        fault.target = f"gateway-{number}"
        gateway.kill()
        time.sleep(1.0)
        gateway.start()

    def _watch(self, fault: Fault, pid: int, turns: set[str], struck: float) -> None:
        """In the background: until each of ``turns`` is driven by another worker than
        ``pid`` (or has ended, or waits), note how long that took."""

        def watch() -> None:
            waiting = set(turns)
            deadline = struck + RESUME_TIMEOUT
            while waiting and time.monotonic() < deadline:
                time.sleep(0.1)
                try:
                    with psycopg.connect(self._admin_url(), connect_timeout=2) as conn:
                        rows = conn.execute(
                            "SELECT turn_id, status, worker FROM runs WHERE turn_id = ANY(%s)",
                            (list(waiting),),
                        ).fetchall()
                except psycopg.Error:
                    continue
                for turn, status, worker in rows:
                    if status != "running" or (worker and worker_pid(worker) != pid):
                        waiting.discard(turn)
                        fault.resumed.append(time.monotonic() - struck)
            fault.resumed.extend([float("inf")] * len(waiting))

        thread = threading.Thread(target=watch, name="soak-takeover", daemon=True)
        thread.start()
        self._watchers.append(thread)
