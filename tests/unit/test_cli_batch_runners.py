"""When ``parley batch results`` says that nothing runs an embedded batch
(src/parley/cli/batch_runners.py): its lines queued, none running or waiting for capacity,
no process driving a session of the database, nothing ending, for UNRUN_SECONDS."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import parley
from parley.batches import BatchState
from parley.cli.batch_runners import UNRUN_SECONDS, NothingRunsIt, UnrunWatch
from parley.runtime.session_leases import ProcessLeases
from parley.schemas.batches import LinePlan
from parley.store.batch_acceptance import NewBatch
from parley.store.ids import new_id
from tests.integration.batch_plans import create_batch


@pytest.fixture
def client(tmp_path: Path) -> Iterator[parley.Client]:
    with parley.connect(f"sqlite:///{tmp_path / 'runs.db'}") as opened:  # no host: reads
        yield opened


def left_queued(client: parley.Client, lines: int) -> BatchState:
    """A batch whose lines nothing ever started, as a stopped submission leaves them."""
    hexes = [uuid.uuid4().hex for _ in range(3)]
    plans = [
        LinePlan(line=n, custom_id=f"c{n}", prompt=f"ticket {n}", session_id=new_id(), root="/")
        for n in range(1, lines + 1)
    ]
    new = NewBatch(
        batch_id=f"batch_{hexes[0]}",
        tenant=None,
        input_file_id=None,
        output_file_id=f"file-{hexes[1]}",
        error_file_id=f"file-{hexes[2]}",
        endpoint="/v1/responses",
        completion_window="24h",
        metadata=None,
        request_id=None,
    )
    record, _ = create_batch(client.store, new, plans, [])
    return client.batch(record.batch_id).status()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_queued_lines_nothing_runs_are_told_after_unrun_seconds(client: parley.Client) -> None:
    state = left_queued(client, 3)
    clock = Clock()
    watch = UnrunWatch(client, clock=clock)
    watch(state)
    clock.now += UNRUN_SECONDS - 0.1
    watch(state)  # not yet: a live process with a host adopts them within it
    clock.now += 0.1
    with pytest.raises(NothingRunsIt) as told:
        watch(state)
    assert told.value.state.counts.queued == 3


def test_a_line_ending_running_or_waiting_for_capacity_starts_the_count_again(
    client: parley.Client,
) -> None:
    state = left_queued(client, 3)
    clock = Clock()
    watch = UnrunWatch(client, clock=clock)
    counts = state.counts
    for moving in (
        dataclasses.replace(counts, queued=2, completed=1),  # a line ended
        dataclasses.replace(counts, queued=2, running=1),
        dataclasses.replace(counts, queued=2, throttled=1),
    ):
        watch(state)
        clock.now += UNRUN_SECONDS - 1
        watch(dataclasses.replace(state, counts=moving))
        clock.now += UNRUN_SECONDS - 1
        watch(dataclasses.replace(state, counts=moving))  # (nothing raised: it moves)
        watch = UnrunWatch(client, clock=clock)


def test_a_process_driving_any_session_of_the_database_is_left_to_get_to_them(
    client: parley.Client,
) -> None:
    state = left_queued(client, 2)
    busy = client.open_session("/")
    leases = ProcessLeases(client.store.leases)
    assert leases.acquire(busy.id)  # another process, driving a turn of its own
    clock = Clock()
    watch = UnrunWatch(client, clock=clock)
    try:
        for _ in range(3):
            watch(state)
            clock.now += UNRUN_SECONDS
    finally:
        leases.release(busy.id)
        leases.close()
    watch(state)
    clock.now += UNRUN_SECONDS
    with pytest.raises(NothingRunsIt):
        watch(state)
