"""Schedules as callers hold them (docs/time.md#schedules): ``client.schedule(cron,
prompt, …)`` returns a :class:`Schedule`; the checks of a schedule's parts, which the
client, the gateway and the command line share, run before anything is written."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from parley.client_runtime import Runtime
from parley.errors import InvalidRequest
from parley.schemas.cron_slots import check_cron, zone_of
from parley.schemas.schedules import (
    DEFAULT_MISFIRE_GRACE_SECONDS,
    Overlap,
    ScheduleRecord,
    ScheduleRun,
)
from parley.validation import (
    MAX_PROMPT_BYTES,
    check_id,
    check_priority,
    check_text,
    check_title,
)

MAX_MISFIRE_GRACE_SECONDS = 366 * 24 * 3600


@dataclass(frozen=True, kw_only=True)
class ScheduleRequest:
    """A schedule's parts, checked (:func:`checked_request`)."""

    cron: str
    timezone: str
    prompt: str
    session_id: str | None
    root: str | None
    tenant: str | None
    priority: str
    overlap: Overlap
    name: str | None
    misfire_grace_seconds: int


def check_overlap(value: Any) -> Overlap:
    """``value`` as an :class:`Overlap`, else :class:`InvalidRequest` listing them."""
    try:
        return Overlap(value)
    except ValueError:
        raise InvalidRequest(
            f"overlap must be one of {[o.value for o in Overlap]}, not {value!r}"
        ) from None


def check_paused(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"paused must be true or false, not {value!r}")
    return value


def checked_request(  # noqa: PLR0913 (a schedule's parts, by keyword, as asked)
    cron: Any,
    prompt: Any,
    *,
    timezone: Any = "UTC",
    session_id: Any = None,
    root: Any = None,
    tenant: Any = None,
    priority: Any = "batch",
    overlap: Any = "skip",
    name: Any = None,
    misfire_grace: Any = DEFAULT_MISFIRE_GRACE_SECONDS,
) -> ScheduleRequest:
    """Every part checked, :class:`InvalidRequest` naming the first that is wrong.
    Without ``session_id`` each firing opens a session on ``root`` (by default the
    working directory, an existing one); with it, ``root`` is the session's own."""
    cron_text = check_cron(cron)
    zone_of(timezone)
    text = check_text(prompt, "prompt", MAX_PROMPT_BYTES)
    if session_id is not None:
        check_id(session_id)
        if root is not None:
            raise InvalidRequest("root is for a schedule that opens a session each firing")
        root_path = None
    else:
        root_path = _checked_root(os.getcwd() if root is None else root)
    if tenant is not None and (not isinstance(tenant, str) or not 0 < len(tenant) <= 64):
        raise InvalidRequest("tenant must be a non-empty string of at most 64 characters")
    lane = check_priority(priority) if isinstance(priority, str) else check_priority(str(priority))
    if name is not None:
        check_title(name)
    return ScheduleRequest(
        cron=cron_text,
        timezone=timezone,
        prompt=text,
        session_id=session_id,
        root=root_path,
        tenant=tenant,
        priority=lane,
        overlap=check_overlap(overlap),
        name=name,
        misfire_grace_seconds=_grace_seconds(misfire_grace),
    )


def _checked_root(root: Any) -> str:
    given = os.fspath(root) if isinstance(root, (str, os.PathLike)) else None
    if not isinstance(given, str) or not given or "\0" in given:
        raise InvalidRequest(f"root must be a directory's path (a non-empty str), not {root!r}")
    path = os.path.realpath(given)
    if not os.path.isdir(path):
        raise InvalidRequest(f"root {given!r} is not a directory")
    return path


def _grace_seconds(value: Any) -> int:
    """The misfire grace (a timedelta or seconds) in whole seconds, at least one."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or not 1 <= seconds <= MAX_MISFIRE_GRACE_SECONDS
    ):
        raise InvalidRequest(
            f"misfire_grace must be between 1 second and a year (seconds or a timedelta), "
            f"not {value!r}"
        )
    return int(seconds)


class Schedule:
    """A schedule (docs/time.md#schedules): its ``id``, its ``next_at`` (the next slot,
    in UTC; None while paused), :meth:`pause`, :meth:`resume`, :meth:`delete` and
    :meth:`runs` (each slot dealt with: fired, skipped or missed)."""

    def __init__(self, runtime: Runtime, record: ScheduleRecord) -> None:
        self._runtime = runtime
        self._record = record

    @property
    def id(self) -> str:
        return self._record.schedule_id

    @property
    def name(self) -> str | None:
        return self._record.name

    @property
    def cron(self) -> str:
        return self._record.cron

    @property
    def timezone(self) -> str:
        return self._record.timezone

    @property
    def prompt(self) -> str:
        return self._record.prompt

    @property
    def session_id(self) -> str | None:
        return self._record.session_id

    @property
    def overlap(self) -> Overlap:
        return self._record.overlap

    @property
    def paused(self) -> bool:
        """Whether it is paused (as last read)."""
        return self._record.paused

    @property
    def next_at(self) -> datetime | None:
        """The next slot in UTC, read now (a firing moves it on); None while paused."""
        return self.record().next_at

    def record(self) -> ScheduleRecord:
        """The schedule as stored now (:class:`ScheduleNotFound` once deleted)."""
        self._record = self._runtime.store.get_schedule(self.id)
        return self._record

    def pause(self) -> None:
        """Fire nothing until :meth:`resume` (the slots meanwhile are not recorded)."""
        self._runtime.check_open()
        self._record = self._runtime.store.update_schedule(self.id, paused=True)

    def resume(self) -> None:
        """Fire again, from the first slot after now."""
        self._runtime.check_open()
        self._record = self._runtime.store.update_schedule(self.id, paused=False)

    def delete(self) -> None:
        """Delete it, and the record of its slots (the turns it fired stay)."""
        self._runtime.check_open()
        self._runtime.store.delete_schedule(self.id)

    def runs(self, limit: int = 100) -> list[ScheduleRun]:
        """Its slots dealt with, in order (the last ``limit``): each one's ``at``,
        ``status`` (``fired``, ``skipped``, ``missed``) and ``turn_id`` (None unless
        fired)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= 10_000:
            raise InvalidRequest("limit must be an integer from 1 to 10000")
        return self._runtime.store.schedule_runs(self.id, limit=limit)

    def __repr__(self) -> str:
        return f"<parley.Schedule {self.id} {self.cron!r} {self.timezone}>"
