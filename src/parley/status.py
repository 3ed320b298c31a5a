"""``parley status``: the fleet's state for an operator, read from where it lives.

The database says what work there is (queued, running and waiting turns, the oldest in
line) and who claimed each running turn; Redis says whether a running turn's driver
still holds its session's lock (a running turn nobody holds is stranded: the sweeper
re-kicks it); and the workers themselves answer over the broker (Celery's remote
control: the queues each consumes), which is what "live" means for a worker.  An
embedded deployment (SQLite, or a database without ``PARLEY_REDIS_URL``) has no Redis
and no workers: its turns run in the process that submits them.  A part that cannot be
reached is reported, not fatal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.engine import make_url

from parley.coordination.redis_admission import AdmissionUnreachable, RedisAdmission
from parley.coordination.redis_coordinator import RedisCoordinator
from parley.deployment import fleet_redis_url
from parley.engine.call_admission import AdmissionSettings
from parley.fleet.app import BROKER_ERRORS, create_app
from parley.fleet.settings import FleetSettings
from parley.ports.admission import ModelUse
from parley.schemas.records import TurnStatus
from parley.settings import Settings
from parley.store.database import check_migrated, normalise_url
from parley.store.schedules import ScheduleCounts
from parley.store.sql_store import SqlStore
from parley.store.status import UNFINISHED, AgentWork, LaneWork, UnfinishedTurn, UnfinishedWork

DEFAULT_PING_SECONDS = 1.0
LISTED = 20
"""How many turns of each status the report lists (it counts them all)."""


@dataclass(frozen=True, kw_only=True)
class FleetStatus:
    """What ``parley status`` reports (:meth:`to_json` is its ``--json`` form)."""

    deployment: str
    """``fleet`` or ``embedded``."""
    database: str
    redis: str | None
    redis_reachable: bool | None
    work: UnfinishedWork
    at: datetime
    stranded: frozenset[str]
    """Sessions of running turns that no driver holds (and no kick is on its way to)."""
    workers: tuple[str, ...] | None
    """The workers that answered and consume the fleet's queue, by Celery node name
    (None: embedded)."""
    workers_error: str | None = None
    lanes: tuple[LaneWork, ...] = ()
    """Unfinished turns by tenant and priority, and those waiting for capacity."""
    models: tuple[ModelUse, ...] = ()
    """Each known model's use of its provider limits (docs/admission.md)."""
    agents: AgentWork = field(default_factory=AgentWork)
    """Sub-agents at work: child turns running and waiting, parents waiting for them."""
    schedules: ScheduleCounts | None = None
    """The schedules (docs/time.md#schedules): how many, paused, the soonest slot and
    the slots missed."""

    def to_json(self) -> dict[str, Any]:
        """The report as JSON: every count, the listed turns, Redis and the workers."""
        oldest = self.oldest_queued
        return {
            "deployment": self.deployment,
            "database": self.database,
            "turns": {status.value: self.work.counts[status] for status in UNFINISHED},
            "oldest_queued": None
            if oldest is None
            else {
                "turn_id": oldest.turn_id,
                "session_id": oldest.session_id,
                "age_seconds": round(self._age(oldest.queued_at), 3),
            },
            **{
                status.value: [self._turn(turn) for turn in self.work.turns[status]]
                for status in UNFINISHED
            },
            "redis": None
            if self.redis is None
            else {"url": self.redis, "reachable": bool(self.redis_reachable)},
            "workers": None
            if self.workers is None and self.workers_error is None
            else {"live": list(self.workers or ()), "error": self.workers_error},
            "lanes": [
                {
                    "tenant": lane.tenant,
                    "priority": lane.priority,
                    "unfinished": lane.unfinished,
                    "waiting_capacity": lane.waiting_capacity,
                    "delayed": lane.delayed,
                    "next_due": None if lane.next_due is None else lane.next_due.isoformat(),
                    "waiting_event": lane.waiting_event,
                    "event_deadline": None
                    if lane.event_deadline is None
                    else lane.event_deadline.isoformat(),
                }
                for lane in self.lanes
            ],
            "models": [_model_json(use) for use in self.models],
            "agents": self.agents.to_json(),
            "schedules": None if self.schedules is None else _schedules_json(self.schedules),
        }

    def lines(self) -> list[str]:
        """The report as text, one line each."""
        counts = self.work.counts
        where = self.database if self.redis is None else f"{self.database}, Redis {self.redis}"
        lines = [f"{self.deployment}: {where}"]
        if self.deployment == "embedded":
            lines.append(
                "embedded: no Redis and no workers; turns run in the process that submits them"
            )
        elif not self.redis_reachable:
            lines.append("Redis does not answer: whether running turns have a driver is unknown")
        lines.append(
            "turns: " + ", ".join(f"{counts[status]} {status.value}" for status in UNFINISHED)
        )
        agents = self.agents
        if agents.running or agents.waiting or agents.parents_waiting:
            lines.append(
                f"agents: {agents.running} running, {agents.waiting} waiting to run; "
                f"{agents.parents_waiting} turn(s) waiting for their agents"
            )
        oldest = self.oldest_queued
        if oldest is not None:
            lines.append(
                f"oldest queued: {self._age(oldest.queued_at):.1f} s "
                f"(turn {oldest.turn_id}, session {oldest.session_id})"
            )
        if self.workers_error is not None:
            lines.append(f"workers: unknown ({self.workers_error})")
        elif self.workers is not None:
            names = f": {', '.join(self.workers)}" if self.workers else ""
            lines.append(f"workers: {len(self.workers)} live{names}")
        lines.extend(_lane_lines(self.lanes))
        if self.schedules is not None and self.schedules.schedules:
            lines.append(_schedules_line(self.schedules))
        lines.extend(_model_line(use) for use in self.models)
        for status in UNFINISHED:
            listed = self.work.turns[status]
            if listed:
                more = counts[status] - len(listed)
                lines.append(f"{status.value}:" + (f" (the first {len(listed)})" if more else ""))
                lines.extend(f"  {self._describe(turn)}" for turn in listed)
        return lines

    @property
    def oldest_queued(self) -> UnfinishedTurn | None:
        """The queued turn first in line (None if nothing is queued)."""
        queued = self.work.turns[TurnStatus.QUEUED]
        return queued[0] if queued else None

    def _age(self, since: datetime) -> float:
        return max((self.at - since).total_seconds(), 0.0)

    def _turn(self, turn: UnfinishedTurn) -> dict[str, Any]:
        found: dict[str, Any] = {
            "turn_id": turn.turn_id,
            "session_id": turn.session_id,
            "steps": turn.steps,
            "attempts": turn.attempts,
            "queued_seconds": round(self._age(turn.queued_at), 3),
        }
        if turn.status is TurnStatus.RUNNING:
            found["worker"] = turn.worker
            found["driven"] = None if self.redis is None else turn.session_id not in self.stranded
        if turn.status is TurnStatus.WAITING and turn.asked_at is not None:
            found["waiting_seconds"] = round(self._age(turn.asked_at), 3)
        if turn.event is not None or turn.until is not None:
            found["event"] = turn.event
            found["until"] = None if turn.until is None else turn.until.isoformat()
        return found

    def _describe(self, turn: UnfinishedTurn) -> str:
        head = f"turn {turn.turn_id} of session {turn.session_id}"
        if turn.status is TurnStatus.QUEUED:
            return f"{head}: {self._age(turn.queued_at):.1f} s in line"
        if turn.status is TurnStatus.WAITING and (turn.event or turn.until):
            what = f"event {turn.event}" if turn.event else "a time"
            until = f" (until {turn.until.isoformat()})" if turn.until else ""
            return f"{head}: {turn.steps} steps, waiting for {what}{until}"
        if turn.status is TurnStatus.WAITING:
            since = turn.asked_at or turn.queued_at
            return f"{head}: {turn.steps} steps, an answer asked {self._age(since):.1f} s ago"
        line = f"{head}: on {turn.worker}, {turn.steps} steps, attempt {turn.attempts}"
        if self.redis is not None and turn.session_id in self.stranded:
            line += " (no live driver: the sweeper re-kicks it)"
        return line


def _lane_lines(lanes: tuple[LaneWork, ...]) -> list[str]:
    """One line per tenant and lane with unfinished turns."""
    if not any(
        lane.priority == "batch" or lane.waiting_capacity or lane.delayed or lane.waiting_event
        for lane in lanes
    ):
        return []  # interactive only, nothing throttled, delayed or waiting for an event
    return ["by tenant and priority:"] + [
        f"  {lane.tenant or '(no tenant)'} {lane.priority}: {lane.unfinished} unfinished, "
        f"{lane.waiting_capacity} waiting for capacity"
        + (
            f", {lane.delayed} waiting for a time (the next at {lane.next_due.isoformat()})"
            if lane.delayed and lane.next_due is not None
            else ""
        )
        + (
            f", {lane.waiting_event} waiting for an event"
            + (
                f" (the soonest deadline at {lane.event_deadline.isoformat()})"
                if lane.event_deadline is not None
                else ""
            )
            if lane.waiting_event
            else ""
        )
        for lane in lanes
    ]


def _schedules_line(counts: ScheduleCounts) -> str:
    """The schedules on one line: how many, paused, the next slot, the slots missed."""
    line = f"schedules: {counts.schedules}"
    if counts.paused:
        line += f" ({counts.paused} paused)"
    if counts.next_at is not None:
        line += f", the next slot at {counts.next_at.isoformat()}"
    return line + f", {counts.missed} slot(s) missed"


def _schedules_json(counts: ScheduleCounts) -> dict[str, Any]:
    return {
        "schedules": counts.schedules,
        "paused": counts.paused,
        "next_at": None if counts.next_at is None else counts.next_at.isoformat(),
        "missed": counts.missed,
    }


def _model_line(use: ModelUse) -> str:
    """A model's use of its limits, on one line."""
    if use.limits is None:
        head = f"model {use.model}: no limit known"
    else:
        parts = []
        if use.limits.rpm and use.requests_available is not None:
            parts.append(f"{use.requests_available:.0f} requests free of {use.limits.rpm} rpm")
        if use.limits.tpm and use.tokens_available is not None:
            parts.append(f"{use.tokens_available:.0f} tokens free of {use.limits.tpm} tpm")
        source = "configured" if use.limits != use.learned else "learned from its provider"
        head = f"model {use.model} ({source}): " + ", ".join(parts)
    if use.slowed < 1:
        head += f"; slowed to {use.slowed:.0%} after 429s"
    if use.blocked_seconds > 0:
        head += f"; blocked {use.blocked_seconds:.1f} s more by a retry-after"
    if use.waiting_tenants:
        head += "; batch waiting: " + ", ".join(
            f"{tenant or '(no tenant)'} (next in {seconds:.1f} s)"
            for tenant, seconds in sorted(use.waiting_tenants.items())
        )
    return head


def _model_json(use: ModelUse) -> dict[str, Any]:
    return {
        "model": use.model,
        "limits": None if use.limits is None else {"rpm": use.limits.rpm, "tpm": use.limits.tpm},
        "learned": use.learned is not None and use.limits == use.learned,
        "requests_available": use.requests_available,
        "tokens_available": use.tokens_available,
        "slowed": use.slowed,
        "blocked_seconds": use.blocked_seconds,
        "waiting_tenants": dict(use.waiting_tenants),
    }


def fleet_status(
    database_url: str,
    settings: Settings,
    *,
    ping_seconds: float = DEFAULT_PING_SECONDS,
) -> FleetStatus:
    """The state of the deployment on ``database_url``: a fleet when it is not SQLite
    and ``PARLEY_REDIS_URL`` is set (as for the gateway), else embedded."""
    store = SqlStore.from_url(database_url, pooler=settings.database_pooler)
    try:
        check_migrated(store.engine)  # else the first read's SQL error, lines of it
        work = store.unfinished_work(LISTED)
        lanes = tuple(store.work_by_lane())
        agents = store.agent_work()
        schedules = store.schedule_counts()
        fleet = fleet_redis_url(store.engine.dialect.name, None, settings) is not None
    finally:
        store.close()
    at = datetime.now(UTC)
    database = _shown(database_url)
    if not fleet:
        return FleetStatus(
            deployment="embedded",
            database=database,
            redis=None,
            redis_reachable=None,
            work=work,
            at=at,
            stranded=frozenset(),
            workers=None,
            lanes=lanes,
            agents=agents,
            schedules=schedules,
        )
    fleet_settings = FleetSettings.from_settings(replace(settings, database_url=database_url))
    reachable, stranded = _drivers(fleet_settings.redis_url, work)
    workers, error = _live_workers(fleet_settings, ping_seconds)
    return FleetStatus(
        deployment="fleet",
        database=database,
        redis=_shown(fleet_settings.redis_url),
        redis_reachable=reachable,
        work=work,
        at=at,
        stranded=stranded,
        workers=workers,
        workers_error=error,
        lanes=lanes,
        models=_model_uses(fleet_settings.redis_url, settings),
        agents=agents,
        schedules=schedules,
    )


def _model_uses(redis_url: str, settings: Settings) -> tuple[ModelUse, ...]:
    """Each model's admission state: those ``PARLEY_MODEL_LIMITS`` names (their
    configured limits in force) and those Redis holds state for; none if Redis does not
    answer (said above)."""
    configured = AdmissionSettings.from_settings(settings).model_limits
    admission = RedisAdmission(redis_url)
    try:
        models = sorted({*configured, *admission.models()})
        uses = admission.use(models)
    except AdmissionUnreachable:
        return ()
    finally:
        admission.close()
    return tuple(
        replace(use, limits=configured[use.model]) if use.model in configured else use
        for use in uses
    )


def _drivers(redis_url: str, work: UnfinishedWork) -> tuple[bool, frozenset[str]]:
    """Whether Redis answers, and the sessions of running turns no driver holds."""
    coordinator = RedisCoordinator(redis_url)
    try:
        if not coordinator.ping():
            return False, frozenset()
        running = sorted({t.session_id for t in work.turns[TurnStatus.RUNNING]})
        try:
            return True, frozenset(coordinator.unattended(running) if running else ())
        except Exception:
            return False, frozenset()
    finally:
        coordinator.close()


def _live_workers(
    settings: FleetSettings, seconds: float
) -> tuple[tuple[str, ...] | None, str | None]:
    """The workers that answer within ``seconds`` and consume the fleet's queue, by
    node name (a broker may serve other queues' workers too); or why none could be
    asked."""
    app = create_app(settings)
    try:
        replies = app.control.inspect(timeout=seconds).active_queues() or {}
    except BROKER_ERRORS as exc:
        return None, f"the broker does not answer: {type(exc).__name__}: {exc}"
    finally:
        app.close()
    return tuple(
        sorted(
            name
            for name, queues in replies.items()
            if any(queue.get("name") == settings.queue for queue in queues or ())
        )
    ), None


def _shown(url: str) -> str:
    """``url`` without its password."""
    try:
        if "://" in url and url.split("://", 1)[0].startswith(("redis", "rediss", "amqp")):
            parts = urlsplit(url)
            if parts.password:
                host = parts.netloc.rsplit("@", 1)[1]
                user = parts.username or ""
                parts = parts._replace(netloc=f"{user}:***@{host}")
            return urlunsplit(parts)
        return make_url(normalise_url(url)).render_as_string(hide_password=True)
    except Exception:
        return "(unparseable URL)"
