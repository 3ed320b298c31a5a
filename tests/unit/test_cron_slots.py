"""A schedule's slots against zoneinfo, around the daylight-saving days of several zones
(docs/time.md#schedules): every instant a schedule fires at shows a local time the cron
names (or is the end of a gap that swallowed one), and no instant whose local time the
cron names is passed over, but the second showing of a repeated local time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.errors import InvalidRequest
from parley.schemas.cron_slots import check_cron, next_slot, slots_between, zone_of

ZONES = [
    "Europe/Paris",
    "America/New_York",
    "Australia/Lord_Howe",  # a 30-minute change
    "America/Santiago",  # changes at midnight
    "Asia/Kolkata",  # none
    "UTC",
]


def _transitions(zone: ZoneInfo, year: int) -> list[datetime]:
    """The UTC instants in ``year`` at which ``zone``'s offset changes, to the minute."""
    found = []
    hour = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC)
    while hour < end:
        later = hour + timedelta(hours=1)
        if hour.astimezone(zone).utcoffset() != later.astimezone(zone).utcoffset():
            minute = hour
            while minute.astimezone(zone).utcoffset() == hour.astimezone(zone).utcoffset():
                minute += timedelta(minutes=1)
            found.append(minute)
        hour = later
    return found


TRANSITIONS = {name: _transitions(ZoneInfo(name), 2026) for name in ZONES}


@st.composite
def _starts(draw: st.DrawFn) -> tuple[str, datetime]:
    """A zone and a UTC instant within a day of one of its transitions (or any time in
    a zone that has none)."""
    name = draw(st.sampled_from(ZONES))
    changes = TRANSITIONS[name] or [datetime(2026, 6, 1, tzinfo=UTC)]
    around = draw(st.sampled_from(changes))
    seconds = draw(st.integers(min_value=-26 * 3600, max_value=3 * 3600))
    return name, around + timedelta(seconds=seconds)


MINUTES = st.sets(st.integers(0, 59), min_size=1, max_size=4)
HOURS = st.one_of(st.none(), st.sets(st.integers(0, 23), min_size=1, max_size=4))


def _field(values: set[int] | None) -> str:
    return "*" if values is None else ",".join(str(v) for v in sorted(values))


def _names(minutes: set[int], hours: set[int] | None, local: datetime) -> bool:
    """The oracle: whether the cron ``minutes hours * * *`` names the wall time ``local``."""
    return local.minute in minutes and (hours is None or local.hour in hours)


@settings(max_examples=150, deadline=None)
@given(start=_starts(), minutes=MINUTES, hours=HOURS)
def test_slots_fire_once_at_every_named_local_time(
    start: tuple[str, datetime], minutes: set[int], hours: set[int] | None
) -> None:
    name, after = start
    zone = ZoneInfo(name)
    cron = f"{_field(minutes)} {_field(hours)} * * *"
    slot = next_slot(cron, zone, after)
    assert slot > after
    assert slot.tzinfo is not None and slot.utcoffset() == timedelta(0)
    local = slot.astimezone(zone)
    # Every minute strictly between: its local time is not named, or it is a repeated
    # time's second showing, or a gap's time (a slot then falls on the gap's end).
    minute = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while minute < slot:
        shown = minute.astimezone(zone)
        assert not _names(minutes, hours, shown) or shown.fold == 1 or _repeated(shown, zone), (
            f"{cron} in {name}: {shown} passed over on the way to {local}"
        )
        minute += timedelta(minutes=1)
    if not _names(minutes, hours, local):
        # Only the end of a gap may fire for a time it swallowed.
        before = (slot - timedelta(minutes=1)).astimezone(zone)
        assert before.utcoffset() != local.utcoffset(), f"{cron} in {name}: {local} unnamed"
        skipped = local.replace(tzinfo=None) - (local.utcoffset() - before.utcoffset())  # type: ignore[operator]
        wall = skipped
        gap_named = False
        while wall < local.replace(tzinfo=None):
            gap_named = gap_named or _names(minutes, hours, wall)
            wall += timedelta(minutes=1)
        assert gap_named, f"{cron} in {name}: {local} fired for no time of the gap"


def _repeated(shown: datetime, zone: ZoneInfo) -> bool:
    """Whether the wall time ``shown`` shows (fold 1) a second time: its first showing
    fired, earlier."""
    first = shown.replace(fold=0)
    return first.astimezone(UTC) != shown.astimezone(UTC)


@settings(max_examples=60, deadline=None)
@given(start=_starts(), minutes=MINUTES, hours=HOURS)
def test_no_instant_fires_twice(
    start: tuple[str, datetime], minutes: set[int], hours: set[int] | None
) -> None:
    name, after = start
    zone = ZoneInfo(name)
    cron = f"{_field(minutes)} {_field(hours)} * * *"
    slots = slots_between(cron, zone, after, after + timedelta(hours=30))
    assert slots == sorted(set(slots))
    walls = [s.astimezone(zone).replace(tzinfo=None) for s in slots]
    assert len(walls) == len(set(walls)), f"{cron} in {name}: a local time fired twice"


@pytest.mark.parametrize(
    ("name", "cron", "after", "expected_local"),
    [
        # Paris springs forward at 02:00 to 03:00: 02:30 that day fires at 03:00, once.
        ("Europe/Paris", "30 2 * * *", "2026-03-28T12:00:00+00:00", ["2026-03-29T03:00+02:00"]),
        # …and falls back at 03:00 to 02:00: 02:30 fires at its first showing only.
        ("Europe/Paris", "30 2 * * *", "2026-10-24T12:00:00+00:00", ["2026-10-25T02:30+02:00"]),
        # Lord Howe moves by half an hour: 02:15 that day does not exist.
        (
            "Australia/Lord_Howe",
            "15 2 * * *",
            "2026-10-03T00:00:00+00:00",
            ["2026-10-04T02:30+11:00"],
        ),
        (
            "America/New_York",
            "0 9 * * 1-5",
            "2026-03-06T15:00:00+00:00",
            ["2026-03-09T09:00-04:00"],
        ),
        ("Asia/Kolkata", "0 9 * * *", "2026-03-29T00:00:00+00:00", ["2026-03-29T09:00+05:30"]),
    ],
)
def test_daylight_saving_days(name: str, cron: str, after: str, expected_local: list[str]) -> None:
    zone = ZoneInfo(name)
    slot = next_slot(cron, zone, datetime.fromisoformat(after))
    assert [slot.astimezone(zone).isoformat(timespec="minutes")] == expected_local
    # croniter alone, handed aware times, fires the autumn's repeated hour twice: the
    # correction is what makes it once (this fails on croniter's own arithmetic).
    autumn = slots_between(
        "*/30 * * * *",
        ZoneInfo("Europe/Paris"),
        datetime(2026, 10, 24, 23, 0, tzinfo=UTC),
        datetime(2026, 10, 25, 2, 0, tzinfo=UTC),
    )
    walls = [s.astimezone(ZoneInfo("Europe/Paris")).strftime("%H:%M") for s in autumn]
    assert walls == ["01:30", "02:00", "02:30", "03:00"]


@pytest.mark.parametrize(
    "cron", ["", "* * * *", "* * * * * *", "61 * * * *", "a b c d e", "0 0 31 2 *", 5, None]
)
def test_bad_cron_is_refused(cron: object) -> None:
    with pytest.raises(InvalidRequest):
        check_cron(cron)


@pytest.mark.parametrize("zone", ["", "Mars/Olympus", "../etc/passwd", 3, "Europe/Paris "])
def test_unknown_zone_is_refused(zone: object) -> None:
    with pytest.raises(InvalidRequest):
        zone_of(zone)


def test_well_formed_crons_are_kept() -> None:
    assert check_cron("0  9 * *  1-5") == "0 9 * * 1-5"
    assert zone_of("Europe/Paris") == ZoneInfo("Europe/Paris")
