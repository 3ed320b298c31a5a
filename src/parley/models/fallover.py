"""Retrying a cut stream, then falling over to the next provider.

The retry work is split by phase (see :mod:`parley.models.errors`).  Failures before a
stream starts are the official clients' business: they retry 408/409/5xx and connection
errors with exponential backoff and jitter, honouring ``Retry-After``, up to their
``max_retries``.  What they give up on reaches :class:`Fallover` as a non-retriable
:class:`~parley.models.errors.ProviderError`, and so does a request the provider rejected
(400, 401, 403, 404, 422 …): retrying the same provider would not help (or would multiply
the client's own retries), so ``Fallover`` moves straight on to the next provider, which
may well accept it (another key, a larger context, a model that exists there).

A 429 is not the clients' to retry: it reaches ``Fallover`` at once as a
:class:`~parley.models.errors.RateLimited` and moves on to the next provider like any other
refusal.  When every provider failed and one of them was rate limited, the chain raises a
:class:`~parley.models.errors.RateLimited` itself (with the longest delay any provider
named), so the engine waits for capacity instead of failing the turn.

Once a stream has started the clients cannot retry, so a stream cut mid-way, stalled past
the timeout, or carrying a malformed chunk is ``retriable``: ``Fallover`` asks the same
provider again, ``retries_per_model`` times with backoff and jitter, before moving on.
As soon as an attempt fails it calls ``on_delta.restart("retry")`` or
``on_delta.restart("fallover")`` so readers drop the provisional text of the failed one,
and it waits out the backoff in slices, asking ``on_delta.raise_if_interrupted()``
between them, so an interrupt is not held up by the pause.

Only :class:`ProviderError` is handled.  Anything else — an interrupt
(:class:`~parley.ports.host.StreamAborted`) or a lost session lock raised by the sink, a bug —
propagates at once and is never retried.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from parley.errors import InvalidRequest
from parley.models.errors import ProviderError, RateLimited
from parley.ports.host import DeltaSink, Model, ModelReply, ModelRequest

log = logging.getLogger(__name__)

WAIT_SLICE_SECONDS = 0.1
"""How long a backoff pause goes without asking whether the turn was interrupted."""


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Exponential backoff with jitter between retries of the same provider: attempt
    ``n`` (from 0) waits ``min(initial * multiplier**n, maximum)``, less up to ``jitter``
    of it at random (so that many workers cut off at once do not return in lockstep)."""

    initial: float = 0.5
    maximum: float = 8.0
    multiplier: float = 2.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < 0 or self.multiplier < 1:
            raise InvalidRequest("backoff: initial and maximum >= 0, multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise InvalidRequest("backoff: jitter is a fraction between 0 and 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt + 1``."""
        base = min(self.initial * self.multiplier ** min(attempt, 64), self.maximum)
        return base * (1 - self.jitter * random.random())


@dataclass(frozen=True, kw_only=True)
class Failure:
    """One failed attempt, as the final error reports it."""

    provider: str
    attempt: int
    error: ProviderError


class Fallover:
    """Tries ``models`` in order: each up to ``1 + retries_per_model`` times while its
    failures are retriable (stream cut, stalled, malformed), at once to the next on any
    other provider failure.  The reply's ``model`` names the provider that answered, and
    its ``limits`` are that provider's.  When every provider failed, raises a
    :class:`ProviderError` naming each provider tried and why: a :class:`RateLimited` if
    any of them was rate limited."""

    def __init__(
        self,
        models: Sequence[Model],
        *,
        retries_per_model: int = 2,
        backoff: Backoff | None = None,
        name: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not models:
            raise InvalidRequest("Fallover needs at least one model")
        if retries_per_model < 0:
            raise InvalidRequest("retries_per_model must be non-negative")
        self._models = tuple(models)
        self._retries = retries_per_model
        self._backoff = backoff or Backoff()
        self._sleep = sleep
        self._name = name or ",".join(m.name for m in self._models)

    @property
    def name(self) -> str:
        """The label of the whole chain (each step stores the provider that answered)."""
        return self._name

    @property
    def models(self) -> tuple[Model, ...]:
        """The providers, in the order they are tried."""
        return self._models

    @property
    def output_ceiling(self) -> int | None:
        """The largest output ceiling of the providers (any of them may answer); None when
        none states one."""
        ceilings = [getattr(model, "output_ceiling", None) for model in self._models]
        return max((c for c in ceilings if isinstance(c, int)), default=None)

    def close(self) -> None:
        """Close every provider that has connections to close."""
        for model in self._models:
            close = getattr(model, "close", None)
            if callable(close):
                close()

    def __repr__(self) -> str:
        return f"Fallover({list(self._models)!r}, retries_per_model={self._retries})"

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        """Answer from the first provider that can.  As soon as an attempt fails the sink
        is restarted (readers drop its text at once), and the wait before a retry is
        spent in short slices that ask the sink whether the turn was interrupted."""
        failures: list[Failure] = []
        last = len(self._models) - 1
        for position, model in enumerate(self._models):
            for attempt in range(self._retries + 1):
                try:
                    reply = model.stream(request, on_delta)
                except ProviderError as exc:
                    failures.append(Failure(provider=model.name, attempt=attempt + 1, error=exc))
                    log.warning("model %s failed (attempt %d): %s", model.name, attempt + 1, exc)
                    if exc.retriable and attempt < self._retries:
                        on_delta.restart("retry")
                        self._wait(self._backoff.delay(attempt), on_delta)
                        continue
                    if position < last:
                        on_delta.restart("fallover")
                    break
                if not reply.model:
                    reply = replace(reply, model=model.name)
                return reply
        raise _exhausted(failures)

    def _wait(self, seconds: float, on_delta: DeltaSink) -> None:
        """Sleep ``seconds``, letting an interrupt through within a tenth of a second."""
        remaining = seconds
        while remaining > 0:
            pause = min(remaining, WAIT_SLICE_SECONDS)
            self._sleep(pause)
            remaining -= pause
            on_delta.raise_if_interrupted()


def _exhausted(failures: list[Failure]) -> ProviderError:
    """One error naming every provider tried, each with its attempts and last reason."""
    by_provider: dict[str, list[Failure]] = {}
    for failure in failures:
        by_provider.setdefault(failure.provider, []).append(failure)
    parts = []
    for provider, tried in by_provider.items():
        reason = str(tried[-1].error).removeprefix(f"{provider}: ")
        attempts = "1 attempt" if len(tried) == 1 else f"{len(tried)} attempts"
        parts.append(f"{provider} ({attempts}): {reason}")
    message = "every model provider failed: " + "; ".join(parts)
    limited = [f.error for f in failures if isinstance(f.error, RateLimited)]
    if limited:
        return _rate_limited(message, list(by_provider), limited)
    last_error = failures[-1].error
    return ProviderError(
        message,
        provider=",".join(by_provider),
        # Transient if any provider failed transiently: trying later again may work.
        retriable=any(f.error.retriable for f in failures),
        phase=last_error.phase,
        status=last_error.status,
    )


def _rate_limited(message: str, providers: list[str], limited: list[RateLimited]) -> RateLimited:
    """The chain's own 429: wait as long as the slowest rate-limited provider asked (by
    then each has capacity again).  Its limits are reported only when one provider alone
    was tried: the chain's name is then that provider's, and admission may learn them."""
    delays = [error.retry_after for error in limited if error.retry_after is not None]
    return RateLimited(
        message,
        provider=",".join(providers),
        retry_after=max(delays) if delays else None,
        limits=limited[-1].limits if len(providers) == 1 else None,
    )
