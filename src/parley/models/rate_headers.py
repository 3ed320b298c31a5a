"""What a provider's rate-limit headers say: the model's limits, and how long a refused
call should wait.

OpenAI (and the servers that copy it) send ``x-ratelimit-limit-requests``,
``x-ratelimit-limit-tokens``, their ``-remaining-`` counts and ``-reset-`` durations in
Go's format (``1s``, ``6m0s``, ``20ms``, ``1m30.5s``), on every response
(https://platform.openai.com/docs/guides/rate-limits#rate-limits-in-headers).  Anthropic
sends ``anthropic-ratelimit-requests-limit`` / ``-remaining`` / ``-reset`` and the same
for ``tokens``, ``input-tokens`` and ``output-tokens``, each reset an RFC 3339 instant
(https://docs.anthropic.com/en/api/rate-limits#response-headers).

Parley's admission keeps one token bucket per model (a call's input plus its output
ceiling), so Anthropic's three token limits map to one ``tpm``: its ``tokens`` limit when
sent (Anthropic's own combined figure: input and output together, as parley counts), else
the input-tokens limit alone.  That one binds an agent first (every step resends the
conversation, while the output of a step is a small fraction of it), and holding input plus
output under it keeps input under it; output-only limits are never taken as ``tpm``.

A header that cannot be read (absent, not a number, a negative count) counts as not sent:
a reply is never lost to a malformed header, and no limit is learned from one.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from parley.ports.admission import Limits, ProviderReport

_GO_DURATION = re.compile(r"(?:(\d+(?:\.\d*)?|\.\d+)(h|ms|us|µs|ns|m|s))")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class Bucket:
    """One of a provider's buckets as its headers describe it (None: not sent)."""

    limit: int | None = None
    remaining: int | None = None
    reset: float | None = None
    """Seconds from now until the bucket is full again."""

    @property
    def exhausted(self) -> bool:
        """Nothing left in it: a call must wait for ``reset``."""
        return self.remaining is not None and self.remaining <= 0


@dataclass(frozen=True)
class RateReport:
    """A response's rate-limit headers, read: requests and tokens (the tokens bucket is
    Anthropic's ``tokens`` or, without it, its ``input-tokens``; see the module docstring),
    plus Anthropic's separate ``output-tokens``, whose exhaustion also makes a call wait."""

    requests: Bucket = Bucket()
    tokens: Bucket = Bucket()
    output_tokens: Bucket = Bucket()

    @property
    def limits(self) -> Limits | None:
        """The model's requests and tokens per minute, if the headers named either."""
        if self.requests.limit is None and self.tokens.limit is None:
            return None
        return Limits(rpm=self.requests.limit, tpm=self.tokens.limit)

    @property
    def exhausted_reset(self) -> float | None:
        """Seconds until every exhausted bucket has refilled (None: none is exhausted, or
        none said when)."""
        resets = [
            bucket.reset
            for bucket in (self.requests, self.tokens, self.output_tokens)
            if bucket.exhausted and bucket.reset is not None
        ]
        return max(resets) if resets else None


def read_rate_headers(headers: Mapping[str, str], *, now: float | None = None) -> RateReport:
    """The rate-limit headers of a response (OpenAI's or Anthropic's, whichever it sent).
    ``now`` is the Unix time Anthropic's reset instants are measured from (default: now)."""
    lowered = {name.lower(): value for name, value in headers.items()}
    clock = time.time() if now is None else now
    if any(name.startswith("anthropic-ratelimit-") for name in lowered):
        tokens = _anthropic_bucket(lowered, "tokens", clock)
        if tokens.limit is None:
            tokens = _anthropic_bucket(lowered, "input-tokens", clock)
        return RateReport(
            requests=_anthropic_bucket(lowered, "requests", clock),
            tokens=tokens,
            output_tokens=_anthropic_bucket(lowered, "output-tokens", clock),
        )
    return RateReport(
        requests=_openai_bucket(lowered, "requests"), tokens=_openai_bucket(lowered, "tokens")
    )


def limits_of(headers: Mapping[str, str]) -> Limits | None:
    """The model's limits as the headers report them, or None."""
    return read_rate_headers(headers).limits


def report_of(headers: Mapping[str, str]) -> ProviderReport:
    """What the headers say for admission: the limits, and what the requests and tokens
    buckets have left (docs/admission.md)."""
    read = read_rate_headers(headers)
    return ProviderReport(
        limits=read.limits,
        requests_remaining=read.requests.remaining,
        tokens_remaining=read.tokens.remaining,
    )


def retry_delay(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """How many seconds a refused call should wait, from the headers of its 429: the
    provider's ``retry-after-ms``, else ``retry-after`` (seconds, or an HTTP date), else the
    reset of the bucket that is exhausted; None when they say nothing."""
    lowered = {name.lower(): value for name, value in headers.items()}
    clock = time.time() if now is None else now
    milliseconds = _number(lowered.get("retry-after-ms"))
    if milliseconds is not None:
        return milliseconds / 1000.0
    retry_after = lowered.get("retry-after")
    if retry_after is not None:
        seconds = _number(retry_after)
        if seconds is None:
            seconds = _http_date_delay(retry_after, clock)
        if seconds is not None:
            return seconds
    return read_rate_headers(lowered, now=clock).exhausted_reset


def parse_go_duration(text: str) -> float | None:
    """Seconds in a Go duration (``6m0s``, ``20ms``, ``1h2m3.5s``, ``0s``); None if it
    is not one."""
    text = text.strip()
    if not text or _GO_DURATION.sub("", text):
        return None
    return sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _GO_DURATION.findall(text))


# ---------------------------------------------------------------------------- helpers


def _openai_bucket(headers: Mapping[str, str], name: str) -> Bucket:
    reset = headers.get(f"x-ratelimit-reset-{name}")
    seconds = parse_go_duration(reset) if reset is not None else None
    if seconds is None and reset is not None:
        seconds = _number(reset)  # some compatible servers send plain seconds
    return Bucket(
        limit=_positive(headers.get(f"x-ratelimit-limit-{name}")),
        remaining=_count(headers.get(f"x-ratelimit-remaining-{name}")),
        reset=seconds,
    )


def _anthropic_bucket(headers: Mapping[str, str], name: str, now: float) -> Bucket:
    reset = headers.get(f"anthropic-ratelimit-{name}-reset")
    return Bucket(
        limit=_positive(headers.get(f"anthropic-ratelimit-{name}-limit")),
        remaining=_count(headers.get(f"anthropic-ratelimit-{name}-remaining")),
        reset=_instant_delay(reset, now) if reset is not None else None,
    )


def _number(value: str | None) -> float | None:
    """A non-negative finite number of seconds (or milliseconds), or None."""
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _count(value: str | None) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number == int(number) else None


def _positive(value: str | None) -> int | None:
    count = _count(value)
    return count if count is not None and count > 0 else None


def _instant_delay(value: str, now: float) -> float | None:
    """Seconds from ``now`` until an RFC 3339 instant (0 if it has passed)."""
    try:
        instant = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if instant.tzinfo is None:
        return None  # RFC 3339 always names its offset; a bare time is ambiguous
    return max(0.0, instant.timestamp() - now)


def _http_date_delay(value: str, now: float) -> float | None:
    """Seconds from ``now`` until an HTTP date (``Wed, 21 Oct 2015 07:28:00 GMT``)."""
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:
        return None
    return max(0.0, parsed.timestamp() - now)
