"""Schedules fire each slot exactly once fleet-wide (docs/time.md#schedules), with two
``parley beat`` processes racing for every slot and processes SIGKILLed as slots fire:
a beat killed mid-firing (its transaction rolls back, and the other beat, or a new one,
fires the slot), the worker killed while the fired turns run, Redis emptied.  Every
slot of a per-minute schedule has one row, one turn, and that turn finishes once.

The fast test makes slots come at once by moving the schedules' next slot minutes back
(as if every beat had been down since: within the misfire grace, each fires); the soak
test lets a real per-minute schedule run for several minutes of kills."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

import parley
from parley.schemas import tables as t
from tests.support.chaos import CHAOS_REDIS_URL
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import Fleet, flush_redis
from tests.support.helpers import Control

pytestmark = pytest.mark.postgres

ECHO = [{"when": ".*", "steps": [{"text": "ran: {last_message}"}]}]
ROUNDS = 3
SLOTS_BACK = 3


def kill(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


def rewind(client: parley.Client, schedule_id: str, minutes: int) -> list[datetime]:
    """The schedule's next slot ``minutes`` minutes back; the slots now due."""
    first = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes)
    with client.store.engine.begin() as db:
        db.execute(update(t.schedules).where(t.schedules.c.id == schedule_id).values(next_at=first))
    return [first + timedelta(minutes=n) for n in range(minutes + 1)]


def check_exactly_once(
    client: parley.Client, schedule: parley.Schedule, expected: list[datetime], timeout: float
) -> None:
    """Each expected slot fired once, with a turn of its own that finished once, and the
    schedule's session has those turns and no other."""
    deadline = time.monotonic() + timeout
    runs = schedule.runs(limit=1000)
    while len(runs) < len(expected) and time.monotonic() < deadline:
        time.sleep(0.2)
        runs = schedule.runs(limit=1000)
    assert sorted(r.at for r in runs) == sorted(expected), runs
    assert {r.status for r in runs} == {parley.SlotStatus.FIRED}, runs
    turn_ids = [r.turn_id for r in runs]
    assert None not in turn_ids and len(set(turn_ids)) == len(turn_ids)
    for turn_id in turn_ids:
        assert turn_id is not None
        result = client.attach(turn_id).wait(timeout=max(1.0, deadline - time.monotonic()))
        assert result.outcome is parley.TurnStatus.FINISHED, result
    with client.store.engine.connect() as db:
        turns = db.execute(
            select(func.count())
            .select_from(t.turns)
            .where(t.turns.c.session_id == schedule.session_id)
        ).scalar_one()
        attempts = db.execute(
            select(t.runs.c.turn_id, t.runs.c.attempts).where(t.runs.c.turn_id.in_(turn_ids))
        ).all()
    assert turns == len(expected)
    assert len(attempts) == len(expected)


def test_two_beats_and_kills_fire_each_slot_exactly_once(workspace: Path) -> None:
    with fresh_postgres_database("schedules_fleet") as url:
        flush_redis(CHAOS_REDIS_URL)
        fleet = Fleet(database_url=url, redis_url=CHAOS_REDIS_URL)
        worker = fleet.start_worker(2, "threads")
        beats = [fleet.start_beat(), fleet.start_beat()]
        rng = random.Random(46)
        try:
            fleet.wait_ready()
            Control(workspace).script(ECHO)
            with fleet.client() as client:
                for round_ in range(ROUNDS):
                    session = client.open_session(workspace)
                    schedule = client.schedule(
                        "* * * * *",
                        f"round {round_}",
                        session_id=session.id,
                        overlap="enqueue",
                        priority="interactive",
                    )
                    expected = rewind(client, schedule.id, SLOTS_BACK)
                    # Both beats' timers look four times a second: the kill lands
                    # before, during or after a firing's transaction.
                    time.sleep(rng.uniform(0.0, 0.4))
                    kill(beats.pop(rng.randrange(len(beats))))
                    time.sleep(rng.uniform(0.2, 1.0))  # the turns run: the worker goes
                    kill(worker)
                    flush_redis(CHAOS_REDIS_URL)
                    worker = fleet.start_worker(2, "threads")
                    beats.append(fleet.start_beat())
                    check_exactly_once(client, schedule, expected, timeout=90)
                    schedule.delete()
        finally:
            fleet.stop()


@pytest.mark.soak
@pytest.mark.skipif(
    not os.environ.get("PARLEY_SCHEDULE_SOAK_MINUTES"),
    reason="minutes long, out of the default run: PARLEY_SCHEDULE_SOAK_MINUTES=6 runs it "
    "(the fast test above runs the same kills on rewound slots)",
)
@pytest.mark.timeout(3600)
def test_a_per_minute_schedule_fires_every_slot_once_through_minutes_of_kills(
    workspace: Path,
) -> None:
    minutes = int(os.environ["PARLEY_SCHEDULE_SOAK_MINUTES"])
    with fresh_postgres_database("schedules_soak") as url:
        flush_redis(CHAOS_REDIS_URL)
        fleet = Fleet(database_url=url, redis_url=CHAOS_REDIS_URL)
        worker = fleet.start_worker(2, "threads")
        beats = [fleet.start_beat(), fleet.start_beat()]
        rng = random.Random()
        try:
            fleet.wait_ready()
            Control(workspace).script(ECHO)
            with fleet.client() as client:
                session = client.open_session(workspace)
                schedule = client.schedule(
                    "* * * * *",
                    "tick",
                    session_id=session.id,
                    overlap="enqueue",
                    priority="interactive",
                )
                first = schedule.next_at
                assert first is not None
                end = first + timedelta(minutes=minutes - 1)
                while datetime.now(UTC) < end + timedelta(seconds=2):
                    # Around each slot (a minute's turn), a beat or the worker goes.
                    seconds = (datetime.now(UTC).second + rng.uniform(-1.5, 1.5)) % 60
                    time.sleep(max(0.0, 60 - seconds))
                    if rng.random() < 0.5:
                        kill(beats.pop(rng.randrange(len(beats))))
                        beats.append(fleet.start_beat())
                    else:
                        kill(worker)
                        if rng.random() < 0.5:
                            flush_redis(CHAOS_REDIS_URL)
                        worker = fleet.start_worker(2, "threads")
                schedule.pause()
                expected = [first + timedelta(minutes=n) for n in range(minutes)]
                fired = [r.at for r in schedule.runs(limit=1000)]
                check_exactly_once(client, schedule, sorted(a for a in fired if a <= end), 120)
                assert sorted(a for a in fired if a <= end) == expected
        finally:
            fleet.stop()
