"""Waiting for an event (docs/time.md#waiting-for-an-event), on every deployment: a call
that answers ``parley.WaitFor`` (or the built-in ``wait`` tool) parks its turn,
``waiting`` for an ``event``, holding nothing; ``handle.signal`` wakes it once with the
payload as the call's result; a signal sent early is kept; a timeout is a result saying
so; an interrupt ends the wait; bad signals are refused and change nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.errors import InvalidRequest, TurnEnded
from parley.schemas.events import EventKind
from parley.schemas.records import TurnStatus, Waiting
from tests.acceptance.conftest import deployed_client, host_fleet
from tests.support.deployments import ALL, on_deployments
from tests.support.helpers import Control
from tests.support.hosts import waiting_host
from tests.support.waiting import wait_until

pytestmark = on_deployments(*ALL)

waiting_fleet = host_fleet("tests.support.hosts:waiting_host")


def await_event(event: str, timeout: float | None = None) -> dict[str, Any]:
    arguments: dict[str, Any] = {"event": event}
    if timeout is not None:
        arguments["timeout"] = timeout
    return {"name": "await_event", "arguments": arguments}


APPROVAL = {
    "when": "^send when approved",
    "steps": [
        {"text": "Waiting for finance. ", "tool_calls": [await_event("finance.approved")]},
        {"text": "finance answered"},
    ],
}
SHORT = {
    "when": "^short wait",
    "steps": [
        {"tool_calls": [await_event("never", timeout=1)]},
        {"text": "gave up"},
    ],
}
TIMER = {
    "when": "^nap",
    "steps": [
        {"tool_calls": [{"name": "wait", "arguments": {"seconds": 1}}]},
        {"text": "woke"},
    ],
}
BUILTIN = {
    "when": "^wait for the go",
    "steps": [
        {"tool_calls": [{"name": "wait", "arguments": {"event": "go"}}]},
        {"text": "went"},
    ],
}
LONG = {
    "when": "^long wait",
    "steps": [
        {"tool_calls": [await_event("finance.approved", timeout=3600)]},
        {"text": "finance answered"},
    ],
}
ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
RULES: list[dict[str, Any]] = [APPROVAL, SHORT, TIMER, BUILTIN, LONG, ECHO]


@pytest.fixture
def client(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[parley.Client]:
    """A client of the deployment under test whose host offers the waiting tools."""
    with deployed_client(
        backend, request, tmp_path, fleet="waiting_fleet", host=waiting_host
    ) as deployed:
        yield deployed


def waiting(handle: parley.TurnHandle, timeout: float = 30) -> parley.TurnRecord:
    wait_until(
        lambda: handle.record().status is TurnStatus.WAITING, timeout, what=f"{handle} to wait"
    )
    return handle.record()


def tool_results(handle: parley.TurnHandle) -> list[tuple[str, str]]:
    """Every tool result the turn's events carry, in order."""
    events = handle.events()
    found = []
    for event in events:
        if event.kind is EventKind.TOOL_RESULT:
            found.append((event.data["name"], event.data["content"]))
        if event.kind is EventKind.END:
            break
    return found


def test_a_waiting_call_wakes_once_with_the_signals_payload(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    session = client.open_session(workspace)
    handle = session.submit("send when approved")
    record = waiting(handle)
    assert record.waiting_for is Waiting.EVENT
    assert record.waiting_event == "finance.approved"
    assert record.not_before is None  # no timeout: it waits as long as it takes
    assert handle.result() is None

    assert handle.signal("finance.approved", {"by": "ana", "amount": 12}) is True
    result = handle.wait(timeout=30)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert result.reply == "finance answered"
    assert tool_results(handle) == [("await_event", '{"by": "ana", "amount": 12}')]
    # Its readers were told what it waited for, once, between the call and its result.
    kinds = [e.kind for e in handle.events()]
    [waited] = [e for e in handle.events() if e.kind is EventKind.WAITING]
    assert waited.data == {
        "index": 0,
        "call_id": "call_0_0",
        "event": "finance.approved",
        "until": None,
    }
    assert kinds.index(EventKind.TOOL_CALL) < kinds.index(EventKind.WAITING)
    assert kinds.index(EventKind.WAITING) < kinds.index(EventKind.TOOL_RESULT)
    assert handle.record().waiting_event is None  # (once it no longer waits)
    # The same signal again finds the turn ended: refused, and nothing is kept.
    with pytest.raises(TurnEnded):
        handle.signal("finance.approved", "again")


def test_a_signal_sent_before_the_wait_is_kept_until_the_call_waits(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    session = client.open_session(workspace)
    # The turn is delayed: the signal comes before its call waits for it.
    handle = session.submit("send when approved", after=1.0)
    assert handle.signal("finance.approved", "yes") is False  # kept
    result = handle.wait(timeout=30)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert result.reply == "finance answered"
    assert tool_results(handle) == [("await_event", "yes")]


def test_a_second_signal_of_a_name_is_kept_for_a_later_wait(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    session = client.open_session(workspace)
    first = session.submit("send when approved")
    waiting(first)
    assert first.signal("finance.approved", "one") is True
    assert first.signal("finance.approved", "two") is False  # nothing waits: kept
    assert first.wait(timeout=30).reply == "finance answered"
    assert tool_results(first) == [("await_event", "one")]  # woken once, by the first


def test_a_timeout_gives_a_result_saying_so(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    session = client.open_session(workspace)
    handle = session.submit("short wait")
    record = waiting(handle)
    assert record.waiting_for is Waiting.EVENT
    assert record.not_before is not None  # until when it waits
    [waited] = [e for e in handle.events() if e.kind is EventKind.WAITING]
    assert waited.data["until"] == record.not_before.isoformat()
    result = handle.wait(timeout=30)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert result.reply == "gave up"
    [(name, content)] = tool_results(handle)
    assert name == "await_event"
    assert content.startswith("timed out: no event 'never' came before ")
    # A signal after the timeout wakes nothing: the turn has ended.
    with pytest.raises(TurnEnded):
        handle.signal("never", None)


def test_the_wait_tool_with_seconds_is_a_timer(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    session = client.open_session(workspace)
    began = time.monotonic()
    result = session.turn("nap a second", timeout=30)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert time.monotonic() - began >= 1.0
    assert result.reply == "woke"
    [(name, content)] = tool_results(client.attach(result.turn_id))
    assert name == "wait" and content.startswith("waited until ")


def test_the_wait_tool_waits_for_an_event(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    session = client.open_session(workspace)
    handle = session.submit("wait for the go")
    waiting(handle)
    # Another session's turns run meanwhile: the waiting one holds no worker or lock.
    other = client.open_session(workspace).turn("hello", timeout=30)
    assert other.reply == "heard: hello"
    handle.signal("go", [1, 2, 3])
    assert handle.wait(timeout=30).reply == "went"
    assert tool_results(handle) == [("wait", "[1, 2, 3]")]


def test_an_interrupt_ends_the_wait_and_the_call_gets_a_result(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    session = client.open_session(workspace)
    handle = session.submit("send when approved")
    waiting(handle)
    handle.interrupt()
    result = handle.wait(timeout=30)
    assert result.outcome is TurnStatus.CANCELLED
    [(name, content)] = tool_results(handle)
    assert name == "await_event"
    assert content.startswith("not waited for: the turn was interrupted")


@pytest.mark.parametrize(
    ("name", "payload", "says"),
    [
        ("", None, "signal name"),
        ("has space", None, "signal name"),
        ("x" * 129, None, "signal name"),
        (7, None, "signal name"),
        ("ok", float("nan"), "JSON"),
        ("ok", {1: "non-string key"}, "JSON"),
        ("ok", {"set": {1, 2}}, "JSON"),
        ("ok", "x" * 100_001, "bytes"),
    ],
)
def test_bad_signals_are_refused_and_change_nothing(
    client: parley.Client,
    workspace: Path,
    control: Control,
    name: Any,
    payload: Any,
    says: str,
) -> None:
    control.script(RULES)
    session = client.open_session(workspace)
    handle = session.submit("send when approved")
    waiting(handle)
    with pytest.raises(InvalidRequest, match=says):
        handle.signal(name, payload)
    assert handle.record().status is TurnStatus.WAITING
    handle.signal("finance.approved", "after all")
    assert handle.wait(timeout=30).reply == "finance answered"
    assert tool_results(handle) == [("await_event", "after all")]


def test_concurrent_signals_wake_the_call_exactly_once(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    session = client.open_session(workspace)
    handle = session.submit("send when approved")
    waiting(handle)
    start = threading.Barrier(8)

    def send(number: int) -> bool:
        start.wait()
        return client.attach(handle.turn_id).signal("finance.approved", number)

    with ThreadPoolExecutor(8) as pool:
        woke = list(pool.map(send, range(8)))
    assert woke.count(True) == 1  # one woke the call; the seven others are kept
    result = handle.wait(timeout=30)
    assert result.reply == "finance answered"
    assert tool_results(handle) == [("await_event", str(woke.index(True)))]


def test_an_operator_sees_what_each_turn_waits_for_and_until_when(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    store = client.store

    def counted() -> tuple[int, int]:
        lanes = [lane for lane in store.work_by_lane() if lane.priority == "interactive"]
        by_tenant = store.waiting_for_events()
        return sum(lane.waiting_event for lane in lanes), sum(n for n, _ in by_tenant.values())

    before = counted()
    endless = client.open_session(workspace).submit("send when approved")
    bounded = client.open_session(workspace).submit("long wait")
    waiting(endless)
    until = waiting(bounded).not_before
    assert until is not None
    assert counted() == (before[0] + 2, before[1] + 2)
    listed = {t.turn_id: t for t in store.unfinished_work(500).turns[TurnStatus.WAITING]}
    assert (listed[endless.turn_id].event, listed[endless.turn_id].until) == (
        "finance.approved",
        None,
    )
    assert (listed[bounded.turn_id].event, listed[bounded.turn_id].until) == (
        "finance.approved",
        until,
    )
    lane = next(lane for lane in store.work_by_lane() if lane.priority == "interactive")
    assert lane.event_deadline is not None and lane.event_deadline <= until

    for handle in (endless, bounded):
        handle.signal("finance.approved", "ok")
        assert handle.wait(timeout=30).reply == "finance answered"
    assert counted() == before
