"""What parley counts for Prometheus, and the calls that count it.

Every metric is declared once, in :data:`METRICS` (name, type, labels, help: the table
in docs/operations.md is checked against it), and recorded through the functions below,
which the driver, the emitter, the tool runner, the sweeper, the client and the
gateway's feeds call at the one place each thing happens.  Recording never fails a
turn: an exception in instrumentation is swallowed, and logged once per function.

prometheus_client is imported when a process first records or serves, not when this
module is imported: the library decides once, at its import, whether values live in
memory or in files under ``PROMETHEUS_MULTIPROC_DIR`` (what a Celery prefork worker
needs, so that its main process can serve the sum over its pool), and a worker's main
process sets that directory up before its pool forks (:mod:`parley.metrics_export`).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec

from parley.schemas.records import TurnStatus
from parley.telemetry import exemplars

if TYPE_CHECKING:
    from parley.ports.backend import ClaimedTurn
    from parley.schemas.messages import StepPayload

log = logging.getLogger("parley.metrics")

Kind = Literal["counter", "gauge", "histogram"]

# Seconds: from a few milliseconds (a warm fleet's queue) to an hour (a long agent turn).
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

UNKNOWN_TOOL = "unknown"
"""The ``tool`` label of a call naming a tool the host does not have: the model chooses
that name, and a label must not take any value a model makes up."""


@dataclass(frozen=True, kw_only=True)
class MetricSpec:
    """One metric: its name as exposed (a counter's with ``_total``), its type, labels
    and help text."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def base(self) -> str:
        """The name prometheus_client is given (a counter's without ``_total``)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        name="parley_turns_submitted_total",
        kind="counter",
        help="Turns submitted by this process (a repeated request_id is not counted).",
    ),
    MetricSpec(
        name="parley_turns_started_total",
        kind="counter",
        help="Claims of a turn by a driver, by how it starts: new (its first), resume "
        "(after a resume), takeover (cut off mid-turn elsewhere), answers (its "
        "approvals are in).",
        labels=("start",),
    ),
    MetricSpec(
        name="parley_turns_ended_total",
        kind="counter",
        help="Turns that ended here, by outcome.",
        labels=("outcome",),
    ),
    MetricSpec(
        name="parley_queue_wait_seconds",
        kind="histogram",
        help="Seconds from a turn's submission to its first claim by a driver.",
        buckets=_LATENCY_BUCKETS,
    ),
    MetricSpec(
        name="parley_turn_duration_seconds",
        kind="histogram",
        help="Seconds from the claim of the attempt that ended a turn to its end, by outcome.",
        labels=("outcome",),
        buckets=_DURATION_BUCKETS,
    ),
    MetricSpec(
        name="parley_first_token_latency_seconds",
        kind="histogram",
        help="Seconds from a driver's claim of a turn to the first token it streamed.",
        buckets=_LATENCY_BUCKETS,
    ),
    MetricSpec(
        name="parley_steps_total",
        kind="counter",
        help="Steps committed.",
    ),
    MetricSpec(
        name="parley_tool_calls_total",
        kind="counter",
        help="Tool calls given a result (run, failed or refused), by tool.",
        labels=("tool",),
    ),
    MetricSpec(
        name="parley_refusals_total",
        kind="counter",
        help="Tool calls refused (by the policy, the approver or a person), by rule.",
        labels=("rule",),
    ),
    MetricSpec(
        name="parley_tokens_total",
        kind="counter",
        help="Model tokens of committed steps, by model and direction (input, output).",
        labels=("model", "direction"),
    ),
    MetricSpec(
        name="parley_crash_takeovers_total",
        kind="counter",
        help="Turns claimed while still running under a driver that died or lost its session.",
    ),
    MetricSpec(
        name="parley_sweeper_kicks_total",
        kind="counter",
        help="Sessions the sweeper kicked (work with no live driver).",
    ),
    MetricSpec(
        name="parley_turns_in_flight",
        kind="gauge",
        help="Turns a driver of this process (or worker) is running now.",
    ),
    MetricSpec(
        name="parley_sse_connections",
        kind="gauge",
        help="Event streams (every protocol's) this gateway is serving now.",
    ),
    MetricSpec(
        name="parley_sse_connections_opened_total",
        kind="counter",
        help="Event streams this gateway has opened.",
    ),
    MetricSpec(
        name="parley_model_calls_total",
        kind="counter",
        help="Model calls admitted and answered, by model and priority: the requests of "
        "each model's capacity used.",
        labels=("model", "priority"),
    ),
    MetricSpec(
        name="parley_model_call_tokens_total",
        kind="counter",
        help="Tokens (input and output) the answered calls used, by model: the tokens of "
        "each model's capacity used.",
        labels=("model",),
    ),
    MetricSpec(
        name="parley_model_limit",
        kind="gauge",
        help="Each model's limit in force (configured or learned from its provider), by "
        "unit: rpm or tpm.",
        labels=("model", "unit"),
    ),
    MetricSpec(
        name="parley_admission_waits_total",
        kind="counter",
        help="Model calls that waited for capacity, by model, priority and how: slot (a "
        "short wait holding the worker slot) or let_go (the turn let its session go).",
        labels=("model", "priority", "how"),
    ),
    MetricSpec(
        name="parley_admission_wait_seconds",
        kind="histogram",
        help="Seconds a model call was told to wait for capacity, by model and priority.",
        labels=("model", "priority"),
        buckets=_LATENCY_BUCKETS,
    ),
    MetricSpec(
        name="parley_provider_rate_limited_total",
        kind="counter",
        help="429s that still came from a model's provider (each slows that model's "
        "admission fleet-wide for a while).",
        labels=("model",),
    ),
    MetricSpec(
        name="parley_turns_waiting_capacity",
        kind="gauge",
        help="Turns waiting for provider capacity now, by tenant and priority (counted "
        "by the sweeper from the store).",
        labels=("tenant", "priority"),
    ),
    MetricSpec(
        name="parley_agent_turns",
        kind="gauge",
        help="Sub-agents' child turns now, by state: running, or waiting (queued, or "
        "waiting for a place among their step's); counted by the sweeper from the store.",
        labels=("state",),
    ),
    MetricSpec(
        name="parley_turns_waiting_agents",
        kind="gauge",
        help="Turns whose step waits for its agent calls' child turns now, holding no "
        "worker (counted by the sweeper from the store).",
    ),
    MetricSpec(
        name="parley_turns_waiting_event",
        kind="gauge",
        help="Turns waiting for an event (a signal or a time) now, by tenant (counted by "
        "the sweeper from the store).",
        labels=("tenant",),
    ),
    MetricSpec(
        name="parley_schedule_slots_total",
        kind="counter",
        help="Schedules' slots dealt with by this process, by status (fired, skipped, missed).",
        labels=("status",),
    ),
    MetricSpec(
        name="parley_schedules",
        kind="gauge",
        help="Schedules in the store (counted by the sweeper).",
    ),
    MetricSpec(
        name="parley_schedules_paused",
        kind="gauge",
        help="Paused schedules in the store (counted by the sweeper).",
    ),
    MetricSpec(
        name="parley_schedule_next_seconds",
        kind="gauge",
        help="Seconds until the soonest schedule's next slot (negative: late; counted by "
        "the sweeper).",
    ),
    MetricSpec(
        name="parley_schedule_missed_slots",
        kind="gauge",
        help="Slots recorded missed, every schedule's (counted by the sweeper).",
    ),
)

_BUCKETS = {spec.name: spec.buckets for spec in METRICS if spec.kind == "histogram"}


class _Instruments:
    """This process's prometheus_client metrics, by name (built on first use)."""

    def __init__(self) -> None:
        import prometheus_client

        self.by_name: dict[str, Any] = {}
        for spec in METRICS:
            options: dict[str, Any] = {"labelnames": spec.labels}
            if spec.kind == "counter":
                metric: Any = prometheus_client.Counter(spec.base, spec.help, **options)
            elif spec.kind == "gauge":
                # Summed over the live processes of a multiprocess worker; a pool process
                # that died stops counting (parley.metrics_export prunes its file).
                metric = prometheus_client.Gauge(
                    spec.base, spec.help, multiprocess_mode="livesum", **options
                )
            else:
                metric = prometheus_client.Histogram(
                    spec.base, spec.help, buckets=spec.buckets, **options
                )
            self.by_name[spec.name] = metric

    def __getitem__(self, name: str) -> Any:
        return self.by_name[name]


_instruments: _Instruments | None = None
_building = threading.Lock()


def instruments() -> _Instruments:
    """This process's metrics, registered in prometheus_client's default registry on
    first use (prometheus_client is imported then)."""
    global _instruments
    if _instruments is None:
        with _building:
            if _instruments is None:
                _instruments = _Instruments()
    return _instruments


def built() -> bool:
    """Whether this process has made its metrics yet."""
    return _instruments is not None


_P = ParamSpec("_P")
_failed: set[str] = set()


def _never_fails(record: Callable[_P, None]) -> Callable[_P, None]:
    """``record``, with any exception it raises swallowed: logged the first time only,
    so a broken metrics directory cannot flood the log either."""

    @functools.wraps(record)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            record(*args, **kwargs)
        except Exception:
            if record.__name__ not in _failed:
                _failed.add(record.__name__)
                log.warning(
                    "metrics: %s failed (logged once; turns are unaffected)",
                    record.__name__,
                    exc_info=True,
                )

    return guarded


# ---------------------------------------------------------------------------- recording


@_never_fails
def turn_submitted() -> None:
    """A submission created a turn."""
    instruments()["parley_turns_submitted_total"].inc()


def start_of(claimed: ClaimedTurn) -> str:
    """How a claim starts its turn (the ``start`` label): new, resume, takeover, answers."""
    if claimed.run.attempts == 0:
        return "new"
    if claimed.previous_status == TurnStatus.RUNNING:
        return "takeover"
    held = claimed.run.held_step
    if held is not None and not held.get("resumed"):
        return "answers"  # (a held step marked resumed: the turn's resume, docs/sub-agents.md)
    return "resume"


def _timed(name: str, seconds: float, **labels: str) -> None:
    """Observe a latency, with the current trace as the bucket's exemplar (tracing on)."""
    histogram = instruments()[name]
    child = histogram.labels(**labels) if labels else histogram
    exemplars.observe(child, name, labels, _BUCKETS[name], seconds)


@_never_fails
def _turn_claimed(claimed: ClaimedTurn) -> None:
    m = instruments()
    start = start_of(claimed)
    m["parley_turns_started_total"].labels(start=start).inc()
    if start == "takeover":
        m["parley_crash_takeovers_total"].inc()
    if start == "new":
        # Wall clocks, the submitter's and this one's: a skew below zero reads as none.
        waited = (datetime.now(UTC) - claimed.turn.created_at).total_seconds()
        _timed("parley_queue_wait_seconds", max(waited, 0.0))
    m["parley_turns_in_flight"].inc()


@_never_fails
def _turn_let_go() -> None:
    instruments()["parley_turns_in_flight"].dec()


@_never_fails
def turn_ended(outcome: str, seconds: float) -> None:
    """A turn ended with ``outcome`` (a terminal status), ``seconds`` after the claim
    of the attempt that ended it.  Counted before its ``end`` event is published, so
    that whoever sees the end sees it counted."""
    m = instruments()
    m["parley_turns_ended_total"].labels(outcome=outcome).inc()
    _timed("parley_turn_duration_seconds", seconds, outcome=outcome)


class Driving:
    """A driver's run of one claimed turn: counted as started (and how) as the ``with``
    block begins, and in flight until it ends, however it ends (the turn's end, a wait
    for answers, a lost session).  The end itself is counted where it is published
    (:func:`turn_ended`)."""

    def __init__(self, claimed: ClaimedTurn) -> None:
        self._claimed = claimed

    def __enter__(self) -> Driving:
        _turn_claimed(self._claimed)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        _turn_let_go()


@_never_fails
def first_token(seconds: float) -> None:
    """A turn attempt streamed its first token ``seconds`` after its claim."""
    _timed("parley_first_token_latency_seconds", seconds)


@_never_fails
def step_committed(payload: StepPayload) -> None:
    """A step committed: counted, and its tokens charged to its model."""
    m = instruments()
    m["parley_steps_total"].inc()
    tokens = m["parley_tokens_total"]
    model = payload.model or "unknown"
    if payload.usage.input_tokens:
        tokens.labels(model=model, direction="input").inc(payload.usage.input_tokens)
    if payload.usage.output_tokens:
        tokens.labels(model=model, direction="output").inc(payload.usage.output_tokens)


@_never_fails
def tool_called(tool: str) -> None:
    """A tool call got its result (``tool``: the host's name for it, or
    :data:`UNKNOWN_TOOL`)."""
    instruments()["parley_tool_calls_total"].labels(tool=tool).inc()


@_never_fails
def refused(rule: str) -> None:
    """A tool call was refused by ``rule``."""
    instruments()["parley_refusals_total"].labels(rule=rule).inc()


@_never_fails
def sweeper_kicked(sessions: int) -> None:
    """A sweep kicked ``sessions`` sessions."""
    if sessions:
        instruments()["parley_sweeper_kicks_total"].inc(sessions)


@_never_fails
def schedule_slots(status: str, slots: int) -> None:
    """This process dealt with ``slots`` slots of schedules, ``status`` each."""
    if slots:
        instruments()["parley_schedule_slots_total"].labels(status=status).inc(slots)


@_never_fails
def schedules_now(schedules: int, paused: int, next_seconds: float | None, missed: int) -> None:
    """The store's schedules now (the sweeper's count): how many, paused, the seconds
    to the soonest slot (0 with none) and the slots missed."""
    instruments()["parley_schedules"].set(schedules)
    instruments()["parley_schedules_paused"].set(paused)
    instruments()["parley_schedule_next_seconds"].set(next_seconds or 0.0)
    instruments()["parley_schedule_missed_slots"].set(missed)


@_never_fails
def sse_connected() -> None:
    """The gateway opened an event stream."""
    m = instruments()
    m["parley_sse_connections"].inc()
    m["parley_sse_connections_opened_total"].inc()


@_never_fails
def sse_disconnected() -> None:
    """An event stream the gateway served has closed."""
    instruments()["parley_sse_connections"].dec()


@_never_fails
def model_call_admitted(model: str, priority: str, tokens: int) -> None:
    """An admitted model call answered, using ``tokens``."""
    m = instruments()
    m["parley_model_calls_total"].labels(model=model, priority=priority).inc()
    if tokens:
        m["parley_model_call_tokens_total"].labels(model=model).inc(tokens)


@_never_fails
def model_limits(model: str, rpm: int | None, tpm: int | None) -> None:
    """``model``'s limits in force, as this process knows them."""
    gauge = instruments()["parley_model_limit"]
    for unit, value in (("rpm", rpm), ("tpm", tpm)):
        if value is not None:
            gauge.labels(model=model, unit=unit).set(value)


@_never_fails
def admission_waited(model: str, priority: str, seconds: float, *, let_go: bool = False) -> None:
    """A model call was told to wait ``seconds`` for capacity: in its slot, or with
    its turn letting go."""
    m = instruments()
    how = "let_go" if let_go else "slot"
    m["parley_admission_waits_total"].labels(model=model, priority=priority, how=how).inc()
    m["parley_admission_wait_seconds"].labels(model=model, priority=priority).observe(seconds)


@_never_fails
def provider_refused(model: str) -> None:
    """A 429 came from ``model``'s provider."""
    instruments()["parley_provider_rate_limited_total"].labels(model=model).inc()


_waiting_labels: set[tuple[str, str]] = set()


_event_labels: set[str] = set()


@_never_fails
def turns_waiting_event(counts: dict[str, int]) -> None:
    """The turns waiting for an event now, by tenant: a tenant no longer waiting reads 0."""
    gauge = instruments()["parley_turns_waiting_event"]
    for tenant in _event_labels - set(counts):
        gauge.labels(tenant=tenant).set(0)
    for tenant, count in counts.items():
        gauge.labels(tenant=tenant).set(count)
    _event_labels.update(counts)


@_never_fails
def turns_waiting_capacity(counts: dict[tuple[str, str], int]) -> None:
    """The turns waiting for capacity now, by (tenant, priority): a pair no longer
    waiting reads 0."""
    gauge = instruments()["parley_turns_waiting_capacity"]
    for tenant, priority in _waiting_labels - set(counts):
        gauge.labels(tenant=tenant, priority=priority).set(0)
    for (tenant, priority), count in counts.items():
        gauge.labels(tenant=tenant, priority=priority).set(count)
    _waiting_labels.update(counts)


@_never_fails
def agents_at_work(running: int, waiting: int, parents_waiting: int) -> None:
    """Sub-agents at work now (docs/sub-agents.md#9-counts): child turns running and
    waiting to run, and the parents waiting for them."""
    gauge = instruments()["parley_agent_turns"]
    gauge.labels(state="running").set(running)
    gauge.labels(state="waiting").set(waiting)
    instruments()["parley_turns_waiting_agents"].set(parents_waiting)
