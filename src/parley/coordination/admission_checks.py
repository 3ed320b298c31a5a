"""What the admissions refuse before any arithmetic: a model, a demand, a duration, a
usage or a provider's report that cannot be weighed, each with what is wrong with it.
Both admissions (:mod:`.local_admission`, :mod:`.redis_admission`) check alike, so that
bad input is refused the same way whichever runs, and changes nothing."""

from __future__ import annotations

import math

from parley.ports.admission import PRIORITIES, Demand, ProviderReport
from parley.schemas.errors import InvalidRequest


def check_model(model: str) -> None:
    """A model is named by a non-empty string without braces (the name is the hash tag
    of the model's admission keys: src/parley/coordination/constants.py)."""
    if not isinstance(model, str) or not model:
        raise InvalidRequest(f"admission: model must be a non-empty string, not {model!r}")
    if "{" in model or "}" in model:
        raise InvalidRequest(f"admission: a model's name has no braces, not {model!r}")


def check_demand(demand: Demand) -> None:
    """Refuse a demand the arithmetic cannot weigh, saying what is wrong."""
    check_model(demand.model)
    tokens = demand.tokens
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise InvalidRequest(f"Demand: tokens must be a whole number >= 0, not {tokens!r}")
    if demand.priority not in PRIORITIES:
        raise InvalidRequest(
            f"Demand: priority must be one of {', '.join(PRIORITIES)}, not {demand.priority!r}"
        )
    if not isinstance(demand.tenant, str):
        raise InvalidRequest(f"Demand: tenant must be a string, not {demand.tenant!r}")
    weight = demand.weight
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise InvalidRequest(f"Demand: weight must be a positive number, not {weight!r}")
    if not (weight > 0 and math.isfinite(weight)):
        raise InvalidRequest(f"Demand: weight must be a positive number, not {weight!r}")


def check_seconds(what: str, seconds: float) -> None:
    """A duration must be a finite number >= 0."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidRequest(f"{what} must be a number of seconds >= 0, not {seconds!r}")
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise InvalidRequest(f"{what} must be a number of seconds >= 0, not {seconds!r}")


def check_used(used_tokens: int) -> None:
    """Settled usage is a whole number of tokens."""
    if isinstance(used_tokens, bool) or not isinstance(used_tokens, int) or used_tokens < 0:
        raise InvalidRequest(f"used_tokens must be a whole number >= 0, not {used_tokens!r}")


def check_report(report: ProviderReport) -> None:
    """What a provider said is left is a whole number >= 0, or nothing."""
    for name in ("requests_remaining", "tokens_remaining"):
        value = getattr(report, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRequest(
                f"ProviderReport: {name} must be a whole number >= 0 or None, not {value!r}"
            )
