"""A schedule's slots: the instants a five-field cron expression names in an IANA time
zone, daylight-saving days included (docs/time.md#schedules).

croniter reads the cron and walks the local wall clock; zoneinfo says what each local
time is in UTC.  croniter is given naive wall times on purpose: handed aware ones, it
fires twice in the hour a zone repeats in the autumn (``02:20`` and ``02:20``, fold 1),
where a schedule fires once.  Walking the wall clock naively and mapping each time to
UTC here makes both daylight-saving rules one small function (:func:`_instant`):

* a local time that does not exist that day (the spring gap) fires once, at the next
  valid minute (the gap's end: ``03:00`` in Paris for ``02:30``), however many of the
  cron's times fall in the gap;
* a local time that exists twice (the autumn repeat) fires once, at its first
  occurrence.

The instants are non-decreasing in the wall times they come from, so the next slot
after an instant is the first mapped time past it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from parley.schemas.errors import InvalidRequest

_MINUTE = timedelta(minutes=1)
_LONGEST_GAP_MINUTES = 24 * 60
"""How far past a local time that does not exist the next valid minute is looked for
(real gaps are an hour at most, but a zone that skipped a whole day once exists)."""


def zone_of(name: object) -> ZoneInfo:
    """The IANA zone ``name``; :class:`InvalidRequest` if it is not one."""
    if not isinstance(name, str) or not name or len(name) > 100:
        raise InvalidRequest(f"timezone must be an IANA zone name, not {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidRequest(f"unknown timezone {name!r} (an IANA name: Europe/Paris)") from exc


def check_cron(cron: object) -> str:
    """``cron`` if it is a five-field cron expression (minute, hour, day of month,
    month, day of week), else :class:`InvalidRequest`."""
    if not isinstance(cron, str) or len(cron) > 200:
        raise InvalidRequest(f"cron must be a five-field cron expression, not {cron!r}")
    fields = cron.split()
    if len(fields) != 5:
        raise InvalidRequest(
            f"cron must have five fields (minute hour day-of-month month day-of-week), "
            f"not {len(fields)}: {cron!r}"
        )
    if not croniter.is_valid(cron):
        raise InvalidRequest(f"not a valid cron expression: {cron!r}")
    try:
        # is_valid accepts some that cannot be walked (a 31st of February).
        croniter(cron, datetime(2000, 1, 1)).get_next(datetime)
    except Exception as exc:
        raise InvalidRequest(f"cron {cron!r} names no time ({exc})") from exc
    return " ".join(fields)


def next_slot(cron: str, zone: ZoneInfo, after: datetime) -> datetime:
    """The first slot of ``cron`` in ``zone`` strictly after ``after`` (aware), in UTC."""
    if after.tzinfo is None:
        raise ValueError("after must be an aware datetime")
    wall = after.astimezone(zone).replace(tzinfo=None, fold=0)
    # From a minute before: a wall time in the autumn's repeated hour maps to its first
    # occurrence, which may be before ``after``; the loop skips those.
    walk = croniter(cron, wall - _MINUTE)
    while True:
        candidate = _instant(walk.get_next(datetime), zone)
        if candidate > after:
            return candidate


def slots_between(cron: str, zone: ZoneInfo, after: datetime, until: datetime) -> list[datetime]:
    """Every slot strictly after ``after`` and no later than ``until``, in order."""
    found: list[datetime] = []
    slot = next_slot(cron, zone, after)
    while slot <= until:
        found.append(slot)
        slot = next_slot(cron, zone, slot)
    return found


def _instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The UTC instant of the naive local ``wall`` time: its first occurrence if the
    zone repeats it, the next valid minute if the zone skips it (the module docstring)."""
    first = wall.replace(tzinfo=zone, fold=0)
    if _exists(first, zone):
        return first.astimezone(UTC)
    later = wall
    for _ in range(_LONGEST_GAP_MINUTES):
        later += _MINUTE
        local = later.replace(tzinfo=zone, fold=0)
        if _exists(local, zone):
            return local.astimezone(UTC)
    return first.astimezone(UTC)  # (no zone skips a day and more: kept total anyway)


def _exists(local: datetime, zone: ZoneInfo) -> bool:
    """Whether the aware wall time ``local`` is a time the zone's clocks show."""
    back = local.astimezone(UTC).astimezone(zone)
    return back.replace(tzinfo=None) == local.replace(tzinfo=None)
