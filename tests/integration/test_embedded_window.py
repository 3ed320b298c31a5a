"""The batch window in one embedded process (src/parley/kickers.py's window thread over the
store's places, as on the fleet): two tenants' batches share it by weight, the later one
starting at the next place rather than after the other's lines (issue 43: "same pattern
embedded"); the batch runs driven at once never exceed it; an interactive turn posted
into a line's session moves the line out of it and runs at once; a batch turn submitted
on its own waits for a place like a line."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import parley
from tests.support.waiting import wait_until

WINDOW = 2
SLOW = {
    "when": "^slow",
    "steps": [{"text": "".join(f"w{i} " for i in range(8)), "chunk_chars": 3, "delay_ms": 40}],
}
ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[parley.Client]:
    monkeypatch.setenv("PARLEY_BATCH_WINDOW", str(WINDOW))
    monkeypatch.setenv("PARLEY_TENANT_WEIGHTS", "small=3")
    host = parley.Host(model=parley.models.ScriptedModel({"rules": [SLOW, ECHO]}))
    with parley.connect(f"sqlite:///{tmp_path / 'runs.db'}", host=host) as opened:
        yield opened


def lines(prefix: str, count: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"{prefix}{n}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"input": f"slow {n}"},
        }
        for n in range(count)
    ]


class Watch:
    """Samples the batch runs driven (running, or waiting for capacity), by tenant, on a
    thread of its own, until stopped; keeps the most seen."""

    def __init__(self, client: parley.Client) -> None:
        self._client = client
        self.most = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        query = text(
            "SELECT count(*) FROM runs WHERE priority = 'batch' AND (status = 'running' "
            "OR (status = 'queued' AND not_before IS NOT NULL))"
        )
        while not self._done.is_set():
            with self._client.store.engine.connect() as db:
                self.most = max(self.most, int(db.execute(query).scalar_one()))
            time.sleep(0.01)

    def stop(self) -> int:
        self._done.set()
        self._thread.join(10)
        return self.most


def test_two_tenants_share_the_window_and_it_is_never_exceeded(
    client: parley.Client, tmp_path: Path
) -> None:
    watch = Watch(client)
    try:
        big = client.submit_batch(lines("big", 20), root=str(tmp_path), tenant="big")
        wait_until(lambda: big.status().counts.running >= 1, what="big's lines to run")
        small = client.submit_batch(lines("small", 4), root=str(tmp_path), tenant="small")
        wait_until(
            lambda: small.status().counts.running + small.status().counts.completed >= 1,
            what="small's first line to start",
        )
        started = big.status().counts
        assert started.running + started.completed < 10, started
        assert [r["error"] for r in small.results(timeout=60)] == [None] * 4
        assert not big.status().ended, "big ended first: the test proves nothing"
        list(big.results(timeout=120))
    finally:
        most = watch.stop()
    assert 1 <= most <= WINDOW, most


def test_an_interactive_turn_behind_a_line_runs_it_out_of_the_window(
    client: parley.Client, tmp_path: Path
) -> None:
    watch = Watch(client)
    try:
        batch = client.submit_batch(lines("l", 12), root=str(tmp_path))
        wait_until(lambda: batch.status().counts.running >= 1, what="the batch to run")
        last = client.store.batch_lines(batch.id, None, 0, 12)[-1]
        assert last.session_id is not None and last.turn_id is not None
        handle = client.session(last.session_id).submit("are you done?")
        assert handle.wait(30).outcome is parley.TurnStatus.FINISHED
        assert client.store.run_state(last.turn_id).status is parley.TurnStatus.FINISHED
        assert not batch.status().ended, "the batch ended first: the test proves nothing"
        list(batch.results(timeout=120))
    finally:
        most = watch.stop()
    assert most <= WINDOW, most


def test_a_batch_turn_submitted_on_its_own_waits_for_a_place(
    client: parley.Client, tmp_path: Path
) -> None:
    watch = Watch(client)
    try:
        sessions = [client.open_session(str(tmp_path)) for _ in range(6)]
        handles = [s.submit(f"slow {n}", priority="batch") for n, s in enumerate(sessions)]
        assert {h.wait(60).outcome for h in handles} == {parley.TurnStatus.FINISHED}
    finally:
        most = watch.stop()
    assert most == WINDOW, most
