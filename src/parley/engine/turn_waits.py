"""A step held for its calls that wait for an event or a time
(docs/time.md#waiting-for-an-event): a tool answered :class:`~parley.ports.host.WaitFor`
(the built-in ``wait`` tool does), so the step cannot commit yet, since that call has no
result; the turn waits holding no worker, lock or slot.

The step's other calls ran already: their results are kept with the held step, announced
once, and never run again.  Each waiting call gets a row in the same transaction, and
takes a signal kept for its event if one came early; when every wait is met at once the
driver goes on at once.  Otherwise the run waits until a signal (or the last of them)
or its deadline queues it again; the driver that claims it gives each waiting call the
signal's payload, or a result saying the time ran out or the turn was interrupted,
announces it, and commits the step whole, as after answers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from parley.engine.emitter import Emitter
from parley.engine.fenced_run import FencedStore
from parley.engine.held_step import HeldStep
from parley.engine.step_committer import StepCommitter
from parley.engine.tool_calls import ToolRunner
from parley.engine.turn_state import Ending, TurnState
from parley.ports.backend import CommittedStep, EventHold, EventWait
from parley.ports.host import WaitFor
from parley.schemas.events import Event, WaitingForEvent
from parley.schemas.messages import ToolCall, ToolResult
from parley.schemas.records import TurnStatus


class EventWaits:
    """The steps of one attempt's turn held for events."""

    def __init__(
        self, store: FencedStore, emitter: Emitter, committer: StepCommitter, *, turn_id: str
    ) -> None:
        self._turn_id = turn_id
        self._store = store
        self._emitter = emitter
        self._committer = committer

    def hold(
        self,
        state: TurnState,
        held: HeldStep,
        results: Sequence[ToolResult],
        waiting: Mapping[str, WaitFor],
        delivered: list[Event],
        tools: ToolRunner,
    ) -> Ending | None:
        """The ``held`` step's calls were answered (``results``, in order), and those in
        ``waiting`` (by call id) wait: keep the others' results and a row per wait, and
        let the session go (the waiting ending), or go on at once if signals kept for
        them met every wait (None: the step committed).  ``delivered``: the step's steer
        events, stored with the hold."""
        now = datetime.now(UTC)
        judgements = []
        waits = []
        for position, (judged, result) in enumerate(zip(held.judgements, results, strict=True)):
            wait = waiting.get(judged.call.id)
            if wait is None:
                judgements.append(replace(judged, result=result, announced=True))
                continue
            judgements.append(replace(judged, result=None, waits=True))
            until = None if wait.timeout is None else now + timedelta(seconds=wait.timeout)
            waits.append(
                EventWait(call_id=judged.call.id, position=position, event=wait.event, until=until)
            )
        held = replace(held, judgements=tuple(judgements))
        # Stored with the hold, published once it committed: a reader never hears of a
        # wait that a lost commit never held.
        announced = [
            self._emitter.allocate(
                WaitingForEvent(
                    step=held.index,
                    call_id=wait.call_id,
                    event=wait.event,
                    until=None if wait.until is None else wait.until.isoformat(),
                )
            )
            for wait in waits
        ]
        hold = EventHold(
            turn_id=self._turn_id,
            step=held.index,
            cursor=held.cursor,
            held_step=held.to_json(),
            waits=waits,
        )
        met = self._store.hold_for_event(
            hold=hold, events=[*self._emitter.take_unstored(), *delivered, *announced]
        )
        state.streaming = None
        for event in [*delivered, *announced]:
            self._emitter.publish(event)
        if not met:
            return Ending(status=TurnStatus.WAITING, wake_in=_wake_in(waits, now))
        self.go_on(state, held, tools)
        return None

    def go_on(self, state: TurnState, held: HeldStep, tools: ToolRunner) -> None:
        """Every wait of the held step ended (signalled, timed out, or cancelled by an
        interrupt): give each waiting call its result, announce it, and commit the step
        whole with the results its other calls got before it was held."""
        ended = self._store.waits_of_step(held.index)
        results = []
        for judged in held.judgements:
            if not judged.waits:
                assert judged.result is not None  # (announced before the hold)
                results.append(judged.result)
                continue
            result = wait_result(judged.call, ended.get(judged.call.id))
            tools.announce(held.index, result)
            results.append(result)
        payload = replace(held.payload, tool_results=tuple(results))
        self._committer.commit(state, CommittedStep(index=held.index, payload=payload), held.cursor)


TIMED_WAKE_SECONDS = 60.0
"""A deadline at most this far off gets a timed wake from the driver's process (the
embedded client's timer; on the fleet a kick the broker counts down); a later one is
left to the release, every turn's backstop (a kick held by a broker for hours would
come back at every visibility timeout)."""


def _wake_in(waits: Sequence[EventWait], now: datetime) -> float | None:
    """The seconds until the soonest deadline among ``waits``, if it is soon enough for a
    timed wake (:data:`TIMED_WAKE_SECONDS`)."""
    deadlines = [w.until for w in waits if w.until is not None]
    if not deadlines:
        return None
    seconds = max(0.0, (min(deadlines) - now).total_seconds())
    return seconds if seconds <= TIMED_WAKE_SECONDS else None


def wait_result(call: ToolCall, wait: EventWait | None) -> ToolResult:
    """What the model hears of a call that waited: the signal's payload (text as it is,
    any other JSON value as JSON), or a result saying the time ran out, or that the turn
    was interrupted while it waited."""

    def result(content: str, *, error: bool = False) -> ToolResult:
        return ToolResult(call_id=call.id, name=call.name, content=content, is_error=error)

    if wait is None:
        return result("error: this call's wait was not found; it ended unknown", error=True)
    what = f"event {wait.event!r}" if wait.event else "its time"
    if wait.state == "signalled":
        payload = wait.payload
        return result(payload if isinstance(payload, str) else json.dumps(payload))
    if wait.state == "timed_out":
        at = f"{wait.until:%Y-%m-%d %H:%M:%S} UTC" if wait.until else "its deadline"
        if wait.event is None:
            return result(f"waited until {at}")
        return result(f"timed out: no event {wait.event!r} came before {at}")
    return result(
        f"not waited for: the turn was interrupted while this call waited for {what}", error=True
    )
