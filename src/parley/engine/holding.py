"""The holding check: a driver asks whether it still holds its session's lock before
each thing only the session's one driver may do (a model call, a tool, the contract's
check)."""

from __future__ import annotations

from collections.abc import Callable

from parley.schemas.errors import Fenced


def ensure_holding(holding: Callable[[], bool], where: str) -> None:
    """Raise :class:`Fenced` once the session lock is gone: a driver that lost it must
    neither pay for another model call nor touch the workspace."""
    if not holding():
        raise Fenced(f"the session lock was lost {where}")
