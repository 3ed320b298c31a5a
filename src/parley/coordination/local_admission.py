"""The in-process admission: :mod:`.admission_math`'s arithmetic over a dict of model
states under one lock, for the embedded runtime (one process shares its models' limits
among its own turns) and for tests, on an injectable clock.  The Redis admission
(:mod:`.redis_admission`) gives the same answers fleet-wide; one contract suite checks
both (tests/integration/test_admission_contract.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from parley.coordination import admission_checks as checks
from parley.coordination import admission_feedback as feedback
from parley.coordination import admission_math as am
from parley.coordination import admission_views as views
from parley.coordination.constants import ADMISSION_STATE_SECONDS
from parley.ports.admission import Admission, Demand, Grant, Limits, ModelUse, ProviderReport


class LocalAdmission(Admission):
    """The admission port in process.  ``clock``: seconds on a clock that never steps
    back (a test passes its own)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._guard = threading.Lock()
        self._states: dict[str, am.ModelState] = {}
        self._touched: dict[str, float] = {}

    def acquire(self, demand: Demand, configured: Limits | None) -> Grant:
        checks.check_demand(demand)
        with self._guard:
            now = self._clock()
            state = self._state(demand.model, now)
            answer = am.acquire(state, demand, configured, now)
            return views.grant_of(demand, answer, views.learned(state))

    def settle(self, grant: Grant, used_tokens: int) -> None:
        checks.check_used(used_tokens)
        if not grant.granted or grant.tokens == 0:
            return
        with self._guard:
            now = self._clock()
            state = self._states.get(grant.demand.model)
            if state is not None:
                self._touched[grant.demand.model] = now
                feedback.settle(state, grant.tokens, used_tokens, now)

    def observe(self, grant: Grant, report: ProviderReport) -> None:
        checks.check_report(report)
        if not grant.granted:
            return
        with self._guard:
            now = self._clock()
            state = self._states.get(grant.demand.model)
            if state is not None:
                self._touched[grant.demand.model] = now
                feedback.observe(state, report, grant.requests_mark, grant.tokens_mark, now)

    def penalise(self, model: str, retry_after: float) -> None:
        checks.check_model(model)
        checks.check_seconds("retry_after", retry_after)
        with self._guard:
            now = self._clock()
            feedback.penalise(self._state(model, now), retry_after, now)

    def learn(self, model: str, reported: Limits) -> None:
        checks.check_model(model)
        with self._guard:
            feedback.learn(self._state(model, self._clock()), reported)

    def use(self, models: Sequence[str]) -> list[ModelUse]:
        with self._guard:
            now = self._clock()
            self._forget_idle(now)
            return [
                views.model_use(model, self._states.get(model, am.ModelState()), now)
                for model in models
            ]

    def _state(self, model: str, now: float) -> am.ModelState:
        """The model's state, new if it had none (or none used lately), marked used now."""
        self._forget_idle(now)
        self._touched[model] = now
        return self._states.setdefault(model, am.ModelState())

    def _forget_idle(self, now: float) -> None:
        """Drop the states no call used for ADMISSION_STATE_SECONDS, as their Redis keys
        expire: a process that saw many models does not keep them all."""
        for model in [m for m, at in self._touched.items() if now - at > ADMISSION_STATE_SECONDS]:
            del self._touched[model]
            del self._states[model]
