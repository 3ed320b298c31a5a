"""parley's identifiers: fresh ones, and the check of those a caller gives before any
query runs."""

from __future__ import annotations

import uuid

from parley.schemas.errors import InvalidRequest


def new_id() -> str:
    """A fresh identifier for a session, turn or run."""
    return str(uuid.uuid4())


def validate_ids(*ids: str | None) -> None:
    """Reject ids that cannot be parley ids before any query runs (PostgreSQL cannot
    even compare text with a NUL or a lone surrogate in it: it fails the query)."""
    for value in ids:
        if not isinstance(value, str) or not value or len(value) > 36 or not storable(value):
            raise InvalidRequest(f"not a parley id: {value!r}")


def storable(text: str) -> bool:
    """Whether both databases keep ``text`` as it is: no NUL (PostgreSQL refuses it in
    text and JSON) and no lone surrogate (not UTF-8, so neither driver can send it)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
