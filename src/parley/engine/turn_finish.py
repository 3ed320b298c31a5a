"""The end of one attempt at a turn: the outcome its hooks see, ``before_commit``'s veto,
what the final transaction commits (:class:`TurnEnd`), and, once it committed, the end
event, the replay cache and the observational hooks (``after_commit``, ``on_terminal``).
A held step's attempt ends without any of it: its turn waits, not ended."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from parley.engine.attempt import Attempt
from parley.engine.call_admission import Throttle
from parley.engine.context import turn_replay
from parley.engine.replay_cache import ReplayCache
from parley.engine.transcript import rows as transcript_rows
from parley.engine.turn_approvals import approvals_summary
from parley.engine.turn_history import whole_path
from parley.engine.turn_setup import PrefixChoice
from parley.engine.turn_state import Deferred, Ending, TurnState
from parley.ports.backend import FinishReceipt, SeqFloor, Spawned, TurnEnd
from parley.ports.host import CommitReceipt, TurnOutcome
from parley.schemas.events import Throttled
from parley.schemas.records import TurnStatus
from parley.telemetry import tracing, turn_spans

log = logging.getLogger("parley.engine")


class TurnFinisher:
    """Ends one attempt's turn."""

    def __init__(
        self,
        attempt: Attempt,
        cache: ReplayCache,
        *,
        claim_next: Callable[[], SeqFloor | None],
        worker: Callable[[], str],
    ) -> None:
        """``claim_next`` gives what the final transaction claims the session's next
        turn with, if it should; ``worker`` names this process on the runs it claims."""
        self._attempt = attempt
        self._cache = cache
        self._claim_next = claim_next
        self._worker = worker

    def finish(
        self, state: TurnState, ending: Ending, choice: PrefixChoice
    ) -> tuple[TurnStatus, FinishReceipt | Deferred | Spawned | None]:
        """End the turn as ``ending`` says (committing the end, unless its last step did)."""
        if ending.status is TurnStatus.WAITING:
            # Held, not ended: no end, no hooks; the driver lets the session go (the
            # turn holds its session's line, so nothing after it is claimed) and kicks
            # the child turns it opened, if it waits for agents.  One waiting for an
            # event with a deadline is woken then, by this process's timer where it has
            # one (docs/time.md#waiting-for-an-event); the release is the backstop.
            if ending.wake_in is not None and ending.spawned is None:
                priority = self._attempt.claimed.run.priority
                return ending.status, Deferred(seconds=ending.wake_in, priority=priority)
            return ending.status, ending.spawned
        if ending.throttle is not None:
            return ending.status, self._defer(state, ending.throttle)
        attempt = self._attempt
        outcome = self.outcome(state, ending)
        completed = ending.status not in (TurnStatus.CANCELLED, TurnStatus.FAILED)
        receipt = ending.receipt
        if receipt is None:
            vetoed = self.vetoed(outcome, choice) if completed else None
            if vetoed is not None:
                ending, completed = vetoed, False
                outcome = self.outcome(state, ending)
            with turn_spans.commit("end", len(state.steps)):
                receipt = attempt.store.finish_turn(
                    cursor=state.cursor,
                    events=attempt.emitter.take_unstored(),
                    end=self.end_of(ending, attempt.emitter.skip(), choice),
                )
        turn = attempt.turn
        if ending.status.settled:
            self._cache.put(turn.turn_id, ending.status, turn_replay(turn.prompt, state.steps))
        attempt.emitter.publish(receipt.end_event)
        if completed and attempt.hooks.after_commit is not None:
            # Built only for a hook: past a compaction its path is read from the store.
            _observe(attempt.hooks.after_commit, self._commit_receipt(state, outcome, receipt))
        _observe(attempt.hooks.on_terminal, outcome)
        return ending.status, receipt

    def _defer(self, state: TurnState, throttle: Throttle) -> Deferred:
        """The turn waits for capacity, holding no worker: its run is queued again until
        the capacity is due, with a ``throttled`` event for its readers; the driver lets
        the session go and kicks it again then (docs/admission.md)."""
        attempt = self._attempt
        seconds = round(throttle.seconds, 3)
        event = attempt.emitter.allocate(
            Throttled(model=throttle.model, seconds=seconds, reason=throttle.reason)
        )
        attempt.store.defer_run(
            not_before=datetime.now(UTC) + timedelta(seconds=seconds),
            events=[*attempt.emitter.take_unstored(), event],
        )
        state.streaming = None
        attempt.emitter.publish(event)
        tracing.set_attributes(
            {"parley.throttled.model": throttle.model, "parley.throttled.seconds": seconds}
        )
        return Deferred(seconds=seconds, priority=attempt.claimed.run.priority)

    def vetoed(self, outcome: TurnOutcome, choice: PrefixChoice) -> Ending | None:
        """The failure ``before_commit`` makes of ``outcome``, if it rejects it."""
        before_commit = self._attempt.hooks.before_commit
        if before_commit is None:
            return None
        try:
            before_commit(outcome, {"prefix": choice.prefix})
        except Exception as exc:
            return Ending(
                status=TurnStatus.FAILED,
                error=f"rejected by before_commit: {type(exc).__name__}: {exc}",
            )
        return None

    def end_of(self, ending: Ending, end_seq: int, choice: PrefixChoice) -> TurnEnd:
        """What the turn's final transaction commits for ``ending``."""
        attempt, cache = self._attempt, self._cache
        claimed, turn = attempt.claimed, attempt.turn
        turn_id, settles = turn.turn_id, ending.status.settled

        def known(candidate: str) -> bool:
            # The turn finishing now heads the next turn's history; it is cached once its
            # final transaction has committed.
            return (settles and candidate == turn_id) or cache.knows(candidate)

        return TurnEnd(
            turn_id=turn_id,
            status=ending.status,
            end_seq=end_seq,
            reply=ending.reply,
            error=ending.error,
            partial=ending.partial,
            prefix=choice.prefix,
            refresh_prefix=choice.refresh,
            claim_next=self._claim_next(),
            known=known,
            worker=self._worker(),
            position=claimed.run.queue_position,
            path=(*(p.turn for p in claimed.history), turn),
            compaction=claimed.compaction,
            discarded=ending.discarded,
            approvals=approvals_summary(attempt.store, asked=claimed.run.approval_count > 0),
            webhook_url=attempt.host.webhook_url,  # the end's outbox row: parley.store.outbox
        )

    def outcome(self, state: TurnState, ending: Ending) -> TurnOutcome:
        """The outcome ``before_commit`` and ``on_terminal`` see."""
        claimed = self._attempt.claimed
        return TurnOutcome(
            session_id=claimed.session.session_id,
            turn_id=claimed.turn.turn_id,
            run_id=claimed.run.run_id,
            outcome=ending.status.value,
            reply=ending.reply if ending.status.has_reply else None,
            steps=len(state.steps),
            usage=state.usage + ending.discarded,
            error=ending.error,
        )

    def _commit_receipt(
        self, state: TurnState, outcome: TurnOutcome, receipt: FinishReceipt
    ) -> CommitReceipt:
        """What ``after_commit`` is handed once the end committed."""
        attempt = self._attempt
        turn = attempt.turn
        path = whole_path(attempt.claimed, attempt.store.path)
        return CommitReceipt(
            outcome=outcome,
            head_turn_id=receipt.head_turn_id,
            prefix_generation=receipt.prefix_generation,
            committed_at=datetime.now(UTC),
            options=attempt.options,
            host_context=attempt.options.host_context,
            path=(*(t.turn_id for t in path), turn.turn_id),
            delta=tuple(transcript_rows(turn.turn_id, turn.prompt, state.steps)),
        )


def _observe(hook: Any, argument: Any) -> None:
    """Call an observational hook; its failure is logged and cannot undo the commit."""
    if hook is None:
        return
    try:
        hook(argument)
    except Exception:
        log.warning("observational hook %r failed", hook, exc_info=True)
