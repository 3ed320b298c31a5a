"""Batches on a fleet under failure (docs/batches.md#how-the-lines-reach-the-fleet), with
real processes: a worker SIGKILLed mid-batch loses and doubles no line (a ledger tool
proves no committed call ran twice); the batch window keeps at most its size of lines in
flight and the broker holds no kick per line; two tenants' batches share the window by
weight, the later one starting at the next place, not after the other's lines; an
interactive turn posted into a line's session is not held behind the window, nor starts
the line in it; an emptied Redis (kicks and marks lost) does not stall a batch, the
sweeper topping the window up; an interactive turn starts at once beside a batch of slow
lines."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import text

from parley.schemas.records import TurnStatus
from parley.store.statements import window as wq
from tests.support.chaos import Chaos, chaos_fleet, deployment_options
from tests.support.deployments import on_fleet_deployments
from tests.support.fleet import flush_redis
from tests.support.waiting import wait_until

pytestmark = [on_fleet_deployments(), pytest.mark.postgres, pytest.mark.slow]

WINDOW = 4
WEIGHTS = "small=3"
LEDGER: dict[str, Any] = {
    "when": "^ledger",
    "steps": [
        {"tool_calls": [{"name": "record_call", "arguments": {}}]},
        # Streamed slowly (about a second a line) so that the kill lands mid-line.
        {"text": "recorded: {last_message}", "chunk_chars": 2, "delay_ms": 100},
    ],
}
SLOW: dict[str, Any] = {
    "when": "^slow",
    "steps": [{"text": "".join(f"w{i} " for i in range(12)), "chunk_chars": 3, "delay_ms": 50}],
}
ECHO: dict[str, Any] = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}


@pytest.fixture
def chaos(
    workspace: Path,
    deployment: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Chaos]:
    monkeypatch.setenv("PARLEY_BATCH_WINDOW", str(WINDOW))  # the producer's (it fills it)
    monkeypatch.setenv("PARLEY_TENANT_WEIGHTS", WEIGHTS)
    options = deployment_options(deployment, request)
    environment = {
        **options.pop("environment", {}),
        "PARLEY_BATCH_WINDOW": str(WINDOW),
        "PARLEY_TENANT_WEIGHTS": WEIGHTS,
    }
    with chaos_fleet(workspace, environment=environment, **options) as harness:
        harness.control.script([LEDGER, SLOW, ECHO])
        yield harness


def lines(prefix: str, count: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"{prefix}{n}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"input": f"{prefix} {n}"},
        }
        for n in range(count)
    ]


def test_a_worker_killed_mid_batch_loses_and_doubles_no_line(chaos: Chaos) -> None:
    batch = chaos.client.submit_batch(lines("ledger", 24), root=chaos.workspace)
    store = chaos.client.store
    wait_until(lambda: batch.status().counts.completed >= 3, what="some lines to end")

    def running() -> list[str]:
        return [
            line.turn_id
            for line in store.batch_lines(batch.id, None, 0, 100)
            if line.turn_id and store.run_state(line.turn_id).status is TurnStatus.RUNNING
        ]

    def frozen_mid_line() -> int | None:
        """A worker group stopped while a line it drives is still running (None: the line
        ended first; the group runs on). Checking only before the kill left a gap in which
        the line could end, and then the kill interrupted nothing."""
        driven = wait_until(running, what="a line to be running")
        group = chaos.worker_group_of(chaos.driver_pid(driven[0]))
        os.killpg(group, signal.SIGSTOP)
        time.sleep(0.2)  # a commit already on its way to PostgreSQL lands
        if store.run_state(driven[0]).status is TurnStatus.RUNNING:
            return group
        os.killpg(group, signal.SIGCONT)
        return None

    os.killpg(wait_until(frozen_mid_line, what="a worker stopped mid-line"), signal.SIGKILL)

    rows = list(batch.results(timeout=120))

    assert sorted(r["custom_id"] for r in rows) == sorted(f"ledger{n}" for n in range(24))
    assert all(r["error"] is None for r in rows), [r["error"] for r in rows if r["error"]]
    state = batch.status()
    assert state.status == "completed" and state.request_counts["completed"] == 24
    for row in rows:
        body = row["response"]["body"]
        assert body["output_text"] == f"recorded: {row['custom_id'].replace('ledger', 'ledger ')}"
        run = store.run_state(body["id"])
        assert run.steps == 2  # the tool's step committed once, the answer once
    # A committed call never ran again: a call ran twice only for a line whose driver
    # was killed before its step committed (the step was redone by its next attempt).
    calls = len((chaos.control.dir / "record-calls").read_text().split())
    retried = sum(1 for r in rows if store.run_state(r["response"]["body"]["id"]).attempts > 1)
    assert retried >= 1, "the kill interrupted no line"
    assert 24 <= calls <= 24 + retried, (calls, retried)


def test_the_window_bounds_the_lines_in_flight_and_the_broker_holds_few_kicks(
    chaos: Chaos,
) -> None:
    batch = chaos.client.submit_batch(lines("slow", 40), root=chaos.workspace)
    store = chaos.client.store
    broker = redis.Redis.from_url(chaos.redis_url)
    queue = f"{chaos.fleet.queue}.batch"
    most_running = most_queued = 0
    while not batch.status().ended:
        most_running = max(most_running, sum(batch_runs_in_flight(store).values()))
        most_queued = max(most_queued, int(broker.llen(queue)))
        time.sleep(0.05)
    assert batch.status().request_counts["completed"] == 40
    assert 1 <= most_running <= WINDOW, most_running
    # A kick per line would have put ~40 in the queue; the window keeps it near its size.
    assert most_queued <= 2 * WINDOW, most_queued


def batch_runs_in_flight(store: Any) -> dict[str, int]:
    """Each tenant's batch runs driven now or waiting for provider capacity, as the runs'
    rows say (not the window's own count of its places)."""
    query = text(
        "SELECT tenant, count(*) FROM runs WHERE priority = 'batch' AND (status = 'running' "
        "OR (status = 'queued' AND not_before IS NOT NULL)) GROUP BY tenant"
    )
    with store.engine.connect() as db:
        return {tenant: int(count) for tenant, count in db.execute(query)}


def test_two_tenants_batches_share_the_window_by_weight(chaos: Chaos) -> None:
    """Issue 43: with a window of 8, a weight-3 tenant got nothing started for 16.7 s,
    until all 40 of a weight-1 tenant's lines had.  Here small (weight 3) submits after
    big has filled the window: its first line takes the next place that frees, and it
    holds up to three of the four while both have lines waiting."""
    store = chaos.client.store
    big = chaos.client.submit_batch(lines("slow", 40), root=chaos.workspace, tenant="big")
    wait_until(lambda: big.status().counts.running >= 1, what="big's lines to run")
    small = chaos.client.submit_batch(lines("slow", 10), root=chaos.workspace, tenant="small")
    big_started_then = None
    most: dict[str, int] = {"big": 0, "small": 0}
    while not small.status().ended:
        counts = small.status().counts
        if big_started_then is None and counts.running + counts.completed > 0:
            big_counts = big.status().counts
            big_started_then = big_counts.running + big_counts.completed
        flying = batch_runs_in_flight(store)
        assert sum(flying.values()) <= WINDOW, flying
        with store.engine.connect() as db:
            places = {row.tenant: int(row.places) for row in db.execute(wq.PLACES_BY_TENANT)}
        for tenant in most:
            most[tenant] = max(most[tenant], places.get(tenant, 0))
        time.sleep(0.05)
    assert big_started_then is not None and big_started_then < 40 - 20, big_started_then
    assert most["small"] == 3, most  # its share: three places of four
    assert not big.status().ended, "big ended first: the test proves nothing"
    big.cancel()


def test_an_interactive_turn_behind_a_line_is_not_held_behind_the_window(chaos: Chaos) -> None:
    """The window is full of slow lines; an interactive turn is posted into the session
    of a line that has no place.  The line moves to the interactive lane and runs at
    once, then the turn: neither waits for the window, which is never exceeded."""
    store = chaos.client.store
    batch = chaos.client.submit_batch(lines("slow", 40), root=chaos.workspace)
    wait_until(lambda: batch.status().counts.running >= 1, what="the batch to run")
    line = store.batch_lines(batch.id, None, 0, 40)[-1]
    assert line.turn_id is not None and line.session_id is not None
    handle = chaos.client.session(line.session_id).submit("are you done?")
    done = threading.Event()
    most = [0]

    def watch() -> None:
        while not done.is_set():
            most[0] = max(most[0], sum(batch_runs_in_flight(store).values()))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert handle.wait(60).outcome is TurnStatus.FINISHED
    finally:
        done.set()
        watcher.join(10)
    assert store.run_state(line.turn_id).status is TurnStatus.FINISHED
    assert not batch.status().ended, "the batch ended first: the test proves nothing"
    assert most[0] <= WINDOW, most
    batch.cancel()


def test_an_emptied_redis_does_not_stall_a_batch(chaos: Chaos) -> None:
    batch = chaos.client.submit_batch(lines("slow", 16), root=chaos.workspace)
    wait_until(lambda: batch.status().counts.completed >= 2, what="some lines to end")
    flush_redis(chaos.redis_url)  # every kick, work mark and lock: gone
    rows = list(batch.results(timeout=120))
    assert sorted(r["custom_id"] for r in rows) == sorted(f"slow{n}" for n in range(16))
    assert batch.status().status == "completed"


def test_an_interactive_turn_starts_at_once_beside_a_batch(chaos: Chaos) -> None:
    batch = chaos.client.submit_batch(lines("slow", 40), root=chaos.workspace)
    wait_until(lambda: batch.status().counts.running >= 1, what="the batch to run")
    session = chaos.client.open_session(chaos.workspace)
    started = threading.Event()
    submitted = time.monotonic()
    handle = session.submit("hello")
    for event in handle.events():
        if event.kind.value == "token":
            started.set()
            break
    waited = time.monotonic() - submitted
    assert started.is_set()
    assert handle.wait(30).outcome is TurnStatus.FINISHED
    assert not batch.status().ended, "the batch ended first: the test proves nothing"
    assert waited < 3, f"the interactive turn waited {waited:.1f}s behind the batch"
    batch.cancel()
