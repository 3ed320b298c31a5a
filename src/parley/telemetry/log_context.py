"""The ids a log line is about: the session, turn and run that the code logging works on.

Set where work on a turn or session starts (a kick, a driver's claim, a gateway request)
rather than passed to each ``log.warning(...)``: every line logged inside the block, by
parley or by the libraries it calls, carries them (:mod:`parley.logs` puts them on the
record).  A context variable, so concurrent drivers on a threads pool and concurrent
requests on the gateway's event loop each see their own; a thread started inside a block
starts without them (Python does not copy a context into a new thread), as it should: it
works on something else.

Two kinds of block.  :func:`log_context` fixes its ids.  :func:`log_scope` (one gateway
request) is *open*: code inside it that resolves an id (the turn a route names, the turn
a submission made) adds it with :func:`bind`, and the lines logged afterwards in the same
request, its access line included, carry it.  :func:`bind` changes nothing inside a fixed
block, so a host's tool that submits a turn elsewhere cannot rename the turn its driver
logs about.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

LOG_IDS = ("session_id", "turn_id", "run_id")
"""The ids a line may carry, under these names."""


class _Scope:
    """One block's ids.  ``ids`` is replaced whole, never changed in place: a request's
    worker thread may bind while its event loop formats a line."""

    __slots__ = ("ids", "open")

    def __init__(self, ids: Mapping[str, str], *, open: bool) -> None:
        self.ids = ids
        self.open = open


_current: ContextVar[_Scope | None] = ContextVar("parley_log_ids", default=None)


def current_ids() -> Mapping[str, str]:
    """The ids of the innermost block (empty outside any)."""
    scope = _current.get()
    return scope.ids if scope is not None else {}


@contextmanager
def log_context(
    *, session_id: str | None = None, turn_id: str | None = None, run_id: str | None = None
) -> Iterator[None]:
    """Lines logged in the block carry these ids (and the enclosing block's others)."""
    with _enter(_given(session_id, turn_id, run_id), open=False):
        yield


@contextmanager
def log_scope() -> Iterator[None]:
    """An open block, with no ids of its own until :func:`bind` gives it some."""
    with _enter({}, open=True):
        yield


def bind(
    *, session_id: str | None = None, turn_id: str | None = None, run_id: str | None = None
) -> None:
    """Add ids to the innermost block if it is open (:func:`log_scope`); else nothing."""
    scope = _current.get()
    if scope is not None and scope.open:
        scope.ids = {**scope.ids, **_given(session_id, turn_id, run_id)}


@contextmanager
def _enter(ids: Mapping[str, str], *, open: bool) -> Iterator[None]:
    token = _current.set(_Scope({**current_ids(), **ids}, open=open))
    try:
        yield
    finally:
        _current.reset(token)


def _given(session_id: str | None, turn_id: str | None, run_id: str | None) -> dict[str, str]:
    named = {"session_id": session_id, "turn_id": turn_id, "run_id": run_id}
    return {name: value for name, value in named.items() if value is not None}
