"""The arithmetic of the rate-limited server's account, on a clock the test moves: buckets
of ``burst`` seconds refilled continuously, both checked at once, big calls paced by debt,
and the stats."""

from __future__ import annotations

import pytest

from tests.providers.account import ProviderAccount


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_holds_burst_seconds_of_its_rate_and_refills_continuously() -> None:
    clock = Clock()
    account = ProviderAccount(rpm=600, tpm=None, burst=2.0, clock=clock)  # 10 a second
    assert all(account.admit(0).admitted for _ in range(20))
    refused = account.admit(0)
    assert (refused.admitted, refused.refused) == (False, "requests")
    assert refused.retry_after == pytest.approx(0.1)
    assert refused.requests is not None and refused.requests.remaining == 0
    assert refused.requests.reset == pytest.approx(2.0)
    clock.now += 0.05
    assert not account.admit(0).admitted
    clock.now += 0.05
    admitted = account.admit(0)
    assert admitted.admitted and admitted.tokens is None  # no tokens limit, no tokens state


def test_a_call_refused_by_one_bucket_takes_nothing_from_the_other() -> None:
    clock = Clock()
    account = ProviderAccount(rpm=60, tpm=6000, clock=clock)  # 1 request, 100 tokens
    big = account.admit(101)  # more than the tokens bucket holds: it is full, so
    assert big.admitted  # the call goes through, and the bucket owes the excess
    assert big.tokens is not None and big.tokens.remaining == 0
    clock.now += 1.0  # the request is back; the tokens are 1 short (-1 + 100)
    waiting = account.admit(100)
    assert waiting.refused == "tokens" and waiting.retry_after == pytest.approx(0.01)
    assert waiting.requests is not None and waiting.requests.remaining == 1  # not taken
    clock.now += 0.01
    assert account.admit(100).admitted


def test_a_call_larger_than_the_minute_is_refused_as_too_large() -> None:
    account = ProviderAccount(rpm=None, tpm=6000, clock=Clock())
    assert account.admit(6001).refused == "too_large"
    assert account.admit(6000).admitted  # the bucket was full: admitted, then owed


def test_the_quota_mode_refuses_everything_and_counts_apart() -> None:
    account = ProviderAccount(rpm=60, tpm=None, clock=Clock())
    account.set_mode("quota")
    assert account.admit(1).refused == "quota"
    account.set_mode("normal")
    assert account.admit(1).admitted  # the refused call took nothing
    stats = account.stats()
    assert (stats.admitted, stats.rate_limited, stats.quota_refused) == (1, 0, 1)


def test_stats_count_admissions_by_second_and_reset_keeps_the_buckets() -> None:
    clock = Clock()
    account = ProviderAccount(rpm=6000, tpm=None, clock=clock)  # 100 a second
    for _ in range(5):
        account.admit(0)
        clock.now += 0.4
        account.stream_started()
    stats = account.stats()
    assert stats.per_second == {0: 3, 1: 2}
    assert stats.admitted_at == pytest.approx([0.0, 0.4, 0.8, 1.2, 1.6])
    assert stats.max_concurrent == 5
    for _ in range(3):
        account.stream_ended()
    account.reset_stats()
    after = account.stats()
    assert (after.admitted, after.max_concurrent, after.per_second) == (0, 2, {})
    assert account.admit(0).requests is not None
    assert account.stats().to_json()["per_second"] == {"0": 1}
