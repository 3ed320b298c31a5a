"""Schedules from Python (docs/time.md#schedules), on every deployment: a schedule is
stored with its next slot in its zone; when its slot comes, whatever fires slots there
(beat on the fleet, the client's recovery thread embedded) submits its prompt once, as
a turn of its session or of a session of its own, and the turn runs; pause, resume,
delete and the list behave; bad input is refused and stores nothing."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import update

import parley
from parley.errors import InvalidRequest, ScheduleNotFound, SessionNotFound
from parley.schemas import tables as t
from tests.acceptance.conftest import ClientFactory
from tests.support.deployments import ALL, on_deployments

pytestmark = on_deployments(*ALL)

ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}


def due_now(client: parley.Client, schedule: parley.Schedule, seconds_ago: float = 1) -> None:
    """Make the schedule's next slot a moment ago (as if its time had just come)."""
    with client.store.engine.begin() as db:
        db.execute(
            update(t.schedules)
            .where(t.schedules.c.id == schedule.id)
            .values(next_at=datetime.now(UTC) - timedelta(seconds=seconds_ago))
        )


def fired_runs(
    schedule: parley.Schedule, count: int, timeout: float = 30
) -> list[parley.ScheduleRun]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = schedule.runs()
        if len(runs) >= count:
            return runs
        time.sleep(0.1)
    raise AssertionError(f"{count} slot(s) did not fire in {timeout}s: {schedule.runs()}")


def test_a_slot_fires_once_as_a_turn_of_its_session(
    make_client: ClientFactory, workspace: Path
) -> None:
    client = make_client([ECHO])
    session = client.open_session(workspace)
    schedule = client.schedule(
        "0 9 * * 1-5",
        "summarise yesterday's tickets",
        timezone="Europe/Paris",
        session_id=session.id,
        priority="interactive",
        name="tickets",
    )
    next_at = schedule.next_at
    assert next_at is not None and next_at > datetime.now(UTC)
    local = next_at.astimezone(ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute) == (9, 0) and local.weekday() < 5
    assert schedule.id in [s.id for s in client.schedules()]

    due_now(client, schedule)
    [run] = fired_runs(schedule, 1)
    assert run.status is parley.SlotStatus.FIRED and run.turn_id is not None
    result = client.attach(run.turn_id).wait(timeout=30)
    assert result.reply == "heard: summarise yesterday's tickets"
    assert client.attach(run.turn_id).record().session_id == session.id
    # Once: its next slot is the next weekday's nine o'clock, and nothing else fired.
    time.sleep(1.0)
    assert len(schedule.runs()) == 1
    later = schedule.next_at
    assert later is not None and later > datetime.now(UTC)


def test_without_a_session_each_firing_opens_one(
    make_client: ClientFactory, workspace: Path
) -> None:
    client = make_client([ECHO])
    schedule = client.schedule(
        "*/5 * * * *", "check the queue", root=workspace, priority="interactive"
    )
    due_now(client, schedule)
    [run] = fired_runs(schedule, 1)
    assert run.turn_id is not None
    turn = client.attach(run.turn_id)
    assert turn.wait(timeout=30).reply == "heard: check the queue"
    opened = client.session(turn.record().session_id)
    assert opened.root == str(workspace.resolve())


def test_pause_resume_and_delete(make_client: ClientFactory, workspace: Path) -> None:
    client = make_client([ECHO])
    schedule = client.schedule("* * * * *", "tick", root=workspace)
    schedule.pause()
    assert schedule.paused and schedule.next_at is None
    schedule.resume()
    resumed = schedule.next_at
    assert not schedule.paused and resumed is not None and resumed > datetime.now(UTC)
    schedule.delete()
    assert schedule.id not in [s.id for s in client.schedules()]
    with pytest.raises(ScheduleNotFound):
        schedule.record()


@pytest.mark.parametrize(
    ("cron", "options"),
    [
        ("61 * * * *", {}),
        ("* * * *", {}),
        ("* * * * * *", {}),
        ("* * * * *", {"timezone": "Mars/Olympus"}),
        ("* * * * *", {"overlap": "sometimes"}),
        ("* * * * *", {"priority": "urgent"}),
        ("* * * * *", {"misfire_grace": -1}),
        ("* * * * *", {"root": "/no/such/dir"}),
        ("* * * * *", {"session_id": "s", "root": "/tmp"}),
    ],
)
def test_bad_input_is_refused_and_stores_nothing(
    make_client: ClientFactory, cron: str, options: dict[str, object]
) -> None:
    client = make_client([ECHO])
    before = [s.id for s in client.schedules()]
    with pytest.raises(InvalidRequest):
        client.schedule(cron, "p", **options)  # type: ignore[arg-type]
    assert [s.id for s in client.schedules()] == before


def test_a_schedule_of_an_unknown_session_is_refused(make_client: ClientFactory) -> None:
    client = make_client([ECHO])
    before = [s.id for s in client.schedules()]
    with pytest.raises(SessionNotFound):
        client.schedule("* * * * *", "p", session_id="0" * 36)
    assert [s.id for s in client.schedules()] == before


def test_a_scheduled_turns_end_goes_to_its_sessions_webhook(
    make_client: ClientFactory, workspace: Path
) -> None:
    # Its end is put in the webhook outbox as every turn's is (delivered by whatever
    # delivers them: docs/operations.md; the signing secret is the deployment's).
    client = make_client([ECHO])
    session = client.open_session(workspace, webhook_url="https://hooks.example/parley")
    schedule = client.schedule(
        "0 * * * *", "on the hour", session_id=session.id, priority="interactive"
    )
    due_now(client, schedule)
    [run] = fired_runs(schedule, 1)
    assert run.turn_id is not None
    result = client.attach(run.turn_id).wait(timeout=30)
    deliveries = session.webhook_deliveries()
    assert [(d.turn_id, d.outcome) for d in deliveries] == [(run.turn_id, result.outcome.value)]
    assert deliveries[0].url == "https://hooks.example/parley"
