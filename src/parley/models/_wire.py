"""Small helpers shared by the HTTP providers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, ClassVar, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from parley.models.errors import ProviderError, RateLimited, quota_exhausted
from parley.models.rate_headers import limits_of, report_of, retry_delay
from parley.ports.host import DeltaSink, ModelReply, ModelRequest

Item = TypeVar("Item")
Stream = TypeVar("Stream")

CLIENT_RETRIED = frozenset({408, 409})
"""Statuses the official clients retry by themselves (besides 5xx) before giving up.  Not
429: the clients are told to leave it to parley (see :mod:`parley.models.errors`)."""

NO_CLIENT_RETRY = ("x-should-retry", "false")
"""The response header both official clients obey over their own retry rules
(``_should_retry`` in their ``_base_client``): set on every 429 as it arrives, so the client
raises it at once instead of sleeping through its ``retry-after`` inside a worker's slot."""


def cause_text(exc: BaseException) -> str:
    """The underlying transport error's text: a client's "Connection error." alone says
    nothing about what went wrong."""
    cause = exc.__cause__ or exc
    return f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__


def public_url(url: str) -> str:
    """``url`` without a ``user:password@`` part, fit for a repr or a log line."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def pump(
    stream: Iterable[Item],
    absorb: Callable[[Item], str],
    failures: tuple[type[Exception], ...],
    classify: Callable[[Exception], ProviderError],
    on_delta: DeltaSink,
) -> None:
    """Read a provider's stream to its end: ``absorb`` each item (returning its text
    delta), hand each delta to ``on_delta`` as it arrives, and turn the ``failures`` of
    reading or absorbing into the provider's :class:`ProviderError`."""
    iterator = iter(stream)
    while True:
        failure: ProviderError | None = None
        try:
            piece = absorb(next(iterator))
        except StopIteration:
            return
        except failures as exc:
            failure = classify(exc)
        if failure is not None:
            # Raised outside the handler: the client's exception (whose text may hold the
            # key) must not ride along as the context.
            raise failure
        # Outside the try: what the sink raises (an interrupt, a lost lock) is not a
        # provider failure and must reach the engine untouched.
        if piece:
            on_delta(piece)


class _Response(Protocol):
    @property
    def headers(self) -> Mapping[str, str]: ...


class OpenedStream(AbstractContextManager[Iterable[Any]], Protocol):
    """A client's open stream (``openai.Stream``, ``anthropic.Stream``): read in a
    ``with``, and the HTTP response it came with."""

    @property
    def response(self) -> _Response: ...


class Assembly(Protocol):
    """A provider's answer being put together from its stream."""

    finished: bool
    """The protocol's end marker arrived."""

    def absorb(self, item: Any) -> str:
        """Take one stream item in; returns its text delta."""
        ...

    def reply(self, request: ModelRequest, model: str) -> ModelReply:
        """The finished answer."""
        ...


class ProviderModel:
    """What the HTTP providers share: a name, a model, an official client that alone
    holds the credentials, a repr that shows neither key nor URL credentials, and how a
    failure before the stream starts is reported.  Both official clients raise the same
    shapes of error; a subclass names its library's classes in ``client_errors`` (base,
    status, timeout, connection) and says how to read a status error's message."""

    client_errors: ClassVar[
        tuple[type[Exception], type[Exception], type[Exception], type[Exception]]
    ]
    stream_failures: ClassVar[tuple[type[Exception], ...]]
    """What reading or absorbing an open stream may raise (each becomes a ProviderError)."""
    end_marker: ClassVar[str]
    """The protocol's sign that the answer is complete, named in errors."""
    _name: str
    _model: str
    _client: Any
    _timeout: float
    _max_retries: int

    def _redact(self, text: str) -> str:
        """``text`` without the client's credentials."""
        raise NotImplementedError

    def _api_message(self, exc: Any) -> str:
        """The provider's own message in a status error."""
        raise NotImplementedError

    def _is_quota(self, exc: Any) -> bool:
        """Whether a status error says the account's quota or credit is spent (which no
        wait will mend), as this provider says it."""
        raise NotImplementedError

    def _start(self, create: Callable[[], Stream]) -> Stream:
        """Open the stream; a client failure becomes this provider's final
        :class:`ProviderError` (the client has already retried what it retries), a 429
        :class:`RateLimited`."""
        failure: ProviderError | None = None
        try:
            return create()
        except self.client_errors[0] as exc:
            failure = self._request_error(exc)
        # Raised outside the handler: the client's exception (whose text may hold the key)
        # must not ride along as the context.
        raise failure

    def _request_error(self, exc: Exception) -> ProviderError:
        _base, status_error, timeout_error, connection_error = self.client_errors
        retried = f"after the client's {self._max_retries} retries"
        if isinstance(exc, status_error):
            return self._status_error(exc)
        if isinstance(exc, timeout_error):
            message = f"{self._name}: no response within {self._timeout}s ({retried})"
        elif isinstance(exc, connection_error):
            message = f"{self._name}: cannot connect: {self._redact(cause_text(exc))} ({retried})"
        else:
            message = f"{self._name}: {type(exc).__name__}: {self._redact(str(exc))}"
        return ProviderError(message, provider=self._name, retriable=False, phase="request")

    def _status_error(self, exc: Any) -> ProviderError:
        """An HTTP error status: a spent quota, a rate limit (:class:`RateLimited`, with
        the delay and limits its headers give), or a failure final for this provider."""
        status: int = exc.status_code
        detail = self._redact(self._api_message(exc))
        if self._is_quota(exc):
            return quota_exhausted(self._name, status, detail)
        if status == 429:
            headers: Mapping[str, str] = exc.response.headers
            delay = retry_delay(headers)
            wait = f"retry after {delay:g}s" if delay is not None else "no retry delay given"
            return RateLimited(
                f"{self._name}: HTTP 429: {detail} (rate limited; {wait})",
                provider=self._name,
                retry_after=delay,
                limits=limits_of(headers),
            )
        message = f"{self._name}: HTTP {status}: {detail}"
        if status in CLIENT_RETRIED or status >= 500:
            message += f" (after the client's {self._max_retries} retries)"
        return ProviderError(
            message, provider=self._name, retriable=False, phase="request", status=status
        )

    def _stream_error(self, exc: Exception) -> ProviderError:
        """A failure once streaming had begun, as this provider reports it."""
        raise NotImplementedError

    def _read(
        self,
        stream: OpenedStream,
        assembly: Assembly,
        request: ModelRequest,
        on_delta: DeltaSink,
    ) -> ModelReply:
        """Read an opened stream to its end into ``assembly``; a stream that ends without
        the protocol's end marker is a retriable failure.  What the response's rate-limit
        headers say goes to the sink before the first delta (for admission: the model's
        limits and what its buckets have left), and the reply carries the limits too."""
        on_delta.provider_report(report_of(stream.response.headers))
        with stream as items:
            pump(items, assembly.absorb, self.stream_failures, self._stream_error, on_delta)
        if not assembly.finished:
            raise ProviderError(
                f"{self._name}: the stream ended before the answer was finished "
                f"(no {self.end_marker})",
                provider=self._name,
                retriable=True,
                phase="stream",
            )
        reply = assembly.reply(request, self._name)
        return replace(reply, limits=limits_of(stream.response.headers))

    @property
    def name(self) -> str:
        """The label stored with each step, naming the provider and model."""
        return self._name

    @property
    def model(self) -> str:
        """The model name sent to the provider."""
        return self._model

    @property
    def base_url(self) -> str:
        """The endpoint, without any credentials embedded in the URL."""
        return public_url(str(self._client.base_url))

    def close(self) -> None:
        """Close the client's HTTP connections (the model must not be used after)."""
        self._client.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self._name!r}, base_url={self.base_url!r})"
