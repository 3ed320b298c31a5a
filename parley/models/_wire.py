"""Small helpers shared by the HTTP providers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from parley.models.errors import ProviderError
from workers.ports.host import DeltaSink, ModelReply, ModelRequest

Item = TypeVar("Item")
Stream = TypeVar("Stream")

CLIENT_RETRIED = frozenset({408, 409, 429})
"""Statuses the official clients retry by themselves (besides 5xx) before giving up."""


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

    def _start(self, create: Callable[[], Stream]) -> Stream:
        """Open the stream; a client failure becomes this provider's final
        :class:`ProviderError` (the client has already retried it as far as it would)."""
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
            status: int = exc.status_code  # type: ignore[attr-defined]
            message = f"{self._name}: HTTP {status}: {self._redact(self._api_message(exc))}"
            if status in CLIENT_RETRIED or status >= 500:
                message += f" ({retried})"
            return ProviderError(
                message, provider=self._name, retriable=False, phase="request", status=status
            )
        if isinstance(exc, timeout_error):
            message = f"{self._name}: no response within {self._timeout}s ({retried})"
        elif isinstance(exc, connection_error):
            message = f"{self._name}: cannot connect: {self._redact(cause_text(exc))} ({retried})"
        else:
            message = f"{self._name}: {type(exc).__name__}: {self._redact(str(exc))}"
        return ProviderError(message, provider=self._name, retriable=False, phase="request")

    def _stream_error(self, exc: Exception) -> ProviderError:
        """A failure once streaming had begun, as this provider reports it."""
        raise NotImplementedError

    def _read(
        self,
        stream: AbstractContextManager[Iterable[Any]],
        assembly: Assembly,
        request: ModelRequest,
        on_delta: DeltaSink,
    ) -> ModelReply:
        """Read an opened stream to its end into ``assembly``; a stream that ends without
        the protocol's end marker is a retriable failure."""
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
        return assembly.reply(request, self._name)

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
