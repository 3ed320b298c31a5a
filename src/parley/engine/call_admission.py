"""Admission of the engine's model calls (docs/admission.md): before each call, capacity
from the fleet-wide :class:`~parley.ports.admission.Admission`; as its answer begins,
the limits its provider stated learned and the model's buckets held to what the provider
says it has left; after it, the grant settled with the usage the provider reported; a
429 that still came penalises the model for every caller.

A wait of up to ``SHORT_WAIT_SECONDS`` is spent in the worker slot (in slices that let an
interrupt through); a longer one is a :class:`Throttle`: the turn lets its session and
its slot go and is kicked again when its capacity is due.

A model whose limits nobody knows yet (none configured, none learned) is probed first:
one call of it at a time in each process, for up to ``PROBE_SECONDS``, until an answer
says what the provider allows (its rate-limit headers, which come before its first
token) or that it states nothing (then the model goes unadmitted).  Without the probe, a
fleet that starts a backlog against a provider it has not heard from yet would send its
whole concurrency at once, into the very storm of 429s admission is for.

Admission never fails a turn: when Redis cannot be asked, the call goes ahead (a lost
Redis costs the fleet its locks and kicks too, and is recovered as they are).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from parley.coordination.admission_math import buckets
from parley.ports.admission import (
    Admission,
    Demand,
    Grant,
    Limits,
    Priority,
    ProviderReport,
    parse_model_limits,
    parse_tenant_weights,
)
from parley.ports.host import Model, ModelReply, ModelRequest, ModelThrottled
from parley.schemas.messages import request_size
from parley.settings import Settings
from parley.telemetry import metrics

log = logging.getLogger("parley.admission")

SHORT_WAIT_SECONDS = 1.0
"""Waits up to this long are spent holding the worker slot; longer ones let it go."""
WAIT_SLICE_SECONDS = 0.1
"""How long a wait in the slot goes without asking whether the turn was interrupted."""
DEFAULT_OUTPUT_CEILING = 1024
"""The output tokens reserved for a call whose model names no ceiling of its own (the
settle gives back what it did not use)."""
UNLIMITED_RECHECK_SECONDS = 5.0
"""A model with no limit configured or learned anywhere is admitted without asking Redis;
this often it asks again, to see limits or a penalty another worker learned."""
PROBE_SECONDS = 2.0
"""How long a call waits for the probe of its model (the first call of a model whose
limits are unknown) before going ahead anyway: a probe that takes long (a long answer)
must not hold every other call of the model."""
DEFAULT_MAX_RETRY_AFTER = Settings().max_retry_after
REPORT_REACH = 2.0
"""A provider's report is passed on to admission only when what it says is left is
within this many bursts of our buckets: a provider whose bucket holds a minute of its
rate (OpenAI's) says it has far more than ours hold, which would lower nothing, and
costs no round trip."""


@dataclass(frozen=True, kw_only=True)
class AdmissionSettings:
    """The deployment's admission settings (its part of :class:`Settings`)."""

    enabled: bool = True
    model_limits: Mapping[str, Limits] = field(default_factory=dict)
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER

    @classmethod
    def from_settings(cls, settings: Settings) -> AdmissionSettings:
        """``PARLEY_MODEL_LIMITS``, ``PARLEY_TENANT_WEIGHTS`` (parsed here),
        ``PARLEY_MAX_RETRY_AFTER`` and ``PARLEY_ADMISSION`` (off: every call goes at once,
        as before admission; for measuring it), as ``settings`` read them."""
        return cls(
            enabled=settings.admission,
            model_limits=parse_model_limits(settings.model_limits),
            tenant_weights=parse_tenant_weights(settings.tenant_weights),
            max_retry_after=settings.max_retry_after,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AdmissionSettings:
        """The admission settings ``env`` names (:meth:`from_settings`)."""
        return cls.from_settings(Settings.from_environment(env))


@dataclass(frozen=True, kw_only=True)
class Throttle:
    """A call that must wait longer than the slot should: the turn lets go for
    ``seconds`` (``reason``: as :class:`~parley.ports.admission.Grant`'s)."""

    model: str
    seconds: float
    reason: str


_FREE = Grant(demand=Demand(model="", tokens=0), granted=True)
"""The grant of a call admitted without asking (admission off, no limit known)."""


class CallAdmission:
    """Admission for one engine's model calls (one per process and host)."""

    def __init__(
        self,
        admission: Admission | None,
        settings: AdmissionSettings,
        host_limits: Mapping[str, Limits],
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._admission = admission if settings.enabled else None
        self._settings = settings
        # The operator's word wins over the code's for a model named in both.
        self._configured = {**host_limits, **settings.model_limits}
        self._sleep = sleep
        self._clock = clock
        self._guard = threading.Lock()
        self._learned: dict[str, Limits] = {}
        """Limits learned here or seen in the admission's store."""
        self._unlimited_until: dict[str, float] = {}
        self._silent: set[str] = set()
        """Models whose provider answered without stating limits: not probed again."""
        self._probes: dict[str, threading.Semaphore] = {}
        self._holding = threading.local()  # .model: the probe this thread's call holds
        self._failing = False

    @property
    def enabled(self) -> bool:
        return self._admission is not None

    def weight_of(self, tenant: str) -> float:
        return self._settings.tenant_weights.get(tenant, 1.0)

    def limits_of(self, model: str) -> Limits | None:
        """The limits in force for ``model`` as this process knows them."""
        with self._guard:
            return self._configured.get(model) or self._learned.get(model)

    # ------------------------------------------------------------------ a call

    def demand(
        self, model: Model, request: ModelRequest, *, priority: Priority, tenant: str
    ) -> Demand:
        """What a call of ``request`` asks for: its input estimated (about four
        characters a token) plus the model's output ceiling."""
        size = request_size(request.prefix, request.messages)
        ceiling = getattr(model, "output_ceiling", None) or DEFAULT_OUTPUT_CEILING
        return Demand(
            model=model.name,
            tokens=(size + 3) // 4 + int(ceiling),
            priority=priority,
            tenant=tenant,
            weight=self.weight_of(tenant),
        )

    def admit(self, demand: Demand, interrupted: Callable[[], None]) -> Grant | Throttle:
        """Capacity for one call: a grant (waiting in the slot for up to
        ``SHORT_WAIT_SECONDS`` at a time), or how long the turn must let go for.
        ``interrupted`` raises if the turn was interrupted meanwhile."""
        self._wait_for_probe(demand.model, interrupted)
        try:
            while True:
                grant = self._acquire(demand)
                if grant.granted:
                    return grant
                if grant.wait > SHORT_WAIT_SECONDS:
                    self._end_probe(demand.model)  # no call follows now
                    return Throttle(model=demand.model, seconds=grant.wait, reason=grant.reason)
                metrics.admission_waited(demand.model, demand.priority, grant.wait)
                self.pause(grant.wait, interrupted)
        except BaseException:
            self._end_probe(demand.model)
            raise

    def observe(self, grant: Grant, report: ProviderReport) -> None:
        """The call's answer began, and its provider said what it allows and what it has
        left: learn the limits (the model's probe ends here, not at the answer's end),
        and hold the model's buckets to what is left."""
        model = grant.demand.model
        if not model:
            return  # admitted without asking: nothing to hold
        if report.limits is not None:
            self._learn(model, report.limits)
        elif report.requests_remaining is None and report.tokens_remaining is None:
            with self._guard:
                self._silent.add(model)
        self._end_probe(model)
        if grant.granted and grant.requests_mark and self._within_reach(model, report):
            self._call(lambda a: a.observe(grant, report))

    def _within_reach(self, model: str, report: ProviderReport) -> bool:
        """Whether what the provider has left is near enough what our buckets hold for
        its report to lower them (see REPORT_REACH)."""
        limits = self.limits_of(model)
        if limits is None:
            return False
        shape = buckets(limits.rpm, limits.tpm, 1.0)
        return (
            shape.r_burst is not None
            and report.requests_remaining is not None
            and report.requests_remaining < REPORT_REACH * shape.r_burst
        ) or (
            shape.t_burst is not None
            and report.tokens_remaining is not None
            and report.tokens_remaining < REPORT_REACH * shape.t_burst
        )

    def settle(self, grant: Grant, reply: ModelReply) -> None:
        """The call answered: settle its grant with the tokens it used, and learn the
        limits its provider stated."""
        model = grant.demand.model or reply.model
        if reply.limits is not None:
            self._learn(model, reply.limits)
        else:
            with self._guard:
                self._silent.add(model)
        self._end_probe(model)
        used = reply.usage.input_tokens + reply.usage.output_tokens
        metrics.model_call_admitted(grant.demand.model, grant.demand.priority, used)
        if grant.tokens:
            self._call(lambda a: a.settle(grant, used))

    def unused(self, grant: Grant, demand: Demand) -> None:
        """The call failed or was cut off: what it reserved beyond its input goes back
        (the provider may have counted the input)."""
        self._end_probe(demand.model)
        if grant.tokens:
            ceiling = max(0, demand.tokens - grant.tokens)
            self._call(lambda a: a.settle(grant, max(0, grant.tokens - ceiling)))

    def refused(self, grant: Grant, exc: ModelThrottled) -> float:
        """A 429 came anyway: penalise the model for the whole fleet, learn what the
        refusal reported, give the grant's tokens back; returns the seconds to wait
        before asking again (the provider's ``retry-after``, capped)."""
        model = grant.demand.model
        if exc.limits is not None:
            self._learn(model, exc.limits)
        self._end_probe(model)
        wait = min(
            self._settings.max_retry_after,
            exc.retry_after if exc.retry_after is not None else 1.0,
        )
        wait = max(wait, 0.0)
        metrics.provider_refused(model)
        with self._guard:
            self._unlimited_until.pop(model, None)
        # Settled first: the penalty empties the buckets, and a settle after it would
        # put the reserved tokens back into one that must stay empty.
        if grant.tokens:
            self._call(lambda a: a.settle(grant, 0))
        self._call(lambda a: a.penalise(model, wait))
        return wait

    def pause(self, seconds: float, interrupted: Callable[[], None]) -> None:
        """Wait ``seconds`` in the slot, letting an interrupt through within a slice."""
        ends = self._clock() + seconds
        while True:
            left = ends - self._clock()
            if left <= 0:
                return
            self._sleep(min(left, WAIT_SLICE_SECONDS))
            interrupted()

    # ------------------------------------------------------------------ the probe

    def _wait_for_probe(self, model: str, interrupted: Callable[[], None]) -> None:
        """While nothing says what ``model``'s provider allows, its calls in this process
        go one at a time (each waits up to ``PROBE_SECONDS`` for the one before)."""
        if self._admission is None:
            return
        with self._guard:
            if model in self._configured or model in self._learned or model in self._silent:
                return
            probe = self._probes.setdefault(model, threading.Semaphore(1))
        ends = self._clock() + PROBE_SECONDS
        while not probe.acquire(timeout=WAIT_SLICE_SECONDS):
            interrupted()
            if self._clock() >= ends or not self._probing(model):
                return
        self._holding.model = model

    def _probing(self, model: str) -> bool:
        with self._guard:
            return model in self._probes

    def _end_probe(self, model: str) -> None:
        """A call of ``model`` answered (or failed): the next one in line may go; once
        the model's limits are known (or known to be stated nowhere), all may."""
        if getattr(self._holding, "model", None) != model:
            return
        self._holding.model = None
        with self._guard:
            probe = self._probes.get(model)
            if probe is not None and (model in self._learned or model in self._silent):
                del self._probes[model]
        if probe is not None:
            probe.release()

    # ------------------------------------------------------------------ admission

    def _acquire(self, demand: Demand) -> Grant:
        admission = self._admission
        if admission is None:
            return _FREE
        model = demand.model
        known = self.limits_of(model)
        with self._guard:
            if known is None and self._unlimited_until.get(model, 0.0) > self._clock():
                return _FREE
        try:
            grant = admission.acquire(demand, self._configured.get(model))
        except Exception as exc:
            self._unreachable(exc)
            return _FREE
        self._reachable()
        in_force = self._configured.get(model) or grant.learned
        if in_force is not None:
            metrics.model_limits(model, in_force.rpm, in_force.tpm)
        with self._guard:
            if grant.learned is not None:
                self._learned[model] = grant.learned
            if known is None and grant.learned is None and grant.granted and not grant.tokens:
                self._unlimited_until[model] = self._clock() + UNLIMITED_RECHECK_SECONDS
        return grant

    def _learn(self, model: str, limits: Limits) -> None:
        with self._guard:
            if self._learned.get(model) == limits:
                return
            self._learned[model] = limits
            self._unlimited_until.pop(model, None)
        self._call(lambda a: a.learn(model, limits))

    def _call(self, what: Callable[[Admission], None]) -> None:
        admission = self._admission
        if admission is None:
            return
        try:
            what(admission)
        except Exception as exc:
            self._unreachable(exc)
        else:
            self._reachable()

    def _unreachable(self, exc: Exception) -> None:
        if not self._failing:
            log.warning(
                "admission cannot reach its store (%s: %s); calls go ahead unadmitted "
                "until it answers",
                type(exc).__name__,
                exc,
            )
        self._failing = True

    def _reachable(self) -> None:
        if self._failing:
            log.info("admission reaches its store again")
        self._failing = False
