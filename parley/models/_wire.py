"""Small helpers shared by the HTTP providers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from parley.models.errors import ProviderError
from workers.ports import DeltaSink

Item = TypeVar("Item")


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


class ProviderModel:
    """What the HTTP providers share: a name, a model, an official client that alone
    holds the credentials, and a repr that shows neither key nor URL credentials."""

    _name: str
    _model: str
    _client: Any

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
