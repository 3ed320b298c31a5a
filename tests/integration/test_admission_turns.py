"""Admission in the engine, on the embedded runtime (docs/admission.md): a call that must
wait longer than a second lets its session go and comes back when its capacity is due,
with a ``throttled`` event for its readers; nothing about the turn changes but when it
runs.  (The fleet's side, against a rate-limited provider server: the acceptance tests.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.schemas.events import Event, EventKind
from parley.schemas.records import TurnStatus, Waiting
from tests.support.events import assert_once_in_order
from tests.support.waiting import wait_until

# 30 requests a minute at parley's headroom: one call about every 2.1 s, a burst of one.
SLOW = parley.Limits(rpm=30)


def _model(tmp_path: Path) -> str:
    """A model name of the test's own: the process's admission outlives a client."""
    return f"scripted:{tmp_path.name}"


def _client(tmp_path: Path, *, limits: parley.Limits | None = SLOW, **host: Any) -> parley.Client:
    name = _model(tmp_path)
    model = parley.models.ScriptedModel(
        {"rules": [{"when": ".*", "steps": [{"text": "heard: {prompt}"}]}]}, name=name
    )
    return parley.connect(
        f"sqlite:///{tmp_path / 'runs.db'}",
        host=parley.Host(model=model, limits={name: limits} if limits else {}, **host),
    )


def _root(tmp_path: Path, name: str) -> str:
    (tmp_path / name).mkdir()
    return str(tmp_path / name)


def _events(handle: parley.TurnHandle) -> list[Event]:
    return list(handle.events(after=0))


def test_a_call_over_the_limit_lets_its_session_go_and_goes_on_when_capacity_is_due(
    tmp_path: Path,
) -> None:
    client = _client(tmp_path)
    try:
        sessions = [client.open_session(root=_root(tmp_path, f"w{n}")) for n in range(3)]
        started = time.monotonic()
        handles = [s.submit(f"turn {n}") for n, s in enumerate(sessions)]
        results = [h.wait(timeout=30) for h in handles]
        took = time.monotonic() - started
        assert [r.outcome for r in results] == [TurnStatus.FINISHED] * 3
        assert [r.reply for r in results] == [f"heard: turn {n}" for n in range(3)]
        # One call every ~2.1 s: the third cannot have started before ~4 s.
        assert took > 3.5, took
        throttled = [[e for e in _events(h) if e.kind is EventKind.THROTTLED] for h in handles]
        assert sum(1 for t in throttled if t) >= 2, throttled
        for handle, waits in zip(handles, throttled, strict=True):
            events = _events(handle)
            assert_once_in_order(events)
            for wait in waits:
                assert wait.data["model"] == _model(tmp_path) and wait.data["seconds"] > 1
            # A wait is not a takeover: the turn's one step committed once.
            assert [e.kind for e in events].count(EventKind.STEP) == 1
            assert [e.kind for e in events].count(EventKind.STEP_RESTARTED) == 0
    finally:
        client.close()


def test_a_waiting_turn_holds_its_sessions_line_and_no_runner(tmp_path: Path) -> None:
    client = _client(tmp_path)
    try:
        first = client.open_session(root=_root(tmp_path, "a"))
        second = client.open_session(root=_root(tmp_path, "b"))
        first.submit("takes the burst").wait(timeout=30)
        waiting = second.submit("must wait")
        later = second.submit("after it")  # the same session: behind the waiting turn
        wait_until(
            lambda: any(e.kind is EventKind.THROTTLED for e in _events_so_far(client, waiting)),
            timeout=10,
            what="the second session's turn to wait for capacity",
        )
        record = client.attach(waiting.turn_id).record()
        assert record.status is TurnStatus.QUEUED
        # What it waits for, and until when, is on its record (docs/http.md#3-resources).
        assert record.waiting_for is Waiting.CAPACITY and record.not_before is not None
        assert later.record().waiting_for is None  # in line behind it: waits for nothing
        assert client.attach(later.turn_id).record().status is TurnStatus.QUEUED
        results = [waiting.wait(timeout=30), later.wait(timeout=30)]
        assert [r.outcome for r in results] == [TurnStatus.FINISHED, TurnStatus.FINISHED]
        # Submission order held: the later turn hangs under the one that waited.
        tree = {t.turn_id: t for t in second.tree()}
        assert tree[later.turn_id].parent_id == waiting.turn_id
    finally:
        client.close()


def _events_so_far(client: parley.Client, handle: parley.TurnHandle) -> list[Event]:
    """The turn's durable events stored so far (without waiting for more)."""
    return client.store.events_after(handle.turn_id, 0)


def test_an_interrupt_does_not_wait_for_the_capacity_a_turn_waits_for(tmp_path: Path) -> None:
    client = _client(tmp_path, limits=parley.Limits(rpm=2))  # one call every ~32 s
    try:
        a = client.open_session(root=_root(tmp_path, "a"))
        b = client.open_session(root=_root(tmp_path, "b"))
        a.submit("takes the burst").wait(timeout=30)
        waiting = b.submit("waits half a minute")
        wait_until(
            lambda: any(e.kind is EventKind.THROTTLED for e in _events_so_far(client, waiting)),
            timeout=10,
            what="the turn to wait for capacity",
        )
        asked = time.monotonic()
        waiting.interrupt()
        result = waiting.wait(timeout=10)
        assert result.outcome is TurnStatus.CANCELLED
        assert time.monotonic() - asked < 5
    finally:
        client.close()


@pytest.mark.parametrize("value", ["fast", "", "BATCH", 1])
def test_a_priority_that_is_no_lane_is_refused_and_submits_nothing(
    tmp_path: Path, value: Any
) -> None:
    client = _client(tmp_path, limits=None)
    try:
        session = client.open_session(root=_root(tmp_path, "a"))
        with pytest.raises(parley.errors.InvalidRequest, match="priority"):
            session.submit("no", priority=value)
        assert session.tree() == []
    finally:
        client.close()


def test_limits_must_name_models_and_be_limits(tmp_path: Path) -> None:
    model = parley.models.ScriptedModel({"rules": [{"when": ".*", "steps": [{"text": "x"}]}]})
    with pytest.raises(parley.errors.InvalidRequest, match=r"Host\.limits"):
        parley.Host(model=model, limits={"scripted": 500})  # type: ignore[dict-item]
    with pytest.raises(parley.errors.InvalidRequest, match="rpm"):
        parley.Limits(rpm=0)
    with pytest.raises(parley.errors.InvalidRequest, match="rpm, tpm or both"):
        parley.Limits()
