"""Firing the schedules whose slot has come (docs/time.md#schedules), wherever the
release of delayed turns runs: beat's timer and sweep on the fleet, an embedded
client's recovery thread.

The store fires a schedule's due slots in one transaction (the claim of each slot, its
turn, the next slot: src/parley/store/schedules.py), so any number of processes may
call this at once and a slot still fires once.  What follows the commit here (the
turn's ``queued`` event, its kick, the steers of an ``interrupt``) may be lost with the
process: the turn is queued in the database, and the sweep's look for work no driver
holds starts it.  Each firing is a span (``parley.schedule.fire``) whose context the
turns it submits store, so their traces start from it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from parley.ports.backend import Coordinator
from parley.store.schedules import SLOTS_PER_TRANSACTION, Firing
from parley.store.sql_store import SqlStore
from parley.telemetry import metrics, tracing

log = logging.getLogger("parley.schedules")

DUE_PER_LOOK = 100
"""Schedules read per look for those due (more due at once: the next look finds them)."""


def fire_due_schedules(
    store: SqlStore, coordinator: Coordinator, kick: Callable[[str, str], None]
) -> list[Firing]:
    """Fire every schedule whose next slot has come, and kick the sessions of the turns
    fired (``kick(session_id, priority)``); returns the firings.  A schedule whose
    firing fails is logged and left for the next look: it holds up no other."""
    fired: list[Firing] = []
    for schedule_id in store.due_schedules(DUE_PER_LOOK):
        try:
            fired.extend(_fire(store, coordinator, kick, schedule_id))
        except Exception as exc:
            log.warning("could not fire schedule %s (%s); the next look will", schedule_id, exc)
    return fired


def _fire(
    store: SqlStore,
    coordinator: Coordinator,
    kick: Callable[[str, str], None],
    schedule_id: str,
) -> list[Firing]:
    """Deal with one schedule's due slots, a transaction at a time, until none is due."""
    fired: list[Firing] = []
    while True:
        with tracing.span(
            "parley.schedule.fire",
            kind="PRODUCER",
            attributes={"parley.schedule.id": schedule_id},
        ) as span:
            result = store.fire_schedule(schedule_id, trace_context=tracing.carrier())
            if result is None:
                return fired  # not due (any more), or another process holds it
            if span is not None:
                span.set_attributes(
                    {
                        "parley.schedule.fired": len(result.firings),
                        "parley.schedule.skipped": result.skipped,
                        "parley.schedule.missed": result.missed,
                        "parley.turn.ids": [f.turn_id for f in result.firings],
                    }
                )
            for firing in result.firings:
                _announce(coordinator, kick, firing)
        metrics.schedule_slots("fired", len(result.firings))
        metrics.schedule_slots("skipped", result.skipped)
        metrics.schedule_slots("missed", result.missed)
        if result.missed:
            log.warning("schedule %s: %d slot(s) missed", schedule_id, result.missed)
        fired.extend(result.firings)
        if len(result.firings) + result.skipped + result.missed < SLOTS_PER_TRANSACTION:
            return fired


def _announce(coordinator: Coordinator, kick: Callable[[str, str], None], firing: Firing) -> None:
    """What follows a firing's commit, as after a submission's: the interrupts' steers,
    the calls they denied, the ``queued`` event, and a kick unless one is pending."""
    for turn_id, steer in firing.interrupted:
        coordinator.push_steer(turn_id, steer)
    for answered in firing.denied:
        coordinator.publish(list(answered.events))
    log.info(
        "schedule %s fired its %s slot: turn %s of session %s",
        firing.schedule_id,
        firing.slot_at.isoformat(),
        firing.turn_id,
        firing.session_id,
    )
    events = [firing.queued] if firing.queued is not None else []
    if coordinator.mark_work(firing.session_id, events):
        kick(firing.session_id, firing.priority)


def count_schedules(store: SqlStore) -> None:
    """Set the schedules' gauges from the store (the sweep's, for the metrics)."""
    counts = store.schedule_counts()
    next_seconds = (
        None if counts.next_at is None else (counts.next_at - datetime.now(UTC)).total_seconds()
    )
    metrics.schedules_now(counts.schedules, counts.paused, next_seconds, counts.missed)
