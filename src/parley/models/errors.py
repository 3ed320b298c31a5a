"""The errors a network model raises when its provider failed, classified for retrying.

Two phases fail differently.  Before the stream starts (connection refused, 5xx, a timeout
waiting for the response headers) the official client has already retried with its own
backoff; what reaches parley is final for that provider, so it is *not* ``retriable`` and
:class:`~parley.models.fallover.Fallover` moves on to the next provider.  Once the stream
has started, the client cannot retry (it has handed the stream over), so a cut connection,
a stalled read, a malformed chunk or an error event mid-stream is ``retriable``: asking
the same provider again is likely to work.

A 429 is parley's, not the client's: the clients are told not to retry it (they would
sleep inside a worker's slot, unseen by the fleet's admission), and it is raised at once
as :class:`RateLimited`, a :class:`~parley.ports.host.ModelThrottled` carrying the
provider's retry delay and limits, for admission to slow the model fleet-wide and ask
again later.  A refusal that says the account's quota or credit is spent is not a rate:
it is a plain :class:`ProviderError` that says so (:func:`quota_exhausted`), since
retrying will not help.
"""

from __future__ import annotations

from typing import Literal

from parley.errors import ParleyError
from parley.ports.admission import Limits
from parley.ports.host import ModelThrottled

Phase = Literal["request", "stream"]

_REDACTED = "[redacted]"


class ProviderError(ParleyError):
    """A model provider failed.  ``provider`` names the model (e.g. ``openai:gpt-4o``),
    ``status`` is the HTTP status when there was one, ``phase`` says whether the failure
    came before the stream started or during it, and ``retriable`` whether asking the same
    provider again may help.  The message never contains the provider's credentials."""

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        retriable: bool,
        phase: Phase,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.retriable = retriable
        self.phase = phase
        self.status = status


class RateLimited(ProviderError, ModelThrottled):
    """The provider refused the call for its rate (HTTP 429), before anything streamed.
    ``retry_after`` is the provider's delay in seconds (``retry-after-ms``, else
    ``retry-after``, else the reset of its exhausted bucket; None: it named none) and
    ``limits`` the model's limits as the refusal's headers reported them.  Not
    ``retriable`` on the same provider: :class:`~parley.models.fallover.Fallover` moves on
    to the next, and the engine asks again after the delay."""

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        retry_after: float | None = None,
        limits: Limits | None = None,
    ) -> None:
        ProviderError.__init__(
            self, message, provider=provider, retriable=False, phase="request", status=429
        )
        self.retry_after = retry_after
        self.limits = limits


def quota_exhausted(provider: str, status: int, detail: str) -> ProviderError:
    """The error for a refusal that says the account's quota or credit is spent: final,
    and said so, for the turn to fail at once rather than wait for a rate to recover."""
    return ProviderError(
        f"{provider}: HTTP {status}: the provider's quota (credit) is exhausted: {detail} "
        "(retrying will not help until the account's quota is raised or its credit topped up)",
        provider=provider,
        retriable=False,
        phase="request",
        status=status,
    )


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with every occurrence of each secret replaced: a server may echo the key
    it was sent (in an error body, say), and error texts end up in logs and the store."""
    for secret in secrets:
        # Very short "secrets" (a placeholder such as "x" for a local server) would shred
        # ordinary words without protecting anything.
        if secret and len(secret) >= 6:
            text = text.replace(secret, _REDACTED)
    return text
