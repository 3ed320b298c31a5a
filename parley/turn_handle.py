"""A turn as a caller holds it: its events, its steering, its approvals, its result,
from whichever process asks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from parley.errors import InvalidRequest, StoreError, WaitTimeout
from parley.streaming import follow
from parley.validation import MAX_SEQ, MAX_STEER_BYTES, check_text, check_timeout
from schemas.events import Event
from schemas.records import Approval, Decision, SteerKind, TurnRecord, TurnResult
from workers.store.ids import storable
from workers.telemetry import turn_spans
from workers.telemetry.log_context import bind

if TYPE_CHECKING:
    from parley.client import Client

WAIT_POLL_SECONDS = 0.5


class TurnHandle:
    """A turn, seen from a caller: its events, its steering, its result."""

    def __init__(self, client: Client, record: TurnRecord, *, created: bool = False) -> None:
        self._client = client
        self.turn_id = record.turn_id
        self.run_id = record.run_id
        self.session_id = record.session_id
        self.created = created
        """Whether the call that returned this handle created the turn (False for a
        repeated ``request_id``, an attach or a resume)."""
        self.submitted = record
        """The turn as it was when this handle was made (``record()`` reads it anew)."""

    def __repr__(self) -> str:
        return f"<parley.TurnHandle {self.turn_id}>"

    def record(self) -> TurnRecord:
        """The turn as stored now."""
        return self._client.store.get_turn(self.turn_id)

    def events(self, after: int = 0, *, stop: threading.Event | None = None) -> Iterator[Event]:
        """Every event with seq > ``after``, once each and in order, ending after ``end``
        (or, without it, within half a second of ``stop`` being set)."""
        if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after <= MAX_SEQ:
            raise InvalidRequest(f"after must be a seq: an integer from 0 to {MAX_SEQ}")
        client = self._client
        return follow(
            self.turn_id,
            after,
            coordinator=client.coordinator,
            store=client.store,
            driver_failure=lambda: client._kicker.failure(self.session_id),
            stop=stop,
        )

    def latest_seq(self) -> int:
        """The newest seq the turn has published so far, without waiting for more:
        ``events(after=handle.latest_seq())`` shows only what comes next."""
        client = self._client
        return max(
            client.store.last_event_seq(self.turn_id), client.coordinator.last_seq(self.turn_id)
        )

    def say(self, text: str) -> int:
        """A message for the model at the next step boundary; :class:`TurnEnded` if the
        turn has ended (the message then goes nowhere, and you are told).  Returns its
        position in the turn's steer inbox (1 for the first steer, interrupts counted)."""
        text = check_text(text, "say", MAX_STEER_BYTES)
        client = self._client
        client._check_open()
        steer = client.store.add_steer(self.turn_id, SteerKind.SAY, text)
        client.coordinator.push_steer(self.turn_id, steer)
        return steer.position

    def interrupt(self) -> int:
        """Stop the turn at the next step boundary (at once while the model streams);
        :class:`TurnEnded` if it has ended.  Returns the interrupt's position in the
        turn's steer inbox, as :meth:`say` does."""
        client = self._client
        client._check_open()
        # Accepted (durable) first, then listed: a streaming driver that sees it in the
        # turn's steer list stops at once, and the next boundary stops in any case.  A
        # turn waiting for answers has its pending calls denied with it, and goes on to
        # commit its held step and stop.
        receipt = client.store.accept_steer(self.turn_id, SteerKind.INTERRUPT, "")
        client.coordinator.push_steer(self.turn_id, receipt.steer)
        if receipt.denied is not None:
            client._signal_answered(receipt.denied)
        if receipt.woken is not None and client.coordinator.mark_work(receipt.woken):
            client._kicker.kick(receipt.woken)
        return receipt.steer.position

    def approvals(self) -> list[Approval]:
        """The calls of this turn that wait for a person's answer, oldest first."""
        return [a for a in self._client.store.approvals(self.turn_id) if a.pending]

    def approve(self, approval_id: str, reason: str | None = None) -> Approval:
        """Approve a waiting call, from any process (``reason``: a note kept with the
        answer): it runs once the step's last answer is in.  :class:`Conflict` if it has
        its answer already (naming it), :class:`InvalidRequest` if the turn has no such
        call."""
        return self._answer(approval_id, Decision.APPROVED, reason)

    def deny(self, approval_id: str, reason: str | None = None) -> Approval:
        """Deny a waiting call: the model gets a result saying the operator denied it,
        and why (``reason``).  Errors as :meth:`approve`."""
        return self._answer(approval_id, Decision.DENIED, reason)

    def _answer(self, approval_id: str, decision: Decision, reason: str | None) -> Approval:
        if (
            not isinstance(approval_id, str)
            or not approval_id
            or len(approval_id) > 36
            or not storable(approval_id)
        ):
            raise InvalidRequest(f"not an approval id: {approval_id!r}")
        if reason is not None:
            reason = check_text(reason, "reason", MAX_STEER_BYTES)
        client = self._client
        client._check_open()
        stored = lambda: client.store.run_state(self.turn_id).trace_context  # noqa: E731
        with turn_spans.answer(self.turn_id, approval_id, decision.value, stored):
            answered = client.store.answer_approval(self.turn_id, approval_id, decision, reason)
            client._signal_answered(answered)
        return answered.approvals[0]

    def result(self) -> TurnResult | None:
        """The result if the turn has ended, else None."""
        return self._client.store.turn_result(self.turn_id)

    def wait(self, timeout: float | None = None) -> TurnResult:
        """Block until the turn ends; :class:`WaitTimeout` after ``timeout`` seconds (naming
        Redis if it could not be reached: the fleet cannot run the turn without it)."""
        check_timeout(timeout)
        return self._wait_until(None if timeout is None else time.monotonic() + timeout, timeout)

    def _wait_until(self, deadline: float | None, timeout: float | None) -> TurnResult:
        """What :meth:`wait` does, until the monotonic ``deadline`` (that of ``timeout``,
        which its error names)."""
        client = self._client
        # The store, which holds the truth, is asked first, then after each end the
        # coordinator reports and after each silent poll (it may have lost the signal, or
        # never seen the turn).  Between, block on the turn's ends (one small key, not its
        # tokens); reading them from the start returns at once an end already there.
        seen = 0
        result = client.store.turn_result(self.turn_id)
        while result is None:
            self._raise_if_driver_died()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                outage = client.coordinator.outage()
                if outage is not None:
                    raise WaitTimeout(
                        f"turn {self.turn_id} did not end within {timeout}s: {outage}, and "
                        "the fleet's workers need it to run the turn"
                    )
                raise WaitTimeout(f"turn {self.turn_id} still running after {timeout}s")
            pause = WAIT_POLL_SECONDS if remaining is None else min(WAIT_POLL_SECONDS, remaining)
            seen = client.coordinator.wait_end(self.turn_id, seen, timeout=pause) or seen
            result = client.store.turn_result(self.turn_id)
        return result

    def _raise_if_driver_died(self) -> None:
        client = self._client
        failure = client._kicker.failure(self.session_id)
        if failure is not None and not client.store.run_state(self.turn_id).status.terminal:
            raise StoreError(f"the driver of this session stopped: {failure}") from failure


def name_in_logs(turn: TurnRecord) -> None:
    """The lines logged from here on in an open log scope (a gateway request, a command)
    name this turn: the one the caller asked for or just made."""
    bind(session_id=turn.session_id, turn_id=turn.turn_id, run_id=turn.run_id)
