"""The fleet's Prometheus metrics, scraped over HTTP from real processes: two `parley
worker` processes (each running two kicks at a time, on Celery's prefork pool or its
threads pool) and `parley beat`, each on a metrics port of its own.  What each worker
serves must be what its processes did, as the database records it (a prefork worker's
port sums its pool processes), including a crash takeover and the sweeper's kick."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import parley
from tests.support.chaos import CHAOS_REDIS_URL
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import Fleet, flush_redis
from tests.support.helpers import Control
from tests.support.scrape import Samples, free_port, scrape
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

REFUSED = "deny_write:secrets/**"
COUNTED_STEP = {
    "tool_calls": [
        {"name": "wait_for_gate"},
        {"name": "read_file", "arguments": {"path": "retry.py"}},
        {"name": "write_file", "arguments": {"path": "secrets/x", "content": "leak"}},
    ]
}
RULES = [
    {"when": "count", "steps": [COUNTED_STEP, {"text": "counted", "chunk_chars": 3}]},
    {"when": "crash", "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "survived"}]},
]


@dataclass
class MeteredFleet:
    """Two workers and the sweeper, each serving its metrics; and a client."""

    fleet: Fleet
    pool: str
    workers: list[subprocess.Popen[bytes]]
    urls: dict[int, str]  # a worker's pid (its process group) → its metrics URL
    beat_url: str
    client: parley.Client

    def scrape(self, worker: subprocess.Popen[bytes]) -> Samples:
        return scrape(self.urls[worker.pid])

    def worker_of(self, turn_id: str) -> subprocess.Popen[bytes]:
        """The worker whose process claimed the turn last."""
        label = self.client.store.run_state(turn_id).worker
        assert label is not None
        group = os.getpgid(int(label.split(":")[1]))
        return next(w for w in self.workers if w.pid == group)

    def in_flight(self) -> float:
        return sum(
            self.scrape(w).value("parley_turns_in_flight") for w in self.workers if w.poll() is None
        )


@pytest.fixture(params=["prefork", "threads"])
def metered(workspace: Path, request: pytest.FixtureRequest) -> Iterator[MeteredFleet]:
    pool = request.param
    with fresh_postgres_database("metrics") as url:
        flush_redis(CHAOS_REDIS_URL)
        fleet = Fleet(database_url=url, redis_url=CHAOS_REDIS_URL)
        urls = {}
        workers = []
        for number in range(2):
            port = free_port()
            worker = fleet.start_worker(
                2,
                pool,
                celery_args=("--hostname", f"metered{number}@%h"),
                env={"PARLEY_METRICS_PORT": f"127.0.0.1:{port}"},
            )
            workers.append(worker)
            urls[worker.pid] = f"http://127.0.0.1:{port}/metrics"
        beat_port = free_port()
        fleet.start_beat(env={"PARLEY_METRICS_PORT": f"127.0.0.1:{beat_port}"})
        client = parley.connect(url, redis_url=CHAOS_REDIS_URL, queue=fleet.queue)
        try:
            for worker in workers:
                log = fleet.log_of(worker)
                wait_until(lambda log=log: b"ready." in log.read_bytes(), what=f"a worker ({log})")
            yield MeteredFleet(
                fleet, pool, workers, urls, f"http://127.0.0.1:{beat_port}/metrics", client
            )
        finally:
            client.close()
            fleet.stop()


def test_each_worker_serves_what_its_processes_ran(metered: MeteredFleet, workspace: Path) -> None:
    control = Control(workspace)
    control.policy(deny_write=["secrets/**"])
    control.script(RULES)
    sessions = [metered.client.open_session(workspace) for _ in range(4)]

    # Four turns at the gate at once: every slot of both workers holds one (on prefork,
    # in four pool processes), and each worker's port counts its two in flight.
    first = [session.submit("count one") for session in sessions]
    wait_until(lambda: control.gate_calls == 4, what="a turn in every slot")
    assert [metered.scrape(w).value("parley_turns_in_flight") for w in metered.workers] == [2, 2]
    if metered.pool == "prefork":
        assert len(control.entered_by()) == 4  # four pool processes, two per worker
    control.open_gate()
    second = [session.submit("count two") for session in sessions]
    handles = first + second
    results = [handle.wait(60) for handle in handles]
    assert {r.outcome for r in results} == {parley.TurnStatus.FINISHED}
    # (A driver lets its turn go just after the end it published.)
    wait_until(lambda: metered.in_flight() == 0, what="no turn in flight", timeout=10)

    ran_by = {}
    for worker in metered.workers:
        mine = [r for r in results if metered.worker_of(r.turn_id) is worker]
        ran = ran_by[worker.pid] = len(mine)
        assert ran >= 2, "each worker held two turns at the gate"
        seen = metered.scrape(worker)
        assert seen.value("parley_turns_started_total", start="new") == ran
        assert seen.value("parley_turns_started_total") == ran
        assert seen.value("parley_turns_ended_total", outcome="finished") == ran
        assert seen.value("parley_turns_ended_total") == ran
        assert seen.value("parley_queue_wait_seconds_count") == ran
        assert seen.value("parley_turn_duration_seconds_count", outcome="finished") == ran
        assert seen.value("parley_first_token_latency_seconds_count") == ran
        assert seen.value("parley_steps_total") == sum(r.steps for r in mine) == 2 * ran
        for tool in ("wait_for_gate", "read_file", "write_file"):
            assert seen.value("parley_tool_calls_total", tool=tool) == ran
        assert seen.value("parley_refusals_total", rule=REFUSED) == ran
        assert seen.value("parley_tokens_total", direction="input") == sum(
            r.usage.input_tokens for r in mine
        )
        assert seen.value("parley_tokens_total", direction="output") == sum(
            r.usage.output_tokens for r in mine
        )
        assert seen.label_values("parley_tokens_total", "model") == {"scripted"}
        assert seen.value("parley_turns_in_flight") == 0
        assert seen.value("parley_crash_takeovers_total") == 0
        assert seen.value("parley_turns_submitted_total") == 0  # the client submits
    assert sum(ran_by.values()) == len(results) == 8

    # A crash: the driver's process dies mid-tool (on prefork only that pool process,
    # whose worker stays up; on threads the whole worker), and the fleet takes over.
    control.reset_gate()
    crashed = sessions[0].submit("crash here")
    control.wait_entered()
    victim = metered.client.store.run_state(crashed.turn_id).worker
    assert victim is not None
    victim_pid = int(victim.split(":")[1])
    victim_worker = metered.worker_of(crashed.turn_id)
    before = {w.pid: metered.scrape(w) for w in metered.workers}
    if metered.pool == "prefork":
        os.kill(victim_pid, signal.SIGKILL)
    else:
        os.killpg(victim_worker.pid, signal.SIGKILL)
        victim_worker.wait(10)
    control.open_gate()
    result = crashed.wait(60)
    assert result.outcome is parley.TurnStatus.FINISHED and result.reply == "survived"
    state = metered.client.store.run_state(crashed.turn_id)
    assert state.attempts == 2 and int(str(state.worker).split(":")[1]) != victim_pid
    taker = metered.worker_of(crashed.turn_id)
    after = metered.scrape(taker)
    was = before[taker.pid]
    for name, labels in [
        ("parley_crash_takeovers_total", {}),
        ("parley_turns_started_total", {"start": "takeover"}),
        ("parley_turns_ended_total", {"outcome": "finished"}),
    ]:
        assert after.value(name, **labels) - was.value(name, **labels) == 1, name
    assert after.value("parley_turns_started_total", start="new") == was.value(
        "parley_turns_started_total", start="new"
    )
    # The process that died with a turn in flight counts it no more (on prefork its
    # worker's port still answers: the dead process's gauge is dropped at the scrape).
    wait_until(lambda: metered.in_flight() == 0, what="no turn in flight", timeout=10)
    # Nothing was left to redeliver the kick in time: the sweeper found the session.
    assert scrape(metered.beat_url).value("parley_sweeper_kicks_total") >= 1


def test_a_worker_whose_metrics_port_is_taken_still_runs_turns(workspace: Path) -> None:
    with fresh_postgres_database("metrics") as url:
        flush_redis(CHAOS_REDIS_URL)
        fleet = Fleet(database_url=url, redis_url=CHAOS_REDIS_URL)
        with socketserver_on() as port:
            worker = fleet.start_worker(1, "threads", env={"PARLEY_METRICS_PORT": str(port)})
            client = parley.connect(url, redis_url=CHAOS_REDIS_URL, queue=fleet.queue)
            try:
                fleet.wait_ready()
                Control(workspace).script([{"when": ".*", "steps": [{"text": "still here"}]}])
                session = client.open_session(workspace)
                assert session.turn("hello", timeout=60).reply == "still here"
                log = fleet.log_of(worker).read_text()
                assert f"cannot serve metrics on 0.0.0.0:{port}" in log
            finally:
                client.close()
                fleet.stop()


class socketserver_on:
    """A port held by a listening socket of this process, for the ``with`` block."""

    def __enter__(self) -> int:
        import socket

        self._socket = socket.socket()
        self._socket.bind(("0.0.0.0", 0))
        self._socket.listen()
        port: int = self._socket.getsockname()[1]
        return port

    def __exit__(self, *_exc: object) -> None:
        self._socket.close()


def test_a_malformed_metrics_port_stops_the_worker_with_a_clear_error(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PARLEY_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:5432/unused",
        "PARLEY_REDIS_URL": CHAOS_REDIS_URL,
        "PARLEY_METRICS_PORT": "ninety",
    }
    done = subprocess.run(
        [sys.executable, "-m", "parley", "beat"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert "PARLEY_METRICS_PORT must be PORT or HOST:PORT" in done.stderr
    assert "Traceback" not in done.stderr
