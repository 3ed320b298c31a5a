"""An upload's admission (``POST /v1/files``, docs/security.md#4-uploads): what it may be
before a byte of it is read, how much of the gateway it may hold, and how long it may
take to arrive.

FastAPI reads a multipart body whole before the route runs, spooling a file past a MiB
to a temporary file (in ``TMPDIR``), so everything about an upload is decided here,
from its head, after its token (``authentication.py``):

- it is ``multipart/form-data`` with a ``Content-Length`` (``415``, ``411``) of at most
  ``PARLEY_GATEWAY_MAX_FILE`` bytes (``413``);
- its tenant has fewer than ``PARLEY_GATEWAY_TENANT_UPLOADS`` uploads in flight in this
  process (``429``, ``Retry-After``);
- the uploads in flight in this process, this one with them, declare at most
  ``PARLEY_GATEWAY_UPLOAD_SPOOL`` bytes (``503``, ``Retry-After``): the temporary files
  never outgrow it;
- the tenant's stored files, its uploads in flight here and this one fit its quota,
  ``PARLEY_TENANT_STORAGE`` (``413``; the store checks again as it commits the file,
  fleet-wide: :meth:`parley.store.files.FileStore.create_file`);

and then its body must have arrived within ``PARLEY_GATEWAY_BODY_TIMEOUT`` seconds, or
as long as its size takes at ``PARLEY_GATEWAY_UPLOAD_RATE`` bytes a second if that is
longer: else ``408``, the connection closed, and nothing stored.  Sizes are the declared
lengths, the multipart framing included.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from parley.gateway.authentication import tenant_of
from parley.gateway.errors import GatewayError, refusal

SPOOL_RETRY_SECONDS = 5
"""What ``Retry-After`` says to an upload refused for the uploads in flight (the
tenant's, or all of them): an upload takes a while to end."""


@dataclass(frozen=True, kw_only=True)
class UploadBounds:
    """The bounds an upload is held to (the variables in the module docstring)."""

    max_file: int
    floor_seconds: float
    rate: int
    per_tenant: int
    spool: int
    quota: int

    def seconds(self, size: int) -> float:
        """How long an upload of ``size`` bytes may take to arrive."""
        return max(self.floor_seconds, size / self.rate)


class UploadLimits:
    """ASGI middleware: ``POST`` to ``paths`` is admitted as the module docstring says;
    ``stored`` is the bytes a tenant's files hold (blocking: a read of the store)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        paths: frozenset[str],
        bounds: UploadBounds,
        stored: Callable[[str], int],
    ) -> None:
        self.app = app
        self.paths = paths
        self.bounds = bounds
        self.stored = stored
        # Declared bytes, and uploads, in flight per tenant (changed on the event loop only).
        self.bytes: Counter[str] = Counter()
        self.uploads: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tenant = tenant_of(scope) if scope["type"] == "http" else None
        if tenant is None or scope["method"] != "POST" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        size = self._declared(scope)
        if isinstance(size, GatewayError):
            await refusal(scope, size, unread_body=True)(scope, receive, send)
            return
        refused = self._in_flight_refusal(tenant, size)
        if refused is not None:
            await refusal(scope, refused, unread_body=True)(scope, receive, send)
            return
        # Held before anything awaits: a second upload sees this one's bytes.
        self.bytes[tenant] += size
        self.uploads[tenant] += 1
        try:
            refused = await self._quota_refusal(tenant, size)
            if refused is not None:
                await refusal(scope, refused, unread_body=True)(scope, receive, send)
                return
            await self._within_deadline(scope, receive, send, self.bounds.seconds(size))
        finally:
            for held, amount in ((self.bytes, size), (self.uploads, 1)):
                held[tenant] -= amount
                if not held[tenant]:
                    del held[tenant]

    def _declared(self, scope: Scope) -> int | GatewayError:
        """The upload's declared size, or why its head refuses it."""
        headers = dict(scope["headers"])
        kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if kind != b"multipart/form-data":
            return GatewayError(
                415,
                "UnsupportedMediaType",
                "send the file as multipart/form-data (file, purpose)",
            )
        declared = headers.get(b"content-length")
        if declared is None:
            return GatewayError(411, "LengthRequired", "an upload declares its Content-Length")
        try:
            size = int(declared)
        except ValueError:
            return GatewayError(400, "InvalidRequest", "Content-Length is not a number")
        if size > self.bounds.max_file:
            return GatewayError(
                413,
                "PayloadTooLarge",
                f"the file is over the limit of {self.bounds.max_file} bytes "
                "(PARLEY_GATEWAY_MAX_FILE)",
            )
        return size

    def _in_flight_refusal(self, tenant: str, size: int) -> GatewayError | None:
        """Why this process cannot take the upload now, if it cannot."""
        if self.uploads[tenant] >= self.bounds.per_tenant:
            return GatewayError(
                429,
                "TooManyRequests",
                f"this tenant has {self.uploads[tenant]} uploads in flight, the most "
                "PARLEY_GATEWAY_TENANT_UPLOADS allows; retry once one has ended",
                {"Retry-After": str(SPOOL_RETRY_SECONDS)},
            )
        spooling = sum(self.bytes.values())
        if spooling + size > self.bounds.spool:
            return GatewayError(
                503,
                "Unavailable",
                f"uploads in flight hold {spooling} bytes: with this one's {size} they "
                f"would pass PARLEY_GATEWAY_UPLOAD_SPOOL ({self.bounds.spool}); retry later",
                {"Retry-After": str(SPOOL_RETRY_SECONDS)},
            )
        return None

    async def _quota_refusal(self, tenant: str, size: int) -> GatewayError | None:
        """The refusal of an upload its tenant's quota has no room for, if it has none
        (this upload's bytes are among those in flight already)."""
        stored = await run_in_threadpool(self.stored, tenant)
        if stored + self.bytes[tenant] <= self.bounds.quota:
            return None
        return GatewayError(
            413,
            "StorageFull",
            f"this tenant's files hold {stored} bytes (and its uploads in flight "
            f"{self.bytes[tenant] - size}): this upload of {size} bytes would pass its "
            f"quota of {self.bounds.quota} (PARLEY_TENANT_STORAGE); delete files "
            "(DELETE /v1/files/{id}) to make room",
        )

    async def _within_deadline(
        self, scope: Scope, receive: Receive, send: Send, seconds: float
    ) -> None:
        """The route, with ``seconds`` for the body to arrive; ``408`` and the
        connection closed if it has not (the route's own work has no deadline)."""
        answered = False

        async def sending(message: Message) -> None:
            nonlocal answered
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        try:
            async with asyncio.timeout(seconds) as deadline:

                async def receiving() -> Message:
                    message = await receive()
                    if message["type"] != "http.request" or not message.get("more_body"):
                        deadline.reschedule(None)  # all of it is here, or the client left
                    return message

                await self.app(scope, receiving, sending)
        except TimeoutError:
            if answered:
                raise
            error = GatewayError(
                408,
                "RequestTimeout",
                f"the upload did not arrive within {seconds:.3g} s (its size at "
                "PARLEY_GATEWAY_UPLOAD_RATE bytes a second, and at least "
                "PARLEY_GATEWAY_BODY_TIMEOUT)",
            )
            await refusal(scope, error, unread_body=True)(scope, receive, send)


__all__ = ["UploadBounds", "UploadLimits"]
