"""The store's clock: every time the store writes or compares is timezone-aware UTC."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now() -> datetime:
    """Now, in UTC."""
    return datetime.now(UTC)
