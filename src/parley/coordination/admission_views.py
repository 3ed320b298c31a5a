"""What the admissions hand out of a model's state: a grant for the port's callers, and
what an operator sees (``parley status``, metrics), read from a copy so that looking
changes nothing.  The arithmetic is :mod:`.admission_math`'s."""

from __future__ import annotations

import copy

from parley.coordination.admission_math import (
    TENANT_IDLE_SECONDS,
    Answer,
    ModelState,
    in_force,
    refill,
    slowness,
)
from parley.ports.admission import Demand, Grant, Limits, ModelUse


def learned(state: ModelState) -> Limits | None:
    """The limits the provider reported, if any."""
    if state.learned_rpm is None and state.learned_tpm is None:
        return None
    return Limits(rpm=state.learned_rpm, tpm=state.learned_tpm)


def waiting_tenants(state: ModelState, now: float) -> dict[str, float]:
    """The tenants with calls waiting, and the seconds until their last ticket."""
    return {
        tenant: max(0.0, clock - now)
        for tenant, clock in state.tickets.items()
        if clock > now - TENANT_IDLE_SECONDS
    }


def grant_of(demand: Demand, answer: Answer, known: Limits | None) -> Grant:
    """The port's grant for ``answer``, with the limits learned as they stand."""
    return Grant(
        demand=demand,
        granted=answer.granted,
        wait=answer.wait,
        tokens=answer.tokens,
        reason=answer.reason,
        learned=known,
        requests_mark=answer.requests_mark,
        tokens_mark=answer.tokens_mark,
    )


def model_use(model: str, state: ModelState, now: float) -> ModelUse:
    """What an operator sees of the model at ``now``, without changing its state.  The
    limits shown are those in force at its latest acquire (configured ones included),
    else those learned."""
    view = copy.deepcopy(state)
    if view.rpm is None and view.tpm is None:
        view.rpm, view.tpm = in_force(view, None)
    refill(view, now)
    shown = None if view.rpm is None and view.tpm is None else Limits(rpm=view.rpm, tpm=view.tpm)
    return ModelUse(
        model=model,
        limits=shown,
        learned=learned(view),
        requests_available=view.r_level,
        tokens_available=view.t_level,
        slowed=slowness(view, now),
        blocked_seconds=max(0.0, view.blocked_until - now),
        waiting_tenants=waiting_tenants(view, now),
    )
