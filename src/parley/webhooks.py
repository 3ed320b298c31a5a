"""Webhooks (docs/operations.md#webhooks): posting each turn's end from the
durable outbox (:mod:`parley.store.outbox`), signed, at least once, never in a turn's way.

The deliverer runs in ``parley beat`` on a fleet and on a thread of the embedded client.
Each pass claims the due deliveries (a claim counts the attempt and leases the row), posts
them concurrently with httpx, and records each outcome: a 2xx answer delivers it; anything
else (another status, a timeout, a refused connection) schedules the next attempt after
an exponential backoff with jitter, until the attempts run out and it is given up.  The
POST's body is the delivery's JSON (:meth:`WebhookDelivery.payload`), the same bytes on
every attempt, signed with HMAC-SHA256 under ``PARLEY_WEBHOOK_SECRET``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import time
import urllib.parse
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx2

from parley.errors import InvalidRequest
from parley.schemas.operations import WebhookDelivery
from parley.settings import Settings
from parley.store.outbox import OutboxStore

log = logging.getLogger("parley.webhooks")

SIGNATURE_HEADER = "X-Parley-Signature"
DELIVERY_HEADER = "X-Parley-Delivery"
EVENT_HEADER = "X-Parley-Event"
ATTEMPT_HEADER = "X-Parley-Attempt"
A2A_TOKEN_HEADER = "X-A2A-Notification-Token"
MAX_URL_CHARS = 2_000
ERROR_CHARS = 500
NO_SECRET_LOOK_SECONDS = 60.0
LEASE_MARGIN_SECONDS = 5.0
"""How long past its timeout a claimed delivery stays leased: a deliverer killed
mid-post leaves it due again this long after its timeout."""


def check_webhook_url(value: Any, what: str = "webhook_url") -> str | None:
    """``value`` as a webhook URL: ``http`` or ``https`` with a host (or None);
    :class:`InvalidRequest` for anything else."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_URL_CHARS:
        raise InvalidRequest(f"{what} must be an http(s) URL of at most {MAX_URL_CHARS} characters")
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 (raises for a port that is not a number)
    except ValueError as exc:
        raise InvalidRequest(f"{what} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"{what} must be an http or https URL with a host, not {value!r}")
    if any(ch.isspace() or ord(ch) < 32 for ch in value):
        raise InvalidRequest(f"{what} must not contain spaces or control characters")
    return value


def body_of(delivery: WebhookDelivery) -> bytes:
    """The POST's body: the same bytes on every attempt of a delivery."""
    return json.dumps(delivery.payload(), sort_keys=True, separators=(",", ":")).encode()


def signature(secret: str, body: bytes) -> str:
    """The ``X-Parley-Signature`` header's value: ``sha256=`` and the hex HMAC-SHA256 of
    the raw body under the secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """What a receiver checks (in constant time): ``header`` signs ``body``."""
    return header is not None and hmac.compare_digest(signature(secret, body), header)


_DEFAULTS = Settings()


@dataclass(frozen=True, kw_only=True)
class WebhookSettings:
    """The deliverer's configuration (its defaults: those of :class:`Settings`)."""

    secret: str | None
    timeout: float = _DEFAULTS.webhook_timeout
    max_attempts: int = _DEFAULTS.webhook_max_attempts
    backoff: float = _DEFAULTS.webhook_backoff
    max_backoff: float = _DEFAULTS.webhook_max_backoff
    concurrency: int = _DEFAULTS.webhook_concurrency
    poll: float = 1.0

    @classmethod
    def from_settings(cls, settings: Settings) -> WebhookSettings:
        """``PARLEY_WEBHOOK_SECRET``, ``PARLEY_WEBHOOK_TIMEOUT`` (seconds a POST may take),
        ``PARLEY_WEBHOOK_MAX_ATTEMPTS``, ``PARLEY_WEBHOOK_BACKOFF`` (the first retry's
        delay, doubling), ``PARLEY_WEBHOOK_MAX_BACKOFF`` and ``PARLEY_WEBHOOK_CONCURRENCY``
        (posts at once), as ``settings`` read them."""
        return cls(
            secret=settings.webhook_secret,
            timeout=settings.webhook_timeout,
            max_attempts=settings.webhook_max_attempts,
            backoff=settings.webhook_backoff,
            max_backoff=settings.webhook_max_backoff,
            concurrency=settings.webhook_concurrency,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WebhookSettings:
        """The deliverer's settings ``env`` names (:meth:`from_settings`)."""
        return cls.from_settings(Settings.from_environment(env))

    def retry_delay(self, attempts: int, rng: random.Random | None = None) -> float:
        """Seconds before the next attempt after ``attempts`` failed ones: the backoff
        doubling per attempt up to its ceiling, then a random half of it taken off
        ("equal jitter"), so that many deliveries failing together do not retry together."""
        ceiling = min(self.max_backoff, self.backoff * 2.0 ** min(max(attempts - 1, 0), 64))
        jitter: float = (rng or random).uniform(0, ceiling / 2)
        return ceiling / 2 + jitter

    @property
    def lease(self) -> timedelta:
        """How long a claimed delivery waits for its outcome before it is due again."""
        return timedelta(seconds=self.timeout + LEASE_MARGIN_SECONDS)


class WebhookDeliverer:
    """Posts due deliveries from the outbox (see the module docstring)."""

    def __init__(self, store: OutboxStore, settings: WebhookSettings) -> None:
        self.store = store
        self.settings = settings
        self._http = httpx2.Client(timeout=settings.timeout, follow_redirects=False)
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="parley-webhook")
        self._warned = False
        self._next_look = 0.0

    def close(self) -> None:
        """Stop posting (a post under way finishes) and release the connections."""
        self._pool.shutdown(wait=True)
        self._http.close()

    def deliver_due(self) -> int:
        """One pass: claim up to ``concurrency`` due deliveries and post them; returns how
        many were claimed (a full pass means more may be due)."""
        secret = self.settings.secret
        if secret is None:
            # Nothing is sent unsigned.  Said once, when there is something to send (a
            # deliverer started for retention alone has nothing to say).
            now = time.monotonic()
            if not self._warned and now >= self._next_look:
                self._next_look = now + NO_SECRET_LOOK_SECONDS
                if self.store.has_unsettled_deliveries():
                    log.error("webhook deliveries wait: PARLEY_WEBHOOK_SECRET is not set")
                    self._warned = True
            return 0
        lease_until = datetime.now(UTC) + self.settings.lease
        claimed = self.store.claim_due(limit=self.settings.concurrency, lease_until=lease_until)
        list(self._pool.map(lambda d: self._attempt(d, secret), claimed))  # each records itself
        return len(claimed)

    def _attempt(self, delivery: WebhookDelivery, secret: str) -> None:
        """Post one delivery and record how it went; never raises (a failure to record is
        logged: the lease makes the delivery due again)."""
        try:
            status, error = self._post(delivery, secret)
            if error is None:
                self.store.record_delivered(delivery.delivery_id, status or 0)
                log.info(
                    "delivered webhook %s (turn %s, attempt %d): HTTP %s",
                    delivery.delivery_id,
                    delivery.turn_id,
                    delivery.attempts,
                    status,
                )
                return
            give_up = delivery.attempts >= self.settings.max_attempts
            retry_at = datetime.now(UTC) + timedelta(
                seconds=self.settings.retry_delay(delivery.attempts)
            )
            self.store.record_failed(
                delivery, status=status, error=error, retry_at=retry_at, give_up=give_up
            )
            log.warning(
                "webhook %s (turn %s) attempt %d failed: %s%s",
                delivery.delivery_id,
                delivery.turn_id,
                delivery.attempts,
                error,
                "; giving up" if give_up else f"; next at {retry_at.isoformat()}",
            )
        except Exception:
            log.warning("could not record webhook %s", delivery.delivery_id, exc_info=True)

    def _post(self, delivery: WebhookDelivery, secret: str) -> tuple[int | None, str | None]:
        """POST the delivery: its HTTP status and None for a 2xx answer, else the status
        (if any) and what went wrong."""
        body = body_of(delivery)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "parley-webhooks",
            SIGNATURE_HEADER: signature(secret, body),
            DELIVERY_HEADER: delivery.delivery_id,
            EVENT_HEADER: "turn.ended",
            ATTEMPT_HEADER: str(delivery.attempts),
        }
        if delivery.token is not None:
            # What an A2A receiver checks (docs/protocols.md#5-a2a): the token it gave.
            headers[A2A_TOKEN_HEADER] = delivery.token
        try:
            response = self._http.post(delivery.url, content=body, headers=headers)
        except httpx2.TimeoutException:
            return None, f"timed out after {self.settings.timeout:g} s"
        except httpx2.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        if 200 <= response.status_code < 300:
            return response.status_code, None
        text = response.text.strip().replace("\n", " ")
        return response.status_code, f"HTTP {response.status_code}: {text}"[:ERROR_CHARS]
