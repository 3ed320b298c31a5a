"""Reading providers' rate-limit headers: the limits they report and the delay a 429's
headers ask for, on the shapes OpenAI and Anthropic really send."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from parley.models.rate_headers import (
    Bucket,
    limits_of,
    parse_go_duration,
    read_rate_headers,
    retry_delay,
)
from parley.ports.admission import Limits

# OpenAI's own example (https://platform.openai.com/docs/guides/rate-limits#rate-limits-in-headers).
OPENAI = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-requests": "1s",
    "x-ratelimit-reset-tokens": "6m0s",
}

# A 200 from api.anthropic.com as it was captured (its headers' meaning:
# https://docs.anthropic.com/en/api/rate-limits#response-headers).
NOW = datetime(2025, 8, 21, 12, 40, 58, tzinfo=UTC).timestamp()
ANTHROPIC = {
    "anthropic-ratelimit-input-tokens-limit": "80000",
    "anthropic-ratelimit-input-tokens-remaining": "80000",
    "anthropic-ratelimit-input-tokens-reset": "2025-08-21T12:40:59Z",
    "anthropic-ratelimit-output-tokens-limit": "16000",
    "anthropic-ratelimit-output-tokens-remaining": "16000",
    "anthropic-ratelimit-output-tokens-reset": "2025-08-21T12:41:00Z",
    "anthropic-ratelimit-requests-limit": "1000",
    "anthropic-ratelimit-requests-remaining": "999",
    "anthropic-ratelimit-requests-reset": "2025-08-21T12:40:59Z",
    "anthropic-ratelimit-tokens-limit": "96000",
    "anthropic-ratelimit-tokens-remaining": "96000",
    "anthropic-ratelimit-tokens-reset": "2025-08-21T12:40:59Z",
    "request-id": "req_011CSLsW7mFqvHHnzrKdKjAE",
}


def test_openai_headers_give_requests_and_tokens_per_minute() -> None:
    report = read_rate_headers(OPENAI)
    assert report.limits == Limits(rpm=60, tpm=150_000)
    assert report.requests == Bucket(limit=60, remaining=59, reset=1.0)
    assert report.tokens == Bucket(limit=150_000, remaining=149_984, reset=360.0)
    assert retry_delay(OPENAI) is None  # nothing exhausted, no retry-after


def test_header_names_are_read_whatever_their_case() -> None:
    shouted = {name.upper(): value for name, value in OPENAI.items()}
    assert limits_of(shouted) == Limits(rpm=60, tpm=150_000)


def test_anthropic_headers_map_to_its_combined_tokens_limit() -> None:
    report = read_rate_headers(ANTHROPIC, now=NOW)
    assert report.limits == Limits(rpm=1000, tpm=96_000)
    assert report.requests == Bucket(limit=1000, remaining=999, reset=1.0)
    assert report.output_tokens == Bucket(limit=16_000, remaining=16_000, reset=2.0)


def test_without_the_combined_figure_anthropic_input_tokens_stand_for_tpm() -> None:
    split = {k: v for k, v in ANTHROPIC.items() if "-ratelimit-tokens-" not in k}
    assert limits_of(split) == Limits(rpm=1000, tpm=80_000)
    output_only = {k: v for k, v in split.items() if "input-tokens" not in k}
    assert limits_of(output_only) == Limits(rpm=1000)  # output alone is never the tpm


def test_retry_after_ms_comes_before_retry_after() -> None:
    assert retry_delay({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_delay({"Retry-After": "20"}) == 20.0
    assert retry_delay({"retry-after": "0.25"}) == 0.25


def test_retry_after_may_be_an_http_date() -> None:
    now = datetime(2015, 10, 21, 7, 27, 30, tzinfo=UTC).timestamp()
    assert retry_delay({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=now) == 30.0
    assert retry_delay({"retry-after": "Wed, 21 Oct 2015 07:00:00 GMT"}, now=now) == 0.0


def test_without_retry_after_the_exhausted_bucket_says_how_long() -> None:
    tokens_out = {**OPENAI, "x-ratelimit-remaining-tokens": "0"}
    assert retry_delay(tokens_out) == 360.0
    both_out = {**tokens_out, "x-ratelimit-remaining-requests": "0"}
    assert retry_delay(both_out) == 360.0  # the longer: both must have refilled
    unreadable = {**tokens_out, "retry-after": "soon", "retry-after-ms": "-3"}
    assert retry_delay(unreadable) == 360.0
    output_out = {**ANTHROPIC, "anthropic-ratelimit-output-tokens-remaining": "0"}
    assert retry_delay(output_out, now=NOW) == 2.0
    assert retry_delay({}) is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1m30.5s", 90.5),
        ("1h2m3s", 3723.0),
        ("17.283s", 17.283),
        ("0s", 0.0),
        ("250us", 0.00025),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "6 minutes", "s", "1x", "-1s", "1s junk"])
def test_what_is_not_a_go_duration(text: str) -> None:
    assert parse_go_duration(text) is None


def test_unreadable_headers_count_as_not_sent() -> None:
    for bad in ("0", "-5", "abc", "1.5", "inf", "nan"):
        assert limits_of({"x-ratelimit-limit-requests": bad}) is None
    assert limits_of({"x-ratelimit-limit-requests": "abc", "x-ratelimit-limit-tokens": "9"}) == (
        Limits(tpm=9)
    )
    assert read_rate_headers({"anthropic-ratelimit-requests-reset": "yesterday"}).requests == (
        Bucket()
    )
    # RFC 3339 always names its offset: a bare local time is not a reset instant.
    bare = {"anthropic-ratelimit-requests-reset": "2025-08-21T12:40:59"}
    assert read_rate_headers(bare).requests.reset is None
    assert limits_of({"content-type": "text/event-stream"}) is None
