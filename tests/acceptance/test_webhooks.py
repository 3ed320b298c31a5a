"""Webhooks (docs/operations.md#webhooks) against a real loopback receiver that hangs (the deliverer
times out), fails (500) and then recovers: every turn's end is delivered at least once, signed,
from the durable outbox, across a restart of the deliverer, and never holds up a turn or
changes its outcome.  Embedded on SQLite and PostgreSQL (the host's URL, the client's
thread restarted), and on a fleet (a session's URL, ``parley beat`` killed and started
again)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.schemas.operations import DeliveryState, WebhookDelivery
from parley.schemas.records import TurnResult, TurnStatus
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import REDIS_TEST_URL, Fleet, flush_redis
from tests.support.helpers import Control
from tests.support.hosts import workspace_host
from tests.support.webhook_receiver import Receiver, receiver

pytestmark = pytest.mark.slow

SECRET = "whsec-test-6d1f0c2a"
FAST = {
    "PARLEY_WEBHOOK_SECRET": SECRET,
    "PARLEY_WEBHOOK_TIMEOUT": "1",
    "PARLEY_WEBHOOK_BACKOFF": "0.2",
    "PARLEY_WEBHOOK_MAX_BACKOFF": "1",
}
RULES: list[dict[str, Any]] = [
    {"when": "budget", "steps": [{"tool_calls": [{"name": "list_files"}]}, {"text": "never"}]},
    {"when": "gate", "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "out"}]},
    {"when": ".*", "steps": [{"text": "heard: {last_message}"}]},
]
OUTCOMES = [
    TurnStatus.FINISHED,
    TurnStatus.BUDGET_EXCEEDED,
    TurnStatus.CANCELLED,
    TurnStatus.FINISHED,  # the cancelled turn, resumed: an end of its own
]


def run_turns(session: parley.Session, control: Control) -> list[TurnResult]:
    """Turns that end in each way a receiver must hear of; each returns at once, whatever
    the receiver does."""
    results = [
        session.turn("hello", timeout=30),
        session.turn("over budget", contract=parley.TaskContract(max_steps=1), timeout=30),
    ]
    handle = session.submit("through the gate")
    control.wait_entered()
    handle.interrupt()
    control.open_gate()
    results.append(handle.wait(30))
    results.append(session.resume(handle.turn_id).wait(30))
    assert [r.outcome for r in results] == OUTCOMES
    return results


def wait_deliveries(
    session: parley.Session,
    done: Callable[[WebhookDelivery], bool],
    what: str,
    timeout: float = 60,
) -> list[WebhookDelivery]:
    deadline = time.monotonic() + timeout
    while True:
        found = session.webhook_deliveries()
        if len(found) == len(OUTCOMES) and all(done(d) for d in found):
            return found
        assert time.monotonic() < deadline, f"not {what}: {found}"
        time.sleep(0.05)


def check_delivered(session: parley.Session, hooks: Receiver, results: list[TurnResult]) -> None:
    """Each end delivered at least once, as it was, under a signature that verifies."""
    deliveries = wait_deliveries(session, lambda d: d.state is DeliveryState.DELIVERED, "delivered")
    for result, delivery in zip(results, deliveries, strict=True):
        assert (delivery.turn_id, delivery.outcome) == (result.turn_id, result.outcome.value)
        assert delivery.attempts >= 2 and delivery.last_error is None
        assert delivery.last_status == 200
    received = hooks.answered_ok()
    assert set(received) >= {d.delivery_id for d in deliveries}
    for result, delivery in zip(results, deliveries, strict=True):
        payload = received[delivery.delivery_id].payload
        assert payload == delivery.payload()
        assert payload["session_id"] == session.id and payload["run_id"] == result.run_id
        assert payload["reply"] == result.reply and payload["steps"] == result.steps
        assert payload["usage"] == {
            "input_tokens": result.usage.input_tokens,
            "output_tokens": result.usage.output_tokens,
        }
    for request in hooks.requests():  # every attempt, failed ones too
        assert request.signed_by(SECRET), request.headers
        assert request.delivery_id == request.payload["delivery_id"]
        assert request.headers["content-type"] == "application/json"
        assert request.path == "/hooks/parley"


def check_waiting(session: parley.Session) -> None:
    """The operator's view while the receiver is down: tried, failed, why, due again."""
    pending = wait_deliveries(
        session, lambda d: d.attempts >= 1 and d.last_error is not None, "attempted"
    )
    for delivery in pending:
        assert delivery.state is DeliveryState.PENDING
        assert delivery.last_error is not None
        assert delivery.last_error.startswith(("timed out", "HTTP 500"))


@pytest.mark.parametrize(
    "database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_embedded_every_end_is_delivered_at_least_once_across_a_restart(
    database: str, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in FAST.items():
        monkeypatch.setenv(name, value)
    control = Control(workspace)
    control.script(RULES)
    with own_database(database, tmp_path) as url, receiver(mode="hang") as hooks:
        host = workspace_host(webhook_url=hooks.url)
        with parley.connect(url, host=host, migrate_schema=True) as client:
            session = client.open_session(workspace)
            results = run_turns(session, control)  # while no POST has been answered
            assert all(r.answer == "hang" for r in hooks.requests())
            check_waiting(session)
        # The client closed (its deliverer with it) with every end still undelivered.
        hooks.plan, hooks.mode = ["fail", "fail"], "ok"
        hooks.release()
        with parley.connect(url, host=host) as restarted:
            check_delivered(restarted.session(session.id), hooks, results)


@pytest.mark.postgres
def test_fleet_every_end_is_delivered_at_least_once_across_a_beat_restart(
    workspace: Path,
) -> None:
    control = Control(workspace)
    control.script(RULES)
    with fresh_postgres_database("hooks") as url, receiver(mode="hang") as hooks:
        flush_redis(REDIS_TEST_URL)
        fleet = Fleet(database_url=url, environment=FAST)
        try:
            fleet.start_worker(concurrency=2, pool="threads")
            beat = fleet.start_beat()
            fleet.wait_ready()
            with parley.connect(url, redis_url=fleet.redis_url, queue=fleet.queue) as client:
                session = client.open_session(workspace, webhook_url=hooks.url)
                assert session.webhook_url == hooks.url
                results = run_turns(session, control)
                assert all(r.answer == "hang" for r in hooks.requests())
                check_waiting(session)
                os.killpg(beat.pid, signal.SIGKILL)  # the deliverer dies, mid-retry
                beat.wait(10)
                hooks.plan, hooks.mode = ["fail", "fail"], "ok"
                hooks.release()
                fleet.start_beat()
                check_delivered(session, hooks, results)
        finally:
            fleet.stop()


def own_database(backend: str, tmp_path: Path) -> AbstractContextManager[str]:
    """A database of the test's own."""
    if backend == "sqlite":
        return nullcontext(f"sqlite:///{tmp_path / 'hooks.db'}")
    return fresh_postgres_database("hooks")
