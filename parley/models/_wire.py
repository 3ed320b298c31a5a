"""Small helpers shared by the HTTP providers."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


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
