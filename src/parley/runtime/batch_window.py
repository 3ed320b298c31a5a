"""The batch window: how batch runs reach the fleet without a kick each, and without one
tenant's backlog holding another's.

A batch of 100,000 lines kicked at once would put 100,000 tasks in the broker, each
re-kicked by the sweeper whenever it waited there longer than the sweeper trusts a kick,
and would leave nothing for an interactive turn's kick to overtake but the broker's
queue order.  Instead batch runs (every line of a batch, and every turn submitted with
``priority="batch"``) are given **places** a few at a time: ``PARLEY_BATCH_WINDOW``
(default 64) places fleet-wide, each held by a batch run from when it is placed until it
ends (driven, or waiting for provider capacity).  A driver claims a batch run only once
it holds a place, so the window is never exceeded, whoever kicked its session: a kick
for an unplaced one finds nothing to run.  (A batch run that an interactive turn of its
session waits behind is the exception: it moves to the interactive lane and starts at
once, its tenant's interactive work from then on; src/parley/store/claims.py.)

The places are shared among the tenants with batch runs waiting, by their weights
(``PARLEY_TENANT_WEIGHTS``), each tenant's oldest first: a tenant's hundred thousand
lines hold another tenant's ten behind no more than their share of the window (the
store gives them: src/parley/store/window.py).  Whoever submits batch work fills the
window, a worker that finishes a batch run tops it up again, and so does the sweeper
every sweep (a lost kick costs a place for one sweep: the sweeper kicks a placed run no
driver took).  A window larger than the fleet's worker slots keeps every slot busy;
admission decides whose model calls go first within it (docs/admission.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from parley.store.sql_store import SqlStore

log = logging.getLogger("parley.batches")


class Coordinator(Protocol):
    """What the window asks of a coordinator: a placed session's work mark (its kick is
    on its way, which the sweeper then leaves to it)."""

    def mark_work(self, session_id: str) -> bool: ...


def fill_batch_window(
    store: SqlStore,
    coordinator: Coordinator,
    kick: Callable[[str], None],
    *,
    window: int,
    weights: Mapping[str, float],
) -> int:
    """Give the ``window``'s free places to the tenants' oldest batch runs waiting, by
    ``weights`` (``PARLEY_BATCH_WINDOW`` and ``PARLEY_TENANT_WEIGHTS``, a tenant not named
    weighing 1), and kick the sessions placed; returns how many were kicked."""
    if store.batch_runs_in_flight() >= window:
        return 0  # full (the common case mid-batch): one count, no lock
    placed = store.place_batch_runs(window, weights)
    for session_id in placed:
        # A kick even if one is on its way already (a submission's, before the run had a
        # place, which found nothing to run): the run can start now.
        coordinator.mark_work(session_id)
        kick(session_id)
    if placed:
        log.debug("batch window: placed and kicked %d session(s)", len(placed))
    return len(placed)
