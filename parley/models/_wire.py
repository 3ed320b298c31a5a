"""Small helpers shared by the HTTP providers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar
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
