"""``parley status`` and Celery's own monitoring against real processes: a fleet with a
queued, a running and a waiting (approval) turn, its worker answering ``celery inspect
ping`` and listing its kick under ``inspect active``, and Flower seeing the kicks (task
events on, ``PARLEY_TASK_EVENTS=1``); then the worker killed, which status shows; and an
embedded database, which has no Redis."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

import parley
from tests.support.chaos import CHAOS_REDIS_URL
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import REPO, Fleet, flush_redis
from tests.support.helpers import Control, scripted_host
from tests.support.scrape import free_port
from tests.support.waiting import wait_until

RULES: list[dict[str, Any]] = [
    {"when": "gate", "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "through"}]},
    {"when": "ask", "steps": [{"tool_calls": [{"name": "record_call"}]}, {"text": "asked"}]},
    {"when": ".*", "steps": [{"text": "later"}]},
]


def run(env: Mapping[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """A command of this checkout's Python (``parley …`` or ``celery …``), to its end."""
    return subprocess.run(
        [sys.executable, "-m", *argv],
        env=dict(env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def status_json(env: Mapping[str, str]) -> dict[str, Any]:
    done = run(env, "parley", "status", "--json")
    assert done.returncode == 0, done
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.mark.postgres
@pytest.mark.slow
def test_status_and_celery_inspect_show_the_fleet_at_work(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARLEY_TASK_EVENTS", "1")  # the client's kicks' "sent" events
    with fresh_postgres_database("status") as url:
        flush_redis(CHAOS_REDIS_URL)
        fleet = Fleet(
            database_url=url, redis_url=CHAOS_REDIS_URL, environment={"PARLEY_TASK_EVENTS": "1"}
        )
        worker = fleet.start_worker(2, "threads", celery_args=("--hostname", "status0@%h"))
        client = parley.connect(url, redis_url=CHAOS_REDIS_URL, queue=fleet.queue)
        env = fleet.env()
        flower_url, flower = start_flower(env)
        try:
            fleet.wait_ready()
            control = Control(workspace)
            control.script(RULES)
            control.policy(ask_tools=["record_call"])
            # Task events go to whoever listens when they are sent: a kick Flower has
            # seen tells its receiver listens before the kicks it must see.  A warm-up
            # kick sent before it listened is never heard, so another is sent until one
            # is (CI once sent its only one too early).
            warm = client.open_session(workspace)

            def flower_heard_a_kick() -> bool:
                warm.submit("warm up").wait(60)
                return any(
                    flower_tasks(flower_url).get(warm.id, {}).get("state") == "SUCCESS"
                    for _ in _polls(seconds=3)
                )

            wait_until(
                flower_heard_a_kick, timeout=60, what="Flower to hear the fleet's task events"
            )
            gated = client.open_session(workspace)
            running = gated.submit("gate first")
            control.wait_entered()
            queued = gated.submit("then this")  # behind the running turn of its session
            asking = client.open_session(workspace)
            waiting = asking.submit("ask first")
            wait_until(waiting.approvals, what="the call to ask")

            report = status_json(env)
            assert report["deployment"] == "fleet"
            assert report["turns"] == {"queued": 1, "running": 1, "waiting": 1}
            assert report["oldest_queued"]["turn_id"] == queued.turn_id
            assert report["oldest_queued"]["session_id"] == gated.id
            assert report["oldest_queued"]["age_seconds"] >= 0
            [listed] = report["running"]
            assert listed["turn_id"] == running.turn_id
            assert listed["worker"] == client.store.run_state(running.turn_id).worker
            assert listed["driven"] is True
            assert [t["turn_id"] for t in report["waiting"]] == [waiting.turn_id]
            assert report["waiting"][0]["waiting_seconds"] >= 0
            assert [t["turn_id"] for t in report["queued"]] == [queued.turn_id]
            assert report["redis"] == {"url": CHAOS_REDIS_URL, "reachable": True}
            [name] = report["workers"]["live"]
            assert name.startswith("status0@") and report["workers"]["error"] is None
            assert "postgres@" in report["database"]

            text = run(env, "parley", "status")
            assert text.returncode == 0, text
            lines = text.stdout.splitlines()
            assert "turns: 1 queued, 1 running, 1 waiting" in lines
            assert f"workers: 1 live: {name}" in lines
            assert any(
                line.startswith("oldest queued: ") and queued.turn_id in line for line in lines
            )
            assert any(running.turn_id in line and "on " in line for line in lines)

            # Flower, from task events: the waiting turn's kick has ended, the running
            # turn's goes on; the producer's "sent" event is there too.
            tasks = wait_until(
                lambda: (
                    (found := flower_tasks(flower_url)).get(asking.id, {}).get("state") == "SUCCESS"
                    and found
                ),
                what="Flower to see the kicks",
            )
            assert tasks[gated.id]["state"] == "STARTED"
            assert tasks[asking.id]["sent"] is not None
            assert tasks[asking.id]["name"] == "parley.drive_session"

            pinged = run(env, "celery", "-A", "parley.celery_tasks", "inspect", "ping")
            assert pinged.returncode == 0, pinged
            assert name in pinged.stdout and "pong" in pinged.stdout
            active = run(env, "celery", "-A", "parley.celery_tasks", "inspect", "active", "--json")
            assert active.returncode == 0, active
            kicks = json.loads(active.stdout)[name]
            assert [(k["name"], k["args"]) for k in kicks] == [("parley.drive_session", [gated.id])]

            # The worker dies: nobody answers, and the running turn has no driver once its
            # lock runs out (no sweeper runs here to kick it elsewhere).
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
            report = wait_until(
                lambda: (found := status_json(env))["running"][0]["driven"] is False and found,
                what="the running turn to show no driver",
            )
            assert report["workers"] == {"live": [], "error": None}
            lines = run(env, "parley", "status").stdout.splitlines()
            assert "workers: 0 live" in lines
            assert any("no live driver" in line for line in lines)
        finally:
            client.close()
            flower.terminate()
            flower.wait(10)
            fleet.stop()


LIMITED = "workspace-scripted=6rpm"
"""The fleet's scripted model limited (``PARLEY_MODEL_LIMITS``): after its first call each
next one waits about ten seconds for capacity, letting its worker go meanwhile."""


@pytest.mark.postgres
@pytest.mark.slow
def test_status_shows_batch_turns_waiting_for_capacity_and_the_models_use_of_its_limits(
    workspace: Path,
) -> None:
    """docs/admission.md#what-an-operator-sees: with batch turns waiting for capacity,
    ``parley status`` prints the lanes and the model's limits, free capacity and the
    tenants waiting, in text and in ``--json``."""
    with fresh_postgres_database("status_lanes") as url:
        flush_redis(CHAOS_REDIS_URL)
        fleet = Fleet(database_url=url, redis_url=CHAOS_REDIS_URL)
        fleet.start_worker(2, "threads", env={"PARLEY_MODEL_LIMITS": LIMITED})
        client = fleet.client()
        env = {**fleet.env(), "PARLEY_MODEL_LIMITS": LIMITED}
        try:
            fleet.wait_ready()
            Control(workspace).script(RULES)
            handles = [
                client.open_session(workspace).submit(f"job {n}", priority="batch")
                for n in range(3)
            ]

            def lanes_waiting() -> dict[str, Any] | None:
                report = status_json(env)
                lanes = [lane for lane in report["lanes"] if lane["waiting_capacity"] >= 2]
                return report if lanes else None

            report = wait_until(lanes_waiting, what="two batch turns to wait for capacity")
            [lane] = report["lanes"]
            assert lane["tenant"] == "" and lane["priority"] == "batch"
            assert lane["unfinished"] >= lane["waiting_capacity"] >= 2
            [model] = report["models"]
            assert model["model"] == "workspace-scripted"
            assert model["limits"] == {"rpm": 6, "tpm": None}
            assert model["learned"] is False
            assert model["requests_available"] is not None and model["requests_available"] < 1
            assert model["slowed"] == 1 and model["blocked_seconds"] == 0
            assert "" in model["waiting_tenants"]

            text = run(env, "parley", "status")
            assert text.returncode == 0, text
            lines = text.stdout.splitlines()
            at = lines.index("by tenant and priority:")
            assert re.fullmatch(
                r"  \(no tenant\) batch: [1-3] unfinished, [1-3] waiting for capacity",
                lines[at + 1],
            ), lines
            [use] = [line for line in lines if line.startswith("model workspace-scripted")]
            assert re.fullmatch(
                r"model workspace-scripted \(configured\): -?\d+ requests free of 6 rpm"
                r"; batch waiting: \(no tenant\) \(next in \d+\.\d s\)",
                use,
            ), use
            # They go on by themselves, one at the model's rate.
            for handle in handles:
                assert handle.wait(90).reply == "later"
            assert status_json(env)["lanes"] == []
        finally:
            client.close()
            fleet.stop()


def start_flower(env: Mapping[str, str]) -> tuple[str, subprocess.Popen[bytes]]:
    """Flower on the fleet's app, serving its API without auth (to this machine only)."""
    port = free_port()
    flower = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "parley.celery_tasks", "flower"),
            *(f"--port={port}", "--address=127.0.0.1"),
        ],
        env={**env, "FLOWER_UNAUTHENTICATED_API": "true"},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        try:
            return httpx.get(f"{url}/healthcheck", timeout=2).text == "OK"
        except httpx.TransportError:
            assert flower.poll() is None, "Flower exited"
            return False

    wait_until(serving, what="Flower to serve")
    return url, flower


def flower_tasks(url: str) -> dict[str, dict[str, Any]]:
    """The drive tasks Flower has seen, by the session they kicked."""
    tasks = httpx.get(f"{url}/api/tasks", timeout=5).json()
    return {
        task["args"].strip("[]'\""): task
        for task in tasks.values()
        if task["name"] == "parley.drive_session"
    }


def test_status_of_an_embedded_database_says_it_has_no_redis(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    root = tmp_path / "repo"
    root.mkdir()
    host = scripted_host(
        [{"when": ".*", "steps": [{"tool_calls": [{"name": "list_files"}]}, {"text": "ok"}]}],
        policy=parley.Policy(ask_tools=["list_files"]),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    env["PARLEY_DATABASE_URL"] = f"sqlite:///{database}"
    with parley.connect(f"sqlite:///{database}", host=host) as client:
        handle = client.open_session(root).submit("list them")
        wait_until(handle.approvals, what="the call to ask")
        report = status_json(env)
        assert report["deployment"] == "embedded"
        assert report["turns"] == {"queued": 0, "running": 0, "waiting": 1}
        assert [t["turn_id"] for t in report["waiting"]] == [handle.turn_id]
        assert report["redis"] is None and report["workers"] is None
        assert report["oldest_queued"] is None
        text = run(env, "parley", "status").stdout.splitlines()
        assert "embedded: no Redis and no workers; turns run in the process that submits them" in (
            text
        )
        assert "turns: 0 queued, 0 running, 1 waiting" in text

    nowhere = {**env, "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'none.db'}"}
    missing = run(nowhere, "parley", "status")
    assert missing.returncode == 2
    assert "InvalidRequest: no database at" in missing.stderr
    assert not (tmp_path / "none.db").exists()
    bad = run(env, "parley", "status", "--timeout", "0")
    assert bad.returncode == 2 and "--timeout" in bad.stderr


def _polls(*, seconds: float, every: float = 0.2) -> Iterator[None]:
    """Yield every ``every`` seconds for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        yield
        time.sleep(every)
