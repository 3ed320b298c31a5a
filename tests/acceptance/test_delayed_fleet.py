"""Delayed turns on a fleet that loses everything but the database while they wait
(docs/time.md#how-it-starts-on-time): the worker SIGKILLed and Redis emptied (every
lock, every queued kick, the broker's counted-down kicks among them), two ``parley
beat`` processes releasing due turns at once.  Each turn still starts once, no earlier
than its time, and finishes."""

from __future__ import annotations

import os
import signal
from datetime import UTC
from pathlib import Path

import pytest
from sqlalchemy import select

import parley
from parley.schemas import tables as t
from tests.support.chaos import CHAOS_REDIS_URL
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import Fleet, flush_redis
from tests.support.helpers import Control

pytestmark = pytest.mark.postgres

ECHO = [{"when": ".*", "steps": [{"text": "ran: {last_message}"}]}]
TURNS = 12


def test_delayed_turns_start_once_on_time_after_the_worker_and_redis_are_lost(
    workspace: Path,
) -> None:
    with fresh_postgres_database("delayed_fleet") as url:
        flush_redis(CHAOS_REDIS_URL)
        fleet = Fleet(database_url=url, redis_url=CHAOS_REDIS_URL)
        first = fleet.start_worker(2, "threads")
        fleet.start_beat()
        fleet.start_beat()  # two of them: each due turn is released and started once
        try:
            fleet.wait_ready()
            Control(workspace).script(ECHO)
            with fleet.client() as client:
                sessions = [client.open_session(workspace) for _ in range(TURNS // 2)]
                handles = [
                    sessions[n % len(sessions)].submit(f"turn {n}", after=4 + n * 0.25)
                    for n in range(TURNS)
                ]
                asked = {h.turn_id: h.record().not_before for h in handles}
                # Everything but the database goes while they wait.
                os.killpg(first.pid, signal.SIGKILL)
                first.wait(10)
                flush_redis(CHAOS_REDIS_URL)
                fleet.start_worker(2, "threads")
                for handle in handles:
                    result = handle.wait(timeout=60)
                    assert result.outcome is parley.TurnStatus.FINISHED, result
                    assert result.reply == f"ran: {handle.record().prompt}"
                with client.store.engine.connect() as db:
                    runs = db.execute(
                        select(t.runs.c.turn_id, t.runs.c.started_at, t.runs.c.attempts)
                    ).all()
            assert len(runs) == TURNS
            for run in runs:
                started = run.started_at.replace(tzinfo=run.started_at.tzinfo or UTC)
                not_before = asked[run.turn_id]
                assert not_before is not None and started >= not_before, run
                assert run.attempts == 1, run  # started once, by one worker
        finally:
            fleet.stop()
