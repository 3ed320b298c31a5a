"""Delayed turns (docs/time.md#delayed-turns), on every deployment: a turn submitted
with ``at`` or ``after`` is stored at once, queued with its ``not_before`` and
``waiting_for: "time"``, starts no earlier than its time, holds nothing meanwhile (the
other sessions' turns run past it), and keeps its place in its session's line; an
interrupt ends it at once; bad times are refused and store nothing."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select

import parley
from parley.errors import InvalidRequest
from parley.kickers import EmbeddedKicker, FleetKicker
from parley.schemas import tables as t
from parley.schemas.records import Waiting
from tests.acceptance.conftest import ClientFactory
from tests.support.deployments import ALL, on_deployments

pytestmark = on_deployments(*ALL)

ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
DELAY = 2.0


def started_at(client: parley.Client, turn_id: str) -> datetime | None:
    """When the turn's run was first claimed, as the store recorded it."""
    with client.store.engine.connect() as db:
        value = db.execute(
            select(t.runs.c.started_at).where(t.runs.c.turn_id == turn_id)
        ).scalar_one()
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def test_a_delayed_turn_is_stored_at_once_and_starts_no_earlier_than_its_time(
    make_client: ClientFactory, workspace: Path
) -> None:
    client = make_client([ECHO])
    session = client.open_session(workspace)
    before = datetime.now(UTC)
    handle = session.submit("later, please", after=DELAY)

    record = handle.record()
    assert record.status is parley.TurnStatus.QUEUED
    assert record.waiting_for is Waiting.TIME
    assert record.not_before is not None
    assert before + timedelta(seconds=DELAY) <= record.not_before
    assert record.not_before <= datetime.now(UTC) + timedelta(seconds=DELAY)
    # Listed as it is stored, from any reader.
    assert [turn.waiting_for for turn in session.tree()] == [Waiting.TIME]

    result = handle.wait(timeout=30)
    assert result.outcome is parley.TurnStatus.FINISHED
    assert result.reply == "heard: later, please"
    began = started_at(client, handle.turn_id)
    assert began is not None and began >= record.not_before
    ended = handle.record()
    assert ended.waiting_for is None and ended.not_before is None


def test_at_takes_an_aware_time_in_any_zone(make_client: ClientFactory, workspace: Path) -> None:
    client = make_client([ECHO])
    session = client.open_session(workspace)
    paris = ZoneInfo("Europe/Paris")
    when = (datetime.now(UTC) + timedelta(seconds=DELAY)).astimezone(paris)
    handle = session.submit("at a time", at=when)
    assert handle.record().not_before == when
    assert handle.wait(timeout=30).outcome is parley.TurnStatus.FINISHED
    began = started_at(client, handle.turn_id)
    assert began is not None and began >= when


def test_a_delayed_turn_holds_its_sessions_line_and_nothing_else(
    make_client: ClientFactory, workspace: Path
) -> None:
    client = make_client([ECHO])
    session = client.open_session(workspace)
    delayed = session.submit("first, later", after=DELAY)
    behind = session.submit("second, at once")
    # Other sessions run while it waits: it holds no worker and no lock.
    far = [client.open_session(workspace).submit(f"far {i}", after=3600) for i in range(4)]
    others = [client.open_session(workspace).submit(f"now {i}") for i in range(4)]
    for other in others:
        assert other.wait(timeout=30).outcome is parley.TurnStatus.FINISHED
    assert behind.record().status is parley.TurnStatus.QUEUED
    assert delayed.record().status is parley.TurnStatus.QUEUED

    assert delayed.wait(timeout=30).outcome is parley.TurnStatus.FINISHED
    assert behind.wait(timeout=30).outcome is parley.TurnStatus.FINISHED
    # In the session's order: the turn behind hangs under the delayed one.
    assert behind.record().parent_id == delayed.turn_id
    first, second = started_at(client, delayed.turn_id), started_at(client, behind.turn_id)
    assert first is not None and second is not None and first <= second

    # An interrupt ends a delayed turn now, not at its time.
    for handle in far:
        assert handle.record().status is parley.TurnStatus.QUEUED
        handle.interrupt()
    for handle in far:
        assert handle.wait(timeout=30).outcome is parley.TurnStatus.CANCELLED


@pytest.mark.parametrize(
    ("at", "after", "says"),
    [
        (datetime(2030, 1, 1, 9, 0), None, "time zone"),
        (None, -1, "non-negative"),
        (None, math.nan, "finite"),
        (None, math.inf, "finite"),
        (None, True, "number"),
        (None, "60", "number"),
        ("2030-01-01T09:00:00Z", None, "datetime"),
        (datetime.now(UTC), 5, "not both"),
    ],
)
def test_a_bad_time_is_refused_and_stores_nothing(
    make_client: ClientFactory, workspace: Path, at: object, after: object, says: str
) -> None:
    client = make_client([ECHO])
    session = client.open_session(workspace)
    with pytest.raises(InvalidRequest, match=says):
        session.submit("never", at=at, after=after)  # type: ignore[arg-type]
    assert session.tree() == []
    # The session takes a turn afterwards as if nothing had been asked.
    assert session.submit("now").wait(timeout=30).outcome is parley.TurnStatus.FINISHED


def test_a_delayed_turn_whose_timer_is_lost_is_started_by_the_sweep(
    make_client: ClientFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No timer of this process and no kick counted down by the broker: the release of
    # due runs (beat's sweep; the embedded recovery thread) is what starts it.
    monkeypatch.setattr(EmbeddedKicker, "kick_at", lambda *_args, **_kwargs: None)
    monkeypatch.setattr(FleetKicker, "kick_at", lambda *_args, **_kwargs: None)
    client = make_client([ECHO])
    handle = client.open_session(workspace).submit("no timer", after=1.0)
    not_before = handle.record().not_before
    assert handle.wait(timeout=30).outcome is parley.TurnStatus.FINISHED
    began = started_at(client, handle.turn_id)
    assert began is not None and not_before is not None and began >= not_before
