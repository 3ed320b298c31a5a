"""The error a network model raises when its provider failed, classified for retrying.

Two phases fail differently.  Before the stream starts (connection refused, 429, 5xx, a
timeout waiting for the response headers) the official client has already retried with
its own backoff, honouring ``Retry-After``; what reaches parley is final for that provider,
so it is *not* ``retriable`` and :class:`~parley.models.fallover.Fallover` moves on to the
next provider.  Once the stream has started, the client cannot retry (it has handed the
stream over), so a cut connection, a stalled read, a malformed chunk or an error event
mid-stream is ``retriable``: asking the same provider again is likely to work.
"""

from __future__ import annotations

from typing import Literal

from parley.errors import ParleyError

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


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with every occurrence of each secret replaced: a server may echo the key
    it was sent (in an error body, say), and error texts end up in logs and the store."""
    for secret in secrets:
        # Very short "secrets" (a placeholder such as "x" for a local server) would shred
        # ordinary words without protecting anything.
        if secret and len(secret) >= 6:
            text = text.replace(secret, _REDACTED)
    return text
