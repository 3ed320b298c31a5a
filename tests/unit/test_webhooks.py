"""What a webhook receiver relies on, without services: the signature's exact format, a
body that is the same bytes on every attempt, the retry schedule, and clear errors for a
bad URL or a bad setting."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
from datetime import UTC, datetime, timedelta

import pytest

from parley.errors import InvalidRequest
from parley.schemas.operations import DeliveryState, WebhookDelivery
from parley.webhooks import (
    WebhookSettings,
    body_of,
    check_webhook_url,
    signature,
    verify,
)

ENDED = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def delivery(**changes: object) -> WebhookDelivery:
    values: dict[str, object] = {
        "delivery_id": "d-1",
        "session_id": "s-1",
        "turn_id": "t-1",
        "run_id": "r-1",
        "url": "http://127.0.0.1:9/hook",
        "outcome": "finished",
        "reply": "héllo \u2603",
        "error": None,
        "steps": 2,
        "input_tokens": 11,
        "output_tokens": 7,
        "ended_at": ENDED,
        "created_at": ENDED,
        "attempts": 1,
        "next_attempt_at": ENDED,
        "last_attempt_at": None,
        "last_status": None,
        "last_error": None,
        "delivered_at": None,
        "given_up_at": None,
    }
    values.update(changes)
    return WebhookDelivery(**values)  # type: ignore[arg-type]


def test_the_signature_is_sha256_hex_hmac_of_the_raw_body_under_the_secret() -> None:
    body = body_of(delivery())
    expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert signature("s3cret", body) == f"sha256={expected}"
    assert verify("s3cret", body, f"sha256={expected}")
    assert not verify("other", body, f"sha256={expected}")
    assert not verify("s3cret", body + b" ", f"sha256={expected}")
    assert not verify("s3cret", body, None)


def test_the_body_names_the_turn_and_is_the_same_bytes_on_every_attempt() -> None:
    first, later = body_of(delivery()), body_of(delivery(attempts=5, last_error="HTTP 500"))
    assert first == later
    assert json.loads(first) == {
        "delivery_id": "d-1",
        "event": "turn.ended",
        "session_id": "s-1",
        "turn_id": "t-1",
        "run_id": "r-1",
        "outcome": "finished",
        "reply": "héllo \u2603",
        "error": None,
        "steps": 2,
        "usage": {"input_tokens": 11, "output_tokens": 7},
        "ended_at": "2026-01-02T03:04:05.678901+00:00",
    }


def test_a_deliverys_state_is_told_by_its_timestamps() -> None:
    assert delivery().state is DeliveryState.PENDING
    assert delivery(delivered_at=ENDED).state is DeliveryState.DELIVERED
    assert delivery(given_up_at=ENDED).state is DeliveryState.GIVEN_UP


def test_retries_back_off_exponentially_with_jitter_up_to_a_ceiling() -> None:
    settings = WebhookSettings(secret="x", backoff=1.0, max_backoff=60.0)
    rng = random.Random(7)
    for attempts, ceiling in [(1, 1), (2, 2), (3, 4), (6, 32), (7, 60), (40, 60), (10_000, 60)]:
        delays = [settings.retry_delay(attempts, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (attempts, min(delays))
        assert max(delays) - min(delays) > ceiling / 10  # jittered, not in lockstep
    assert settings.lease == timedelta(seconds=settings.timeout + 5)


def test_settings_come_from_the_environment_and_bad_ones_are_clear_errors() -> None:
    settings = WebhookSettings.from_env(
        {
            "PARLEY_WEBHOOK_SECRET": "k",
            "PARLEY_WEBHOOK_TIMEOUT": "2.5",
            "PARLEY_WEBHOOK_MAX_ATTEMPTS": "3",
            "PARLEY_WEBHOOK_BACKOFF": "0.1",
            "PARLEY_WEBHOOK_MAX_BACKOFF": "9",
            "PARLEY_WEBHOOK_CONCURRENCY": "2",
        }
    )
    assert (settings.secret, settings.timeout, settings.max_attempts) == ("k", 2.5, 3)
    assert (settings.backoff, settings.max_backoff, settings.concurrency) == (0.1, 9, 2)
    defaults = WebhookSettings.from_env({})
    assert defaults.secret is None and defaults.max_attempts == 40 and defaults.timeout == 10
    for name, value in [
        ("PARLEY_WEBHOOK_TIMEOUT", "soon"),
        ("PARLEY_WEBHOOK_TIMEOUT", "-1"),
        ("PARLEY_WEBHOOK_MAX_ATTEMPTS", "2.5"),
        ("PARLEY_WEBHOOK_CONCURRENCY", "0"),
        ("PARLEY_WEBHOOK_BACKOFF", "inf"),
    ]:
        with pytest.raises(InvalidRequest, match=name):
            WebhookSettings.from_env({name: value})


@pytest.mark.parametrize(
    "url", ["https://hooks.example.com/parley", "http://127.0.0.1:8080/x?y=1", "http://[::1]:9/"]
)
def test_an_http_or_https_url_with_a_host_is_a_webhook_url(url: str) -> None:
    assert check_webhook_url(url) == url
    assert check_webhook_url(None) is None


@pytest.mark.parametrize(
    "url",
    [
        "",
        "example.com/hook",
        "ftp://example.com/",
        "file:///etc/passwd",
        "http:///path",
        "http://exa mple.com/",
        "http://example.com:port/",
        "http://example.com/\n",
        "https://example.com/" + "x" * 2_000,
        b"http://example.com/",
        7,
    ],
)
def test_anything_else_is_refused(url: object) -> None:
    with pytest.raises(InvalidRequest, match="webhook_url"):
        check_webhook_url(url)
