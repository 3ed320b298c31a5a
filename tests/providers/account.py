"""A provider account's limits, as the rate-limited test server enforces them: a requests
and a tokens bucket refilled continuously, the quota switch, and what was admitted when.

Each bucket holds ``burst`` seconds of its rate (``rpm / 60 * burst`` requests) and refills
continuously; a call is checked once, when it arrives, against both at once: it takes one
request and its tokens (the prompt's estimate plus the ``max_tokens`` it asks for, as
OpenAI counts) or is refused, taking nothing.  A call larger than the tokens bucket
itself (but within the per-minute limit) is admitted when the bucket is full, which it
then owes (the bucket goes below zero and refills at the rate): big calls are paced, not
refused forever.  A call larger than the per-minute limit is refused as too large.
``refuse(n)`` has the next ``n`` calls refused for their rate whatever the buckets hold,
with a retry-after of one request's time: the 429 a provider whose bucket is out of
phase with the caller's sends.

Thread-safe: the server's handler threads share one account.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Mode = Literal["normal", "quota"]
MODES: tuple[Mode, ...] = ("normal", "quota")

Refusal = Literal["", "requests", "tokens", "quota", "too_large"]
"""Why a call was refused ("": it was not): a bucket short, the quota mode, or a call
larger than the per-minute tokens limit."""


ROUNDING = 1e-9
"""Units a bucket may be short of by floating-point rounding alone, and still give."""


class TokenBucket:
    """``rate`` units a second, holding at most ``capacity``; starts full."""

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        if not rate > 0 or not capacity > 0:
            raise ValueError(f"a bucket needs a positive rate and capacity, not {rate}/{capacity}")
        self.rate = rate
        self.capacity = capacity
        self._level = capacity
        self._at = now

    def level(self, now: float) -> float:
        """What the bucket holds at ``now`` (below zero while a big call is owed)."""
        self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
        self._at = now
        return self._level

    def shortfall(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` may be taken (0: now).  More than the capacity may be
        taken once the bucket is full."""
        needed = min(amount, self.capacity)
        missing = needed - self.level(now)
        # Refilled to the last rounding error counts as refilled.
        return missing / self.rate if missing > ROUNDING else 0.0

    def take(self, amount: float, now: float) -> None:
        self._level = self.level(now) - amount

    def until_full(self, now: float) -> float:
        """Seconds until the bucket is full again (OpenAI's ``x-ratelimit-reset-*``)."""
        return max(0.0, (self.capacity - self.level(now)) / self.rate)


@dataclass(frozen=True)
class BucketState:
    """A bucket as a response's headers describe it."""

    limit: int
    remaining: int
    reset: float


@dataclass(frozen=True)
class Decision:
    """What the account says to one call: admitted, or refused (``refused`` names the
    bucket, ``quota`` or ``too_large``) with the seconds to wait; and both buckets after."""

    admitted: bool
    refused: Refusal = ""
    retry_after: float = 0.0
    requests: BucketState | None = None
    tokens: BucketState | None = None


@dataclass(frozen=True)
class Stats:
    """What the account saw since it started or was last reset.  Times are seconds since
    ``epoch`` (Unix time)."""

    epoch: float
    admitted: int
    rate_limited: int
    """429s refusing a call for its rate (requests or tokens, or too large)."""
    quota_refused: int
    """429s of the quota mode (``insufficient_quota``)."""
    max_concurrent: int
    """The most streams (or non-streaming answers) in flight at once."""
    admitted_at: list[float] = field(default_factory=list)
    per_second: dict[int, int] = field(default_factory=dict)
    """Calls admitted in each whole second since ``epoch``."""

    @property
    def refused(self) -> int:
        """Every 429 sent."""
        return self.rate_limited + self.quota_refused

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["per_second"] = {str(second): n for second, n in self.per_second.items()}
        data["refused"] = self.refused
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stats:
        return cls(
            epoch=float(data["epoch"]),
            admitted=int(data["admitted"]),
            rate_limited=int(data["rate_limited"]),
            quota_refused=int(data["quota_refused"]),
            max_concurrent=int(data["max_concurrent"]),
            admitted_at=[float(t) for t in data["admitted_at"]],
            per_second={int(s): int(n) for s, n in data["per_second"].items()},
        )


class ProviderAccount:
    """The limits of one provider account (``rpm``, ``tpm``: None for no limit), each
    bucket holding ``burst`` seconds of its rate."""

    def __init__(
        self,
        *,
        rpm: int | None,
        tpm: int | None,
        burst: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (("rpm", rpm), ("tpm", tpm)):
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise ValueError(f"{name} must be a positive number or None, not {value!r}")
        if not burst > 0:
            raise ValueError(f"burst must be a positive number of seconds, not {burst!r}")
        self.rpm = rpm
        self.tpm = tpm
        self.burst = burst
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self._requests = TokenBucket(rpm / 60, rpm / 60 * burst, now) if rpm else None
        self._tokens = TokenBucket(tpm / 60, tpm / 60 * burst, now) if tpm else None
        self._mode: Mode = "normal"
        self._refusals_due = 0
        self._in_flight = 0
        self._max_concurrent = 0
        self._epoch = now
        self._epoch_wall = time.time()
        self._admitted_at: list[float] = []
        self._per_second: Counter[int] = Counter()
        self._rate_limited = 0
        self._quota_refused = 0

    # ------------------------------------------------------------------ admission

    def admit(self, tokens: int) -> Decision:
        """Check one arriving call asking for ``tokens``: take its request and tokens from
        both buckets, or refuse it taking nothing."""
        with self._lock:
            now = self._clock()
            refused, wait = self._refusal(tokens, now)
            if not refused:
                for bucket, amount in ((self._requests, 1), (self._tokens, tokens)):
                    if bucket is not None:
                        bucket.take(amount, now)
                self._count_admission(now)
            elif refused == "quota":
                self._quota_refused += 1
            else:
                self._rate_limited += 1
            return Decision(
                admitted=not refused,
                refused=refused,
                retry_after=wait,
                requests=self._state(self._requests, self.rpm, now),
                tokens=self._state(self._tokens, self.tpm, now),
            )

    def _refusal(self, tokens: int, now: float) -> tuple[Refusal, float]:
        if self._mode == "quota":
            return "quota", 0.0
        if self._refusals_due > 0:
            self._refusals_due -= 1
            return "requests", 60 / self.rpm if self.rpm else 1.0
        if self.tpm is not None and tokens > self.tpm:
            return "too_large", 0.0
        buckets: tuple[tuple[Refusal, TokenBucket | None, int], ...] = (
            ("requests", self._requests, 1),
            ("tokens", self._tokens, tokens),
        )
        waits = [
            (name, bucket.shortfall(amount, now))
            for name, bucket, amount in buckets
            if bucket is not None
        ]
        short = [(name, wait) for name, wait in waits if wait > 0]
        if not short:
            return "", 0.0
        # Name the bucket that keeps the call waiting longest, and wait for both.
        name, wait = max(short, key=lambda item: item[1])
        return name, wait

    @staticmethod
    def _state(bucket: TokenBucket | None, limit: int | None, now: float) -> BucketState | None:
        if bucket is None or limit is None:
            return None
        return BucketState(
            limit=limit,
            remaining=max(0, math.floor(bucket.level(now))),
            reset=bucket.until_full(now),
        )

    # ------------------------------------------------------------------ streams in flight

    def stream_started(self) -> None:
        with self._lock:
            self._in_flight += 1
            self._max_concurrent = max(self._max_concurrent, self._in_flight)

    def stream_ended(self) -> None:
        with self._lock:
            self._in_flight -= 1

    # ------------------------------------------------------------------ mode and stats

    @property
    def mode(self) -> Mode:
        return self._mode

    def set_mode(self, mode: str) -> None:
        """``quota``: refuse every call with ``insufficient_quota``; ``normal``: the limits."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        with self._lock:
            self._mode = next(m for m in MODES if m == mode)

    def refuse(self, calls: int) -> None:
        """Refuse the next ``calls`` calls for their rate, whatever the buckets hold."""
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise ValueError(f"calls must be a whole number >= 0, not {calls!r}")
        with self._lock:
            self._refusals_due = calls

    def stats(self) -> Stats:
        with self._lock:
            return Stats(
                epoch=self._epoch_wall,
                admitted=len(self._admitted_at),
                rate_limited=self._rate_limited,
                quota_refused=self._quota_refused,
                max_concurrent=self._max_concurrent,
                admitted_at=list(self._admitted_at),
                per_second=dict(sorted(self._per_second.items())),
            )

    def reset_stats(self) -> None:
        """Start counting afresh (the buckets keep their levels: the account is the same)."""
        with self._lock:
            self._reset_stats_locked()

    def _reset_stats_locked(self) -> None:
        self._epoch = self._clock()
        self._epoch_wall = time.time()
        self._admitted_at = []
        self._per_second = Counter()
        self._rate_limited = 0
        self._quota_refused = 0
        self._max_concurrent = self._in_flight  # streams still running count

    def _count_admission(self, now: float) -> None:
        since = now - self._epoch
        self._admitted_at.append(since)
        self._per_second[int(since)] += 1
