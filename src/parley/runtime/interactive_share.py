"""The tenants' interactive share of the fleet's workers (docs/admission.md#interactive-share).

Any tenant can call all its work interactive, and a worker slot runs a turn to its end:
forty long interactive turns of one tenant can hold every slot of a fleet, and whose
kick a freed slot takes next is the broker queue's order, the flooding tenant's first.
So a drive does not start a fresh interactive turn of a tenant that holds its share of
the running interactive turns (its weight over the weights of the tenants with
interactive turns running or waiting, times those running), or more, while a tenant
under its share has interactive turns waiting for a worker: that turn moves to the batch
lane, where it waits for a place in the batch window, shared by weight
(src/parley/store/claims.py does it at the claim, so the flooding tenant's kicks already in
the queue start nothing).  A running turn is never stopped: the tenant that waits gets
the next slot that frees.

"Waiting for a worker": queued since longer than a kick takes to reach a free worker
(``KICK_GRACE_SECONDS``), next in its session, not waiting for provider capacity.  The
view is read from the store at most every ``REFRESH_SECONDS`` in each process (two
grouped counts over an index of the interactive runs in flight).  On the embedded
runtime every session has a thread of its own: no turn waits for a worker, and nothing
is held back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta

from parley.coordination.constants import KICK_GRACE_SECONDS
from parley.schemas.errors import StoreError
from parley.store.clock import utc_now
from parley.store.sql_store import SqlStore

log = logging.getLogger("parley.driver")

REFRESH_SECONDS = 1.0
"""How stale a process's view of the tenants' interactive turns may be."""


def held_back(load: Mapping[str, tuple[int, int]], weights: Mapping[str, float]) -> frozenset[str]:
    """The tenants whose fresh interactive turns wait, given each tenant's interactive
    turns ``(running, waiting for a worker)``: those at or over their share of the
    running ones, while a tenant under its share has some waiting (none otherwise)."""
    running = sum(r for r, _ in load.values())
    active = [tenant for tenant, (r, w) in load.items() if r or w]
    total = sum(weights.get(tenant, 1.0) for tenant in active)
    if not total:
        return frozenset()

    def share(tenant: str) -> float:
        return running * weights.get(tenant, 1.0) / total

    if not any(w and r < share(tenant) for tenant, (r, w) in load.items()):
        return frozenset()  # nobody under its share waits
    return frozenset(t for t, (r, _w) in load.items() if r and r >= share(t))


class InteractiveShares:
    """This process's view of who is held back, read from ``store`` at most every
    ``REFRESH_SECONDS`` (``weights``: the tenants' weights, read with it)."""

    def __init__(
        self,
        store: SqlStore,
        *,
        weights: Callable[[], Mapping[str, float]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._weights = weights
        self._clock = clock
        self._guard = threading.Lock()
        self._held: frozenset[str] = frozenset()
        self._read_at: float | None = None

    def held_back(self) -> frozenset[str]:
        """The tenants whose fresh interactive turns do not start now."""
        with self._guard:
            now = self._clock()
            if self._read_at is not None and now - self._read_at < REFRESH_SECONDS:
                return self._held
            self._read_at = now  # (one reader per refresh; the others use the last view)
        since = utc_now() - timedelta(seconds=KICK_GRACE_SECONDS)
        try:
            held = held_back(self._store.interactive_load(since), self._weights())
        except StoreError as exc:
            # The claim that follows meets the same database: its error is the kick's.
            log.warning("could not read the tenants' interactive turns (%s)", exc)
            return self._held
        with self._guard:
            self._held = held
        return held
