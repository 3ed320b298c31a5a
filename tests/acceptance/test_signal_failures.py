"""Waiting for an event (docs/guarantees.md#32-signals, docs/time.md#waiting-for-an-event)
on the fleet under failure, with real processes: turns waiting for an event survive every
worker SIGKILLed and Redis emptied, each wakes once on one signal sent while no worker
lives (a second signal of the same name is kept, waking nothing), and its call's result
appears once; a wait whose time runs out while no worker lives is timed out by ``beat``
and ends with a result saying so.

Each test starts a fleet of its own (:mod:`tests.support.chaos`), on prefork and on the
Procfile's worker line (``tests.support.chaos.DEPLOYMENTS``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.schemas.events import EventKind
from parley.schemas.records import TurnStatus, Waiting
from tests.support.chaos import CHAOS_REDIS_URL, Chaos, chaos_fleet, deployment_options
from tests.support.deployments import on_fleet_deployments
from tests.support.events import assert_once_in_order
from tests.support.fleet import flush_redis
from tests.support.waiting import wait_until

pytestmark = [on_fleet_deployments(), pytest.mark.postgres, pytest.mark.slow]

ChaosFactory = Callable[..., Chaos]
WAITING_HOST = "tests.support.hosts:waiting_host"


@pytest.fixture
def start_fleet(
    workspace: Path, deployment: str, request: pytest.FixtureRequest
) -> Iterator[ChaosFactory]:
    """``start_fleet(**options)``: this test's fleet (one), whose workers offer the
    waiting tools, as the deployment says unless told otherwise."""
    with ExitStack() as stack:

        def start(**options: Any) -> Chaos:
            options = {**deployment_options(deployment, request), "host": WAITING_HOST, **options}
            return stack.enter_context(chaos_fleet(workspace, **options))

        yield start


def awaiting(chaos: Chaos) -> None:
    """A prompt ``await NAME`` waits for the event NAME (``await NAME for SECONDS``: at
    most that long), then says it is done; any other prompt is answered at once."""
    chaos.control.script(
        [
            {
                "when": "^await approval$",
                "steps": [
                    {"text": "waiting ", "tool_calls": [_await({"event": "approval"})]},
                    {"text": "done"},
                ],
            },
            {
                "when": "^await soon$",
                "steps": [
                    {"tool_calls": [_await({"event": "soon", "timeout": 2})]},
                    {"text": "done"},
                ],
            },
            {"when": ".*", "steps": [{"text": "plain: {prompt}"}]},
        ]
    )


def _await(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"name": "await_event", "arguments": arguments}


def waiting_for_event(handles: list[parley.TurnHandle]) -> None:
    wait_until(
        lambda: all(h.record().waiting_for is Waiting.EVENT for h in handles),
        what="every turn to wait for its event",
    )


def results_of(handle: parley.TurnHandle) -> list[tuple[str, str]]:
    """The turn's tool results, as its stored events carry them."""
    return [
        (e.data["call_id"], e.data["content"])
        for e in handle.events()
        if e.kind is EventKind.TOOL_RESULT
    ]


@pytest.mark.timeout(240)
@pytest.mark.also_amqp
def test_turns_waiting_for_an_event_survive_every_worker_killed_and_redis_emptied(
    start_fleet: ChaosFactory,
) -> None:
    chaos = start_fleet()
    awaiting(chaos)
    client = chaos.client
    handles = [client.open_session(chaos.workspace).submit("await approval") for _ in range(4)]
    timed = client.open_session(chaos.workspace).submit("await soon")
    waiting_for_event([*handles, timed])
    for handle in [*handles, timed]:
        assert client.store.run_state(handle.turn_id).worker is None  # it holds no worker

    chaos.kill_workers()
    flush_redis(CHAOS_REDIS_URL)  # locks, buffers, kicks, bindings: all gone

    # Signalled with no worker alive, in no particular order; each turn is runnable at
    # once, and a second signal of the same name wakes nothing (it is kept).
    for number, handle in reversed(list(enumerate(handles))):
        assert handle.signal("approval", {"turn": number}) is True
        assert handle.record().status is TurnStatus.QUEUED
        assert handle.signal("approval", "again") is False
    # beat, still alive, times the other wait out while no worker lives.
    wait_until(lambda: timed.record().status is TurnStatus.QUEUED, what="beat to time the wait out")

    chaos.start_worker()
    results = [handle.wait(60) for handle in handles]
    assert [r.outcome for r in results] == [TurnStatus.FINISHED] * 4
    assert [r.reply for r in results] == ["done"] * 4
    for number, handle in enumerate(handles):
        # The call's result appears once, and is the first signal's payload.
        assert results_of(handle) == [("call_0_0", f'{{"turn": {number}}}')]
        events = list(handle.events())
        assert_once_in_order(events, gap_free=False)
        kinds = [e.kind for e in events]
        assert kinds.count(EventKind.TOOL_CALL) == 1
        assert kinds.count(EventKind.END) == 1

    ended = timed.wait(60)
    assert ended.outcome is TurnStatus.FINISHED and ended.reply == "done"
    [(call_id, content)] = results_of(timed)
    assert call_id == "call_0_0"
    assert content.startswith("timed out: no event 'soon' came before ")
