"""The store's side of the batch window (src/parley/runtime/batch_window.py): its places.

A batch run is claimed only once the window has given it a place (``runs.placed_at``),
and keeps it while it is queued or running: driven, or waiting for provider capacity.
It gives it back when it ends, or waits for answers (``HOLD_RUN`` clears it; answered, it
waits for a place again, in its tenant's line by the time it was queued).  The window gives
its places under one lock (an advisory transaction lock on PostgreSQL, the write lock
SQLite's ``BEGIN IMMEDIATE`` takes), so two fillers at once never give the same place
twice, and the places held never exceed the window: a claim cannot start a batch run
past it, whoever kicked its session.

Whose turn: the tenants with batch runs waiting for a place share the window by weight.
Each place goes to the tenant holding the fewest places for its weight (``held /
weight``, its name breaking ties), its oldest run first; a tenant that holds more than
its share because it was alone gets no more until the others caught up, and gives places
back as its runs end.  A tenant with fewer runs waiting than its share leaves the rest to
the others.  Every read is of an index, per tenant (see the statements).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from parley.store.clock import utc_now
from parley.store.connection import StoreConnection, Transactions
from parley.store.statements import window as wq


class WindowStore:
    """The batch window's places (see the module docstring)."""

    def __init__(self, db: Transactions) -> None:
        self._db = db

    def batch_runs_in_flight(self) -> int:
        """Batch runs holding a place: driven, or queued to be (with a kick on its way,
        or waiting for provider capacity)."""
        return int(self._db.reading(lambda db: db.execute(wq.PLACES_HELD).scalar_one()))

    def place_batch_runs(self, window: int, weights: Mapping[str, float]) -> list[str]:
        """Give the places free in a window of ``window`` to the tenants' oldest batch runs
        waiting for one, by ``weights`` (a tenant not named weighs 1); returns the sessions
        of the runs placed (each once), for their kicks."""
        with self._db.tx() as db:
            if self._db.q.lock_window is not None:
                db.execute(self._db.q.lock_window)
            held = {row.tenant: int(row.places) for row in db.execute(wq.PLACES_BY_TENANT)}
            room = window - sum(held.values())
            if room <= 0:
                return []
            waiting = list(db.execute(wq.TENANTS_WAITING).scalars())
            chosen = _oldest_in_turn(db, room, held, waiting, weights)
            if not chosen:
                return []
            placed = db.execute(wq.PLACE, {"b_run_ids": chosen, "b_now": utc_now()}).scalars()
            return list(dict.fromkeys(placed))

    def interactive_load(self, since: datetime) -> dict[str, tuple[int, int]]:
        """Each tenant's interactive turns ``(running, waiting for a worker)``: driven
        now, and queued since before ``since``, next in their session, not waiting for
        capacity (src/parley/runtime/interactive_share.py)."""

        def read(db: StoreConnection) -> dict[str, tuple[int, int]]:
            running = {r.tenant: int(r.runs) for r in db.execute(wq.INTERACTIVE_RUNNING)}
            waiting = {
                r.tenant: int(r.runs)
                for r in db.execute(wq.INTERACTIVE_WAITING, {"b_since": since})
            }
            return {
                tenant: (running.get(tenant, 0), waiting.get(tenant, 0))
                for tenant in running.keys() | waiting.keys()
            }

        return self._db.reading(read)

    def placed_batch_sessions(self) -> list[str]:
        """The sessions of placed batch runs a driver may take now: queued and not waiting
        for capacity still to come, or running (a driver may have died mid-step: the
        embedded window drives such a session only when its recovery kicks it)."""
        return self._db.reading(
            lambda db: list(
                dict.fromkeys(db.execute(wq.PLACED_RUNNABLE, {"b_now": utc_now()}).scalars())
            )
        )


def _oldest_in_turn(
    db: StoreConnection,
    room: int,
    held: dict[str, int],
    waiting: list[str],
    weights: Mapping[str, float],
) -> list[str]:
    """The runs to place: ``room`` places, each to the waiting tenant holding the fewest
    for its weight, its oldest run first; a tenant that runs out of runs leaves its turns
    to the others."""
    chosen: list[str] = []
    queue: list[tuple[float, str]] = [
        (held.get(tenant, 0) / weights.get(tenant, 1.0), tenant) for tenant in waiting
    ]
    heapq.heapify(queue)
    runs: dict[str, list[Any]] = {}
    while room > len(chosen) and queue:
        _, tenant = heapq.heappop(queue)
        if tenant not in runs:
            # Read once per tenant, as many as the whole room could give it.
            binds = {"b_tenant": tenant, "b_limit": room}
            runs[tenant] = list(db.execute(wq.OLDEST_OF_TENANT, binds).scalars())
        if not runs[tenant]:
            continue  # none left: its turns go to the others
        chosen.append(runs[tenant].pop(0))
        held[tenant] = held.get(tenant, 0) + 1
        heapq.heappush(queue, (held[tenant] / weights.get(tenant, 1.0), tenant))
    return chosen
