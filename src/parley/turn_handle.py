"""A turn as a caller holds it: its events, its steering, its approvals, its result,
from whichever process asks."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, overload

from parley.errors import InvalidRequest, StoreError, TurnEnded, WaitTimeout
from parley.ports.host import check_event_name
from parley.schemas.events import Event
from parley.schemas.records import Approval, Decision, SteerKind, TurnRecord, TurnResult
from parley.store.ids import storable
from parley.streaming import follow
from parley.telemetry import turn_spans
from parley.telemetry.log_context import bind
from parley.tree_stream import TreeEvent, follow_tree
from parley.validation import (
    MAX_SEQ,
    MAX_STEER_BYTES,
    check_text,
    check_timeout,
    checked_payload,
)

if TYPE_CHECKING:
    from parley.client_runtime import Runtime

WAIT_POLL_SECONDS = 0.5


class TurnHandle:
    """A turn, seen from a caller: its events, its steering, its result."""

    def __init__(self, runtime: Runtime, record: TurnRecord, *, created: bool = False) -> None:
        self._runtime = runtime
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
        return self._runtime.store.get_turn(self.turn_id)

    @overload
    def events(
        self,
        after: int = 0,
        *,
        children: Literal[False] = False,
        stop: threading.Event | None = None,
    ) -> Iterator[Event]: ...

    @overload
    def events(
        self,
        after: str | int | None = 0,
        *,
        children: Literal[True],
        stop: threading.Event | None = None,
    ) -> Iterator[TreeEvent]: ...

    def events(
        self,
        after: int | str | None = 0,
        *,
        children: bool = False,
        stop: threading.Event | None = None,
    ) -> Iterator[Event] | Iterator[TreeEvent]:
        """Every event with seq > ``after``, once each and in order, ending after ``end``
        (or, without it, within half a second of ``stop`` being set).  With ``children``,
        the turn's tree (docs/sub-agents.md): its events and every descendant's, each a
        :class:`~parley.tree_stream.TreeEvent` with its ``path`` and ``cursor``, and
        ``after`` is such a cursor (or 0 / None: from the start)."""
        runtime = self._runtime
        if children:
            if not (after is None or after == 0 or isinstance(after, str)):
                raise InvalidRequest("after must be a tree event's cursor with children=True")
            cursor = after if isinstance(after, str) else None
            root = self.turn_id
            session_id = self.session_id

            def failure(turn_id: str) -> BaseException | None:
                return runtime.kicker.failure(session_id) if turn_id == root else None

            return follow_tree(
                root,
                cursor,
                coordinator=runtime.coordinator,
                store=runtime.store,
                driver_failure=failure,
                stop=stop,
            )
        if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after <= MAX_SEQ:
            raise InvalidRequest(f"after must be a seq: an integer from 0 to {MAX_SEQ}")
        return follow(
            self.turn_id,
            after,
            coordinator=runtime.coordinator,
            store=runtime.store,
            driver_failure=lambda: runtime.kicker.failure(self.session_id),
            stop=stop,
        )

    def latest_seq(self) -> int:
        """The newest seq the turn has published so far, without waiting for more:
        ``events(after=handle.latest_seq())`` shows only what comes next."""
        runtime = self._runtime
        return max(
            runtime.store.last_event_seq(self.turn_id), runtime.coordinator.last_seq(self.turn_id)
        )

    def say(self, text: str) -> int:
        """A message for the model at the next step boundary; :class:`TurnEnded` if the
        turn has ended (the message then goes nowhere, and you are told).  Returns its
        position in the turn's steer inbox (1 for the first steer, interrupts counted)."""
        text = check_text(text, "say", MAX_STEER_BYTES)
        runtime = self._runtime
        runtime.check_open()
        steer = runtime.store.add_steer(self.turn_id, SteerKind.SAY, text)
        runtime.coordinator.push_steer(self.turn_id, steer)
        return steer.position

    def interrupt(self) -> int:
        """Stop the turn at the next step boundary (at once while the model streams);
        :class:`TurnEnded` if it has ended.  Returns the interrupt's position in the
        turn's steer inbox, as :meth:`say` does."""
        runtime = self._runtime
        runtime.check_open()
        # Accepted (durable) first, then listed: a streaming driver that sees it in the
        # turn's steer list stops at once, and the next boundary stops in any case.  A
        # turn waiting for answers has its pending calls denied with it, and goes on to
        # commit its held step and stop.
        return _interrupt(runtime, self.turn_id)

    def signal(self, name: str, payload: Any = None) -> bool:
        """Send the event ``name`` to this turn, from any process
        (docs/time.md#waiting-for-an-event): the first of its calls waiting for ``name``
        wakes with ``payload`` (any JSON value) as its result, exactly once; with none
        waiting, the signal is kept until a call waits for it.  Returns whether it woke a
        call (False: kept).  :class:`InvalidRequest` for a bad name or a payload that is
        not JSON (nothing is kept), :class:`TurnEnded` once the turn has ended."""
        check_event_name(name, "signal name")
        payload = checked_payload(payload)
        runtime = self._runtime
        runtime.check_open()
        signalled = runtime.store.signal_turn(self.turn_id, name, payload)
        runtime.answered(signalled.answered)
        return signalled.delivered

    def approvals(self) -> list[Approval]:
        """The calls of this turn that wait for a person's answer, oldest first, then
        those of its agent calls' child turns still running, and theirs, each with its
        ``path`` (docs/sub-agents.md); :meth:`approve` and :meth:`deny` answer any."""
        return _pending(self._runtime, self.turn_id, ())

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
        runtime = self._runtime
        runtime.check_open()
        stored = lambda: runtime.store.run_state(self.turn_id).trace_context  # noqa: E731
        turn_id = self._asking_turn(approval_id)
        with turn_spans.answer(turn_id, approval_id, decision.value, stored):
            answered = runtime.store.answer_approval(turn_id, approval_id, decision, reason)
            runtime.answered(answered)
        return answered.approvals[0]

    def _asking_turn(self, approval_id: str) -> str:
        """The turn whose call ``approval_id`` is: this one, or a descendant's that its
        :meth:`approvals` lists."""
        for approval in _pending(self._runtime, self.turn_id, ()):
            if approval.approval_id == approval_id:
                return approval.turn_id
        # Answered already (the store then says so, naming the answer), or none of ours
        # (the store says that): asked of the turn whose call it is.
        return _asker(self._runtime, self.turn_id, approval_id) or self.turn_id

    def result(self) -> TurnResult | None:
        """The result if the turn has ended, else None."""
        return self._runtime.store.turn_result(self.turn_id)

    def wait(self, timeout: float | None = None, *, deadline: float | None = None) -> TurnResult:
        """Block until the turn ends; :class:`WaitTimeout` after ``timeout`` seconds (naming
        Redis if it could not be reached: the fleet cannot run the turn without it).
        ``deadline``, a :func:`time.monotonic` instant, ends the wait sooner when the
        ``timeout`` began earlier (``Session.turn``'s covers the events before it too)."""
        check_timeout(timeout)
        end = None if timeout is None else time.monotonic() + timeout
        if deadline is not None:
            end = deadline if end is None else min(end, deadline)
        return self._wait_until(end, timeout)

    def _wait_until(self, deadline: float | None, timeout: float | None) -> TurnResult:
        """What :meth:`wait` does, until the monotonic ``deadline`` (that of ``timeout``,
        which its error names)."""
        runtime = self._runtime
        # The store, which holds the truth, is asked first, then after each end the
        # coordinator reports and after each silent poll (it may have lost the signal, or
        # never seen the turn).  Between, block on the turn's ends (one small key, not its
        # tokens); reading them from the start returns at once an end already there.
        seen = 0
        result = runtime.store.turn_result(self.turn_id)
        while result is None:
            self._raise_if_driver_died()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                outage = runtime.coordinator.outage()
                if outage is not None:
                    raise WaitTimeout(
                        f"turn {self.turn_id} did not end within {timeout}s: {outage}, and "
                        "the fleet's workers need it to run the turn"
                    )
                raise WaitTimeout(f"turn {self.turn_id} still running after {timeout}s")
            pause = WAIT_POLL_SECONDS if remaining is None else min(WAIT_POLL_SECONDS, remaining)
            seen = runtime.coordinator.wait_end(self.turn_id, seen, timeout=pause) or seen
            result = runtime.store.turn_result(self.turn_id)
        return result

    def _raise_if_driver_died(self) -> None:
        runtime = self._runtime
        failure = runtime.kicker.failure(self.session_id)
        if failure is not None and not runtime.store.run_state(self.turn_id).status.terminal:
            raise StoreError(f"the driver of this session stopped: {failure}") from failure


def name_in_logs(turn: TurnRecord) -> None:
    """The lines logged from here on in an open log scope (a gateway request, a command)
    name this turn: the one the caller asked for or just made."""
    bind(session_id=turn.session_id, turn_id=turn.turn_id, run_id=turn.run_id)


def _interrupt(runtime: Runtime, turn_id: str) -> int:
    """Interrupt ``turn_id``, then every descendant still running (docs/sub-agents.md),
    each in a transaction of its own, after its parent's: a child's end locks its
    parent's run after its own, and taking them in the other order could deadlock it.
    Returns the interrupt's position in ``turn_id``'s inbox."""
    receipt = runtime.store.accept_steer(turn_id, SteerKind.INTERRUPT, "")
    runtime.coordinator.push_steer(turn_id, receipt.steer)
    if receipt.denied is not None:
        runtime.answered(receipt.denied)
    if receipt.woken is not None:
        runtime.wake(receipt.woken)
    for child in runtime.store.unfinished_children(turn_id):
        with contextlib.suppress(TurnEnded):  # it ended meanwhile
            _interrupt(runtime, child)
    return receipt.steer.position


def _pending(runtime: Runtime, turn_id: str, path: tuple[dict[str, str], ...]) -> list[Approval]:
    """The pending calls of ``turn_id`` (at ``path``), then those of its running
    descendants."""
    store = runtime.store
    pending = [replace(a, path=path) for a in store.approvals(turn_id) if a.pending]
    run_id = store.run_state(turn_id).run_id
    for child in store.children_of_run(run_id):
        if child.status.terminal:
            continue
        step = {"agent": child.agent, "call_id": child.call_id, "turn_id": child.turn_id}
        pending += _pending(runtime, child.turn_id, (*path, step))
    return pending


def _asker(runtime: Runtime, turn_id: str, approval_id: str) -> str | None:
    """The turn of ``turn_id``'s tree (it, or any descendant, ended or not) whose call
    ``approval_id`` is, if any."""
    store = runtime.store
    if any(a.approval_id == approval_id for a in store.approvals(turn_id)):
        return turn_id
    for child in store.children_of_run(store.run_state(turn_id).run_id):
        found = _asker(runtime, child.turn_id, approval_id)
        if found is not None:
            return found
    return None
