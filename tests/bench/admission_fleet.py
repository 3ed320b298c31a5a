"""What the admission benchmark's parts share (tests/bench/admission.py): its options,
the Procfile's fleet against the rate-limited provider, the interactive probe (submit to
first token) on an idle fleet and spread through a backlog, and submitting and waiting
for a backlog."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import parley
from parley.ports.admission import Priority
from parley.schemas.events import EventKind
from tests.providers.rate_limited_server import ServerProcess
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import Fleet, flush_redis, procfile_worker

REDIS_URL = os.environ.get("PARLEY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
HOST = "tests.support.hosts:provider_host"
WARM_UP_TURNS = 10
"""Interactive turns run before a part's figures: enough for both workers' first calls."""
PROBE_LEAD_SECONDS = 2.0
"""How long after the batch's submission the first probe goes: the backlog waits by then."""
PROBE_SPAN = 0.8
"""The probes are spread over this fraction of the floor: all of them fall in the batch."""
TURN_TIMEOUT = 900.0


@dataclass(frozen=True, kw_only=True)
class Options:
    turns: int
    rpm: int
    stream_seconds: float
    probes: int
    tenant_turns: int
    flood_turns: int
    redis_url: str
    log_dir: Path
    cold: bool = False
    """No warm-up: the figures include a fresh fleet's first calls (its probe)."""
    refuse_first: bool = False
    """The provider refuses the backlog's first call (a 429 out of phase)."""

    @property
    def rate(self) -> float:
        """The provider's limit, calls a second."""
        return self.rpm / 60

    @property
    def floor(self) -> float:
        """Seconds the limit allows ``turns`` one-call turns in at best."""
        return self.turns / self.rate


# ---------------------------------------------------------------- a fleet


@contextmanager
def running_fleet(
    server: ServerProcess, options: Options, environment: dict[str, str]
) -> Iterator[tuple[Fleet, parley.Client, Path]]:
    """The Procfile's fleet on a fresh database and the flushed Redis database, against
    ``server``, with ``environment`` added; warmed up unless ``options.cold``.  Yields
    it, a client of it, and the sessions' workspace."""
    pool, concurrency = procfile_worker()
    root = options.log_dir / "workspace"
    root.mkdir(exist_ok=True)
    with fresh_postgres_database("admbench") as database_url:
        flush_redis(options.redis_url)
        fleet = Fleet(
            database_url=database_url,
            redis_url=options.redis_url,
            host=HOST,
            log_dir=options.log_dir,
            environment={"PARLEY_TEST_PROVIDER_URL": server.base_url, **environment},
        )
        try:
            fleet.start_worker(concurrency, pool)
            fleet.start_worker(concurrency, pool)
            fleet.start_beat()
            fleet.wait_ready()
            client = fleet.client()
            try:
                if not options.cold:
                    warm_up(client, root)
                yield fleet, client, root
            finally:
                client.close()
        finally:
            fleet.stop()


def warm_up(client: parley.Client, root: Path) -> None:
    """A few interactive turns at once: each worker makes its first calls, the fleet
    learns the limit from the server's headers."""
    handles = [client.open_session(root).submit("warm up") for _ in range(WARM_UP_TURNS)]
    for handle in handles:
        handle.wait(TURN_TIMEOUT)


# ---------------------------------------------------------------- probes


def first_token(handle: parley.TurnHandle, since: float) -> float | None:
    """Seconds from ``since`` to the turn's first token (None: it ended without one);
    returns once the turn ended."""
    got = None
    for event in handle.events():
        if got is None and event.kind is EventKind.TOKEN:
            got = time.perf_counter() - since
        if event.kind is EventKind.END:
            break
    return got


def idle_probes(client: parley.Client, root: Path, count: int) -> list[float]:
    """The probe on an idle fleet, ``count`` times one after the other: an interactive
    one-step turn in a session of its own, submit → first token."""
    samples = []
    for _ in range(count):
        session = client.open_session(root)
        start = time.perf_counter()
        took = first_token(session.submit("I am waiting for this"), start)
        if took is None:
            raise RuntimeError("an idle probe ended without a token; see the fleet's logs")
        samples.append(took)
    return samples


class Prober:
    """Probes submitted at times spread through a batch (by ``tenant``), each followed
    by a thread of its own."""

    def __init__(
        self, client: parley.Client, root: Path, count: int, span: float, tenant: str | None = None
    ) -> None:
        self._sessions = [client.open_session(root, tenant=tenant) for _ in range(count)]
        self._span = span
        self._results: list[float | None] = []
        self._followers: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, batch_started: float) -> None:
        self._batch_started = batch_started
        self._thread.start()

    def _run(self) -> None:
        spacing = self._span / max(1, len(self._sessions))
        for n, session in enumerate(self._sessions):
            due = self._batch_started + PROBE_LEAD_SECONDS + n * spacing
            time.sleep(max(0.0, due - time.perf_counter()))
            start = time.perf_counter()
            handle = session.submit(f"probe {n}: I am waiting for this")
            follower = threading.Thread(
                target=lambda h=handle, s=start: self._results.append(first_token(h, s)),
                daemon=True,
            )
            follower.start()
            self._followers.append(follower)

    def results(self) -> tuple[list[float], int]:
        """The probes' first tokens, and how many ended without one."""
        self._thread.join(TURN_TIMEOUT)
        for follower in self._followers:
            follower.join(TURN_TIMEOUT)
        got = [r for r in self._results if r is not None]
        return got, len(self._results) - len(got)


def submit_all(
    sessions: list[parley.Session], prompt: str, priority: Priority = "batch"
) -> list[parley.TurnHandle]:
    """One turn in each session (batch ones by default), from eight threads (as a
    producer of a big batch would)."""
    with ThreadPoolExecutor(8) as submitters:
        return list(
            submitters.map(
                lambda n: sessions[n].submit(f"{prompt} {n}", priority=priority),
                range(len(sessions)),
            )
        )


def failures(handles: list[parley.TurnHandle]) -> int:
    """Wait for every turn; how many did not finish."""
    results = [h.wait(TURN_TIMEOUT) for h in handles]
    return sum(r.outcome is not parley.TurnStatus.FINISHED for r in results)
