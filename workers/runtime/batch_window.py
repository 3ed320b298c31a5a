"""The batch window: how a batch's lines reach the fleet without a kick each.

A batch of 100,000 lines kicked at once would put 100,000 tasks in the broker, each
re-kicked by the sweeper whenever it waited there longer than the sweeper trusts a kick,
and would leave nothing for an interactive turn's kick to overtake but the broker's
queue order.  Instead the oldest queued batch runs are started a window at a time
(``PARLEY_BATCH_WINDOW``, default 64 batch runs in flight fleet-wide: driven, or waiting
for provider capacity): whoever creates a batch fills the window, a worker that finishes
a batch session tops it up again, and so does the sweeper every sweep (so a lost kick or
a dead worker costs a slot for one sweep, no more).  A window larger than the fleet's
worker slots keeps every slot busy; admission decides whose model calls go first within
it (docs/admission.md).

Every one of them fills the window the same way, from the same count, so two filling at
once (a worker whose line just ended and the sweeper, say) share the places they see
free rather than each filling the same place: a place is a run in flight or a session
with a kick on its way, and a kick is a work mark's flag that only one of them raises.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Protocol

from workers.store.sql_store import SqlStore

log = logging.getLogger("parley.batches")

DEFAULT_WINDOW = 64


class Coordinator(Protocol):
    """What the window asks of a coordinator (the fleet's Redis one)."""

    def mark_work(self, session_id: str) -> bool: ...

    def unattended(self, session_ids: Sequence[str]) -> list[str]: ...


def batch_window() -> int:
    """``PARLEY_BATCH_WINDOW``: the batch runs the fleet keeps in flight (at least 1)."""
    raw = os.environ.get("PARLEY_BATCH_WINDOW")
    if raw is None or not raw.strip():
        return DEFAULT_WINDOW
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"PARLEY_BATCH_WINDOW must be a whole number, not {raw!r}") from None
    if value < 1:
        raise ValueError(f"PARLEY_BATCH_WINDOW must be at least 1, not {value}")
    return value


def fill_batch_window(
    store: SqlStore,
    coordinator: Coordinator,
    kick: Callable[[str], None],
    *,
    window: int,
) -> int:
    """Kick the oldest queued batch sessions until ``window`` batch runs are in flight
    (driven, waiting for capacity, or with a kick on its way); returns how many were
    kicked."""
    guess = window - store.batch_runs_in_flight()
    if guess <= 0:  # full (the common case mid-batch): nothing more to read
        return 0
    # The queue is read before the count that decides: a line that starts between the
    # two reads is then counted twice (the window runs one short until the next fill),
    # where the other order would miss it (one too many, for as long as it runs).
    candidates = store.oldest_queued_batch_sessions(guess + window)
    free = coordinator.unattended(candidates)
    # Those with a fresh kick on its way, or a driver, hold a place already.
    room = window - store.batch_runs_in_flight() - (len(candidates) - len(free))
    return _kick_some(coordinator, kick, free, room) if room > 0 else 0


def _kick_some(
    coordinator: Coordinator, kick: Callable[[str], None], sessions: list[str], room: int
) -> int:
    """Kick up to ``room`` of ``sessions``, in order: each whose work mark's kick-pending
    flag this call raised (a session with a kick on its way already counts as taken)."""
    kicked = taken = 0
    for session_id in sessions:
        if kicked + taken >= room:
            break
        if coordinator.mark_work(session_id):
            kick(session_id)
            kicked += 1
        else:
            taken += 1
    if kicked:
        log.debug("batch window: kicked %d session(s)", kicked)
    return kicked
