"""Admission: each model's provider limits, shared by every caller of the fleet
(docs/admission.md).

Before every model call the engine asks an :class:`Admission` for capacity: one request
and the tokens the call may use (its input, estimated from the request, plus its output
ceiling).  The answer is a :class:`Grant`: admitted now, or told how long to wait before
asking again.  After the call the grant is settled with the tokens the provider says it
used (a refund, or a debt).  What the provider's rate-limit headers say is left in its
buckets when it answers a call keeps ours from promising more (:class:`ProviderReport`);
a 429 that still arrives penalises the model fleet-wide, in proportion to how often they
come; limits a provider reports in its headers are learned for every caller.

The Redis implementation (:mod:`parley.coordination.redis_admission`) keeps one model's
state in one hash slot and changes it with one Lua script per call; the in-process twin
(:mod:`parley.coordination.local_admission`) does the same arithmetic under a lock, for
the embedded runtime.  One contract suite runs against both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from parley.schemas.errors import InvalidRequest

Priority = Literal["interactive", "batch"]
PRIORITIES: tuple[Priority, ...] = ("interactive", "batch")
"""The lanes, most urgent first: an interactive call takes capacity before a batch one."""


@dataclass(frozen=True)
class Limits:
    """A model's limits at its provider: requests and tokens per minute (None: that one
    is not limited)."""

    rpm: int | None = None
    tpm: int | None = None

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise InvalidRequest(
                    f"Limits: {name} must be a positive whole number, not {value!r}"
                )
        if self.rpm is None and self.tpm is None:
            raise InvalidRequest("Limits: give rpm, tpm or both")

    @classmethod
    def parse(cls, text: str) -> Limits:
        """``500rpm``, ``200000tpm`` or both joined by ``/`` (``500rpm/200000tpm``)."""
        found: dict[str, int] = {}
        for part in text.strip().split("/"):
            match = _LIMIT.fullmatch(part.strip().lower().replace("_", ""))
            if match is None or match.group(2) in found:
                raise InvalidRequest(
                    f"limits {text!r}: expected <N>rpm and/or <N>tpm joined by '/', "
                    "e.g. 500rpm/200000tpm"
                )
            found[match.group(2)] = int(match.group(1))
        return cls(rpm=found.get("rpm"), tpm=found.get("tpm"))

    def __str__(self) -> str:
        parts = [f"{self.rpm}rpm" if self.rpm else "", f"{self.tpm}tpm" if self.tpm else ""]
        return "/".join(p for p in parts if p)


_LIMIT = re.compile(r"([1-9][0-9]*)(rpm|tpm)")


def parse_model_limits(text: str) -> dict[str, Limits]:
    """``PARLEY_MODEL_LIMITS``: ``MODEL=LIMITS`` pairs, comma-separated
    (``openai:gpt-4o-mini=500rpm/200000tpm,anthropic:claude-sonnet-4=50rpm``)."""
    limits: dict[str, Limits] = {}
    for pair in text.split(","):
        if not pair.strip():
            continue
        model, sep, value = pair.strip().rpartition("=")
        if not sep or not model.strip():
            raise InvalidRequest(
                f"PARLEY_MODEL_LIMITS: {pair.strip()!r} is not MODEL=LIMITS "
                "(e.g. openai:gpt-4o-mini=500rpm/200000tpm)"
            )
        if model.strip() in limits:
            raise InvalidRequest(f"PARLEY_MODEL_LIMITS names {model.strip()!r} twice")
        try:
            limits[model.strip()] = Limits.parse(value)
        except InvalidRequest as exc:
            # Said with the setting and the model: the operator's typo is in one pair.
            raise InvalidRequest(f"PARLEY_MODEL_LIMITS: {model.strip()}: {exc}") from exc
    return limits


def parse_tenant_weights(text: str) -> dict[str, float]:
    """``PARLEY_TENANT_WEIGHTS``: ``TENANT=WEIGHT`` pairs, comma-separated (a tenant not
    named weighs 1)."""
    weights: dict[str, float] = {}
    for pair in text.split(","):
        if not pair.strip():
            continue
        tenant, sep, value = pair.strip().rpartition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = 0.0
        if not sep or not weight > 0 or weight != weight or weight == float("inf"):
            raise InvalidRequest(
                f"PARLEY_TENANT_WEIGHTS: {pair.strip()!r} is not TENANT=WEIGHT with a "
                "positive weight (e.g. acme=3)"
            )
        weights[tenant.strip()] = weight
    return weights


@dataclass(frozen=True, kw_only=True)
class Demand:
    """What one model call asks for: a request and ``tokens`` (input estimate plus output
    ceiling), in a lane, for a tenant of a weight."""

    model: str
    tokens: int
    priority: Priority = "interactive"
    tenant: str = ""
    weight: float = 1.0


Reason = Literal["", "requests", "tokens", "interactive", "penalty"]
"""Why a call must wait: a bucket is short of requests or of tokens, an interactive call
waits (batch calls step aside), or a 429 blocks the model until its ``retry-after``."""


@dataclass(frozen=True, kw_only=True)
class Grant:
    """Admission's answer.  ``granted``: the call may start now, ``tokens`` reserved
    against the model's token bucket (settle with what it used).  Else ``wait`` is how
    many seconds to wait before asking again (for a batch call, spread by its tenant's
    share so that many waiting calls do not come back at once)."""

    demand: Demand
    granted: bool
    wait: float = 0.0
    tokens: int = 0
    reason: Reason = ""
    learned: Limits | None = None
    """The limits the model's provider reported to any caller of the fleet, if any."""
    requests_mark: float = 0.0
    """How many requests the model had granted once this one was: when its provider's
    answer says what is left, those granted after it are still on their way there."""
    tokens_mark: float = 0.0
    """The same count of tokens."""


@dataclass(frozen=True, kw_only=True)
class ProviderReport:
    """What a provider's rate-limit headers said when it answered a call (OpenAI's
    ``x-ratelimit-*``, Anthropic's ``anthropic-ratelimit-*``): the model's limits, and
    how many requests and tokens its buckets had left once they counted the call (None:
    not said)."""

    limits: Limits | None = None
    requests_remaining: int | None = None
    tokens_remaining: int | None = None


@dataclass(frozen=True, kw_only=True)
class ModelUse:
    """A model's admission state as an operator sees it (``parley status``, metrics)."""

    model: str
    limits: Limits | None
    """In force: configured, else learned (None: no limit known, calls go at once)."""
    learned: Limits | None
    requests_available: float | None
    tokens_available: float | None
    slowed: float
    """The fraction of its limits the model is admitted at after 429s (1: none lately)."""
    blocked_seconds: float
    """How long until a 429's ``retry-after`` ends (0: not blocked)."""
    waiting_tenants: Mapping[str, float]
    """Tenants with calls told to wait (either lane), and the seconds until their last
    ticket."""


class Admission(Protocol):
    """Fleet-wide admission of model calls (see the module docstring)."""

    def acquire(self, demand: Demand, configured: Limits | None) -> Grant:
        """Take capacity for one call, or be told how long to wait.  ``configured`` are
        the limits the deployment gives the model (else those learned are in force)."""
        ...

    def settle(self, grant: Grant, used_tokens: int) -> None:
        """The granted call used ``used_tokens`` (input plus output, as the provider
        reported): give back what was reserved beyond it, or take the excess."""
        ...

    def observe(self, grant: Grant, report: ProviderReport) -> None:
        """The provider answered the granted call and said what its buckets have left:
        the model's buckets hold no more than that, less the calls granted after this one
        (still on their way to it).  Only ever lowers them: the provider's own clock and
        the calls in flight are not ours to guess past."""
        ...

    def penalise(self, model: str, retry_after: float) -> None:
        """A 429 came anyway: admit nothing for ``retry_after`` seconds, and slow the
        model's admission for a while by the share of its recent calls the provider
        refused (a lone 429 does not slow it; it recovers by itself)."""
        ...

    def learn(self, model: str, reported: Limits) -> None:
        """The provider reported the model's limits (rate-limit headers)."""
        ...

    def use(self, models: Sequence[str]) -> list[ModelUse]:
        """Each of ``models``' admission state, for an operator."""
        ...
