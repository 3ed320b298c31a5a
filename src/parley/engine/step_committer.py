"""The commit of one step, shared by the step loop and by a held step's answers.

A step commits whole, in one transaction: its payload, the steer cursor it consumed, the
durable events published since the last commit, its own ``steer`` and ``step`` events
(published only once committed) and, when the step ends the turn, the turn's end.  Then
the attempt moves past it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from parley.engine.emitter import Emitter
from parley.engine.fenced_run import FencedStore
from parley.engine.turn_state import TurnState
from parley.ports.backend import CommittedStep, StepReceipt, TurnEnd
from parley.schemas.events import Event, Steered, StepCommitted
from parley.schemas.records import Steer
from parley.telemetry import metrics, turn_spans

EndAt = Callable[[int], TurnEnd]
"""The turn's end, given the seq its ``end`` event takes."""


class StepCommitter:
    """Commits the steps of one attempt and publishes what each announced."""

    def __init__(self, store: FencedStore, emitter: Emitter) -> None:
        self._store = store
        self._emitter = emitter

    def steer_events(self, says: Sequence[Steer], index: int) -> list[Event]:
        """The ``steer`` events of the says in step ``index``'s request, numbered to be
        stored and published with the step: a say is delivered only once a step that
        carries it commits (or is held, to commit once answered), so one taken into a
        step that never commits is reported undelivered at the end, never both."""
        return [
            self._emitter.allocate(Steered(position=s.position, text=s.text, step=index))
            for s in says
        ]

    def commit(
        self,
        state: TurnState,
        step: CommittedStep,
        cursor: int,
        *,
        says: Sequence[Steer] = (),
        idle: bool = False,
        end: EndAt | None = None,
    ) -> StepReceipt:
        """Commit ``step`` with the steers up to ``cursor`` consumed and the ``says`` it
        carries delivered; ``idle`` closes the inbox with it when nothing is pending, and
        ``end`` (if given) ends the turn in the same transaction unless a steer is."""
        emitter = self._emitter
        payload = step.payload
        announced = self.steer_events(says, step.index)
        announced.append(
            emitter.allocate(
                StepCommitted(
                    step=step.index,
                    text=payload.text,
                    tool_calls=payload.tool_calls,
                    usage=payload.usage,
                )
            )
        )
        events = [*emitter.take_unstored(), *announced]
        with turn_spans.commit("step", step.index):
            receipt = self._store.commit_step(
                step=step,
                steer_cursor=cursor,
                events=events,
                close_inbox_if_idle=idle,
                end=end(emitter.next_seq) if end is not None else None,
            )
        self._committed(state, step, cursor, announced, receipt.steer_count)
        if receipt.finished is not None:
            emitter.skip()  # the seq the committed end took
        return receipt

    def _committed(
        self,
        state: TurnState,
        step: CommittedStep,
        cursor: int,
        announced: list[Event],
        steer_count: int,
    ) -> None:
        """``step`` committed: publish what it ``announced`` (its steers, then its
        ``step`` event) and move the state past it."""
        state.streaming = None
        metrics.step_committed(step.payload)
        if steer_count > cursor:
            # Steers are pending, so the next boundary needs the steer list: read in the
            # round trip that sends the step's events.
            state.listed = self._emitter.publish_listing_steers(announced, cursor)
        else:
            for event in announced:
                self._emitter.publish(event)
        state.steps.append(step)
        state.cursor = cursor
        state.pending = []  # those the commit counted past the cursor: read at the boundary
        state.steer_count = max(state.steer_count, steer_count)
        state.usage = state.usage + step.payload.usage
        state.session_tokens += step.payload.usage.total
