"""The store's side of schedules (docs/time.md#schedules), on both databases: each due
slot is claimed by its row in the transaction that submits its turn, so however many
processes fire at once a slot fires once; a slot later than the misfire grace is
recorded missed; ``overlap`` skips, enqueues or interrupts; a firing without a session
opens one of the schedule's tenant's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import func, select, update

from parley.coordination.local_coordinator import LocalCoordinator
from parley.metrics_export import exposition
from parley.runtime.schedule_firing import count_schedules, fire_due_schedules
from parley.schemas import tables as t
from parley.schemas.errors import ScheduleNotFound, SessionNotFound
from parley.schemas.records import TurnStatus
from parley.schemas.schedules import Overlap, SlotStatus
from parley.settings import Settings
from parley.status import fleet_status
from parley.store.schedules import Fired
from parley.store.sql_store import SqlStore
from tests.integration.drive import migrated_store, new_session, start
from tests.support.scrape import parse

pytestmark = pytest.mark.postgres

PARIS = ZoneInfo("Europe/Paris")
KOLKATA = ZoneInfo("Asia/Kolkata")


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    with migrated_store(db_url) as opened:
        yield opened


def make(
    store: SqlStore,
    *,
    session_id: str | None = None,
    overlap: Overlap = Overlap.ENQUEUE,
    grace: int = 3600,
    cron: str = "* * * * *",
    tenant: str | None = None,
    priority: str = "batch",
) -> str:
    return store.create_schedule(
        cron=cron,
        timezone="Europe/Paris",
        prompt="summarise",
        session_id=session_id,
        root=None if session_id else "/tmp",
        tenant=tenant,
        priority=priority,
        overlap=overlap,
        name="digest",
        misfire_grace_seconds=grace,
    ).schedule_id


def rewind(store: SqlStore, schedule_id: str, minutes: int) -> list[datetime]:
    """Move the schedule's next slot ``minutes`` whole minutes back: as if every beat
    had been down since.  Returns the slots now due (a per-minute schedule's)."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    first = now - timedelta(minutes=minutes)
    with store.db.tx() as db:
        db.execute(update(t.schedules).where(t.schedules.c.id == schedule_id).values(next_at=first))
    return [first + timedelta(minutes=i) for i in range(minutes + 1)]


def fire(store: SqlStore, schedule_id: str) -> Fired:
    fired = store.fire_schedule(schedule_id)
    assert fired is not None
    return fired


def test_a_new_schedule_waits_for_its_first_slot_in_its_zone(store: SqlStore) -> None:
    schedule = store.create_schedule(
        cron="0 9 * * *",
        timezone="Europe/Paris",
        prompt="p",
        session_id=None,
        root="/tmp",
        tenant="acme",
        priority="batch",
        overlap=Overlap.SKIP,
        name=None,
        misfire_grace_seconds=3600,
    )
    assert schedule.next_at is not None and schedule.next_at > datetime.now(UTC)
    assert schedule.next_at.astimezone(PARIS).hour == 9
    assert schedule.schedule_id not in store.due_schedules()
    assert store.fire_schedule(schedule.schedule_id) is None
    assert schedule.schedule_id in [s.schedule_id for s in store.list_schedules("acme")]
    assert schedule.schedule_id not in [s.schedule_id for s in store.list_schedules("other")]
    with pytest.raises(ScheduleNotFound):
        store.get_schedule(schedule.schedule_id, tenant="other")


def test_each_due_slot_fires_once_with_a_turn_of_its_session(store: SqlStore) -> None:
    session = new_session(store)
    schedule_id = make(store, session_id=session)
    slots = rewind(store, schedule_id, 2)
    assert schedule_id in store.due_schedules()
    fired = fire(store, schedule_id)
    assert [f.slot_at for f in fired.firings] == slots
    assert {f.session_id for f in fired.firings} == {session}
    # Done: not due, and firing again fires nothing.
    assert schedule_id not in store.due_schedules()
    assert store.fire_schedule(schedule_id) is None
    runs = store.schedule_runs(schedule_id)
    assert [r.at for r in runs] == slots  # in order
    assert [r.at for r in store.schedule_runs(schedule_id, limit=2)] == slots[-2:]  # the last
    assert {r.status for r in runs} == {SlotStatus.FIRED}
    assert sorted(r.turn_id for r in runs if r.turn_id) == sorted(f.turn_id for f in fired.firings)
    turns = [store.get_turn(f.turn_id) for f in fired.firings]
    assert {turn.status for turn in turns} == {TurnStatus.QUEUED}
    next_at = store.get_schedule(schedule_id).next_at
    assert next_at is not None and next_at > slots[-1]


def test_a_slot_already_claimed_is_not_fired_again(store: SqlStore) -> None:
    session = new_session(store)
    schedule_id = make(store, session_id=session)
    slots = rewind(store, schedule_id, 1)
    first = fire(store, schedule_id)
    assert len(first.firings) == len(slots)
    # Its next slot put back (a crash between two beats' looks, a hand-edited row):
    # the slots' rows are there, so nothing fires twice.
    rewind(store, schedule_id, 1)
    again = fire(store, schedule_id)
    assert again.firings == () and again.skipped == 0 and again.missed == 0
    assert len(store.schedule_runs(schedule_id)) == len(slots)


def test_a_slot_later_than_the_grace_is_recorded_missed(store: SqlStore) -> None:
    schedule_id = make(store, grace=150)
    slots = rewind(store, schedule_id, 5)
    fired = fire(store, schedule_id)
    runs = {r.at: r for r in store.schedule_runs(schedule_id)}
    assert sorted(runs) == slots
    late = [s for s in slots if datetime.now(UTC) - s > timedelta(seconds=150)]
    assert late and all(runs[s].status is SlotStatus.MISSED for s in late)
    assert all(runs[s].turn_id is None for s in late)
    assert fired.missed == len(late)
    assert [f.slot_at for f in fired.firings] == [s for s in slots if s not in late]
    assert store.schedule_counts().missed >= len(late)


def test_overlap_skip_records_the_slots_whose_previous_turn_runs(store: SqlStore) -> None:
    session = new_session(store)
    schedule_id = make(store, session_id=session, overlap=Overlap.SKIP)
    slots = rewind(store, schedule_id, 2)
    fired = fire(store, schedule_id)
    # The first fires; its turn is still queued at the next two: skipped.
    assert [f.slot_at for f in fired.firings] == slots[:1]
    assert fired.skipped == 2
    statuses = {r.at: r.status for r in store.schedule_runs(schedule_id)}
    assert [statuses[s] for s in slots] == [
        SlotStatus.FIRED,
        SlotStatus.SKIPPED,
        SlotStatus.SKIPPED,
    ]


def test_overlap_interrupt_stops_the_previous_firings_turn(store: SqlStore) -> None:
    schedule_id = make(store, overlap=Overlap.INTERRUPT, priority="interactive")
    rewind(store, schedule_id, 0)
    first = fire(store, schedule_id).firings[0]
    start(store, first.session_id)  # its turn runs
    rewind(store, schedule_id, 0)  # (its slot is claimed: nothing)
    with store.db.tx() as db:  # the next slot due now
        db.execute(
            update(t.schedules)
            .where(t.schedules.c.id == schedule_id)
            .values(next_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    second = fire(store, schedule_id).firings[0]
    assert second.session_id != first.session_id  # each firing opens a session
    assert [turn_id for turn_id, _steer in second.interrupted] == [first.turn_id]


def test_a_firing_without_a_session_opens_one_of_the_tenants(store: SqlStore) -> None:
    schedule_id = make(store, tenant="acme")
    rewind(store, schedule_id, 1)
    firings = fire(store, schedule_id).firings
    sessions = {f.session_id for f in firings}
    assert len(sessions) == 2
    for session_id in sessions:
        session = store.get_session(session_id)
        assert session.tenant == "acme"
        assert session.metadata["schedule_id"] == schedule_id


def test_firing_into_a_session_that_is_gone_pauses_the_schedule(store: SqlStore) -> None:
    session = new_session(store)
    schedule_id = make(store, session_id=session)
    with store.db.tx() as db:  # (as a prune would: the schedule outlives its session)
        db.execute(
            update(t.schedules).where(t.schedules.c.id == schedule_id).values(session_id="0" * 36)
        )
    rewind(store, schedule_id, 0)
    fired = fire(store, schedule_id)
    assert fired.firings == () and fired.missed == 1
    record = store.get_schedule(schedule_id)
    assert record.paused and record.next_at is None


def test_a_schedule_of_an_unknown_session_is_refused(store: SqlStore) -> None:
    before = store.list_schedules()
    with pytest.raises(SessionNotFound):
        make(store, session_id="0" * 36)
    assert store.list_schedules() == before


def test_pause_resume_and_delete(store: SqlStore) -> None:
    schedule_id = make(store)
    paused = store.update_schedule(schedule_id, paused=True)
    assert paused.paused and paused.next_at is None
    rewind(store, schedule_id, 0)  # (paused: no slot is due, whatever next_at said)
    store.update_schedule(schedule_id, paused=True)
    resumed = store.update_schedule(schedule_id, paused=False)
    assert resumed.next_at is not None and resumed.next_at > datetime.now(UTC)
    changed = store.update_schedule(schedule_id, cron="30 4 * * *", timezone="Asia/Kolkata")
    assert changed.next_at is not None
    assert changed.next_at.astimezone(KOLKATA).strftime("%H:%M") == "04:30"
    store.delete_schedule(schedule_id)
    with pytest.raises(ScheduleNotFound):
        store.get_schedule(schedule_id)


def test_two_processes_firing_at_once_fire_each_slot_once(db_url: str) -> None:
    with migrated_store(db_url) as store:
        session = new_session(store)
        schedule_id = make(store, session_id=session)
        slots = rewind(store, schedule_id, 3)
    results: list[Fired | None] = []
    barrier = threading.Barrier(4, timeout=30)
    stores = [SqlStore.from_url(db_url) for _ in range(4)]

    def fire_from_a_store_of_its_own(own: SqlStore) -> None:
        barrier.wait()
        results.append(own.fire_schedule(schedule_id))

    threads = [threading.Thread(target=fire_from_a_store_of_its_own, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for own in stores:
        own.close()
    assert len(results) == 4
    fired = [f for result in results if result is not None for f in result.firings]
    assert sorted(f.slot_at for f in fired) == slots
    with migrated_store(db_url) as store:
        with store.db.tx() as db:
            turns = db.execute(
                select(func.count()).select_from(t.turns).where(t.turns.c.session_id == session)
            ).scalar_one()
        assert turns == len(slots)


def test_status_counts_schedules_paused_next_and_missed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'status.db'}"
    with migrated_store(url) as store:
        missing = make(store, grace=1)
        rewind(store, missing, 2)
        late = fire(store, missing).missed  # (more than a second late)
        assert late >= 2
        paused = make(store)
        store.update_schedule(paused, paused=True)
        next_at = store.get_schedule(missing).next_at
    report = fleet_status(url, Settings.from_environment({}))
    assert report.schedules is not None
    assert report.to_json()["schedules"] == {
        "schedules": 2,
        "paused": 1,
        "next_at": next_at.isoformat() if next_at else None,
        "missed": late,
    }
    assert (
        f"schedules: 2 (1 paused), the next slot at {next_at.isoformat() if next_at else None}, "
        f"{late} slot(s) missed"
    ) in report.lines()


def test_firing_and_the_sweeps_count_show_in_the_metrics(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'metrics.db'}"
    with migrated_store(url) as store:
        schedule_id = make(store, grace=1)
        rewind(store, schedule_id, 2)
        before = parse(exposition()[0].decode())
        kicked: list[tuple[str, str]] = []
        firings = fire_due_schedules(
            store, LocalCoordinator(), lambda session, lane: kicked.append((session, lane))
        )
        count_schedules(store)
        after = parse(exposition()[0].decode())
        counts = store.schedule_counts()
    assert kicked == [(f.session_id, "batch") for f in firings]
    fired = after.value("parley_schedule_slots_total", status="fired") - before.value(
        "parley_schedule_slots_total", status="fired"
    )
    missed = after.value("parley_schedule_slots_total", status="missed") - before.value(
        "parley_schedule_slots_total", status="missed"
    )
    assert (fired, missed) == (len(firings), counts.missed)
    assert fired + missed == 3
    assert after.value("parley_schedules") == 1
    assert after.value("parley_schedule_missed_slots") == counts.missed
    assert 0 < after.value("parley_schedule_next_seconds") <= 60
