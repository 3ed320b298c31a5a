"""The contract a back end implements: the store (durable state, one transaction per
method) and the coordinator (locks, live events, steer lists), with what crosses them
(claims, receipts, turn ends).  :class:`workers.store.sql_store.SqlStore` is the store on SQLite
and PostgreSQL; :class:`workers.coordination.local_coordinator.LocalCoordinator` and
:class:`workers.coordination.redis_coordinator.RedisCoordinator` are the coordinators.  (What a host
author implements is in :mod:`workers.ports.host`.)"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from schemas.events import Event
from schemas.messages import Prefix, StepPayload
from schemas.records import (
    Approval,
    RunState,
    SessionRecord,
    Steer,
    TurnRecord,
    TurnStatus,
    Usage,
)

# ---------------------------------------------------------------------------- store


@dataclass(frozen=True, kw_only=True)
class CommittedStep:
    """A step as stored, with its index."""

    index: int
    payload: StepPayload


@dataclass(frozen=True, kw_only=True)
class PathTurn:
    """A turn on the history path, with its committed steps, for context assembly.
    ``steps`` is None when the claimant said it already knows the turn (it holds the
    turn's replayed messages), so the store did not load them."""

    turn: TurnRecord
    steps: tuple[CommittedStep, ...] | None


@dataclass(frozen=True, kw_only=True)
class ClaimedTurn:
    """Everything the engine needs to run (or continue) a turn, read in the claim."""

    session: SessionRecord
    turn: TurnRecord
    run: RunState
    prefix: Prefix | None
    prefix_generation: int
    history: tuple[PathTurn, ...]
    steps: tuple[CommittedStep, ...]
    pending: tuple[Steer, ...]
    previous_status: str
    next_seq: int


SeqFloor = Callable[[str, int], int]
"""Called with (turn, fence) by a claim of a turn that ran before: adopts the turn's
replay buffer for the fence and returns the highest seq it already holds (the claim
numbers events above it)."""

Claim = tuple[ClaimedTurn, Event]
"""A claimed turn and its ``started`` event (already stored, not yet published)."""


@dataclass(frozen=True, kw_only=True)
class FinishReceipt:
    """What a turn's final transaction committed."""

    end_event: Event
    undelivered: tuple[str, ...]
    head_turn_id: str | None
    prefix_generation: int
    next_claim: Claim | None = None
    later_turns: bool = False
    """The session counted a turn (submitted or resumed) after this one: with no
    ``next_claim``, a driver that lets go must see that someone goes on with it."""


KnownTurns = Callable[[str], bool]
"""Turn ids whose replayed messages a claimant already holds: the store skips loading
their steps when it hands over a claim's history."""


@dataclass(frozen=True, kw_only=True)
class TurnEnd:
    """A turn's outcome as its final transaction commits it.  With ``claim_next`` the
    same transaction also claims the session's next runnable turn."""

    turn_id: str
    status: TurnStatus
    end_seq: int
    reply: str | None = None
    error: str | None = None
    partial: str | None = None
    # The prefix the turn ran with: the session's frozen one, unless ``refresh_prefix``
    # (a claim in the same transaction takes it as the one in force).
    prefix: Prefix | None = None
    refresh_prefix: bool = False
    claim_next: SeqFloor | None = None
    known: KnownTurns | None = None
    worker: str = ""
    # The turn's queue position: the claim is only tried if the session counted a turn
    # after it (one submitted later reaches the driver by the work mark).
    position: int = 0
    # The turn's path from the session's root as its claim read it, the turn itself
    # last: a claim in the same transaction need not read the path it extends.
    path: tuple[TurnRecord, ...] = ()
    # What a step thrown away at the end cost (an answer ``before_commit`` vetoed): the
    # run and the session are charged for it, though nothing of the step commits.
    discarded: Usage = field(default_factory=Usage)
    # Every call of the turn that asked for an answer, and the answer (the end event
    # lists them): ``approval_id``, ``tool``, ``decision``, ``reason``.
    approvals: tuple[dict[str, Any], ...] = ()
    # The host's webhook URL: the end is posted there (from the outbox row the final
    # transaction inserts) unless the session names its own URL.
    webhook_url: str | None = None


@dataclass(frozen=True, kw_only=True)
class StepReceipt:
    """What a step's transaction committed: how many steers the run had accepted by then
    (those past the step's cursor are pending: the next boundary reads them), or, when
    the step was asked to end the turn and none was pending, the turn's end."""

    steer_count: int = 0
    finished: FinishReceipt | None = None


class Store(Protocol):
    """The durable state the engine and the driver need; every method is one
    transaction (:class:`workers.store.sql_store.SqlStore` implements it on SQLite and
    PostgreSQL)."""

    def start_drive(
        self, session_id: str, *, worker: str, seq_floor: SeqFloor, known: KnownTurns | None = None
    ) -> tuple[int, Claim | None]: ...

    def steps_of(self, turn_id: str) -> list[CommittedStep]: ...

    def commit_step(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        step: CommittedStep,
        steer_cursor: int,
        events: Sequence[Event],
        close_inbox_if_idle: bool,
        end: TurnEnd | None = None,
    ) -> StepReceipt: ...

    def pending_steers(self, run_id: str, cursor: int) -> tuple[Steer, ...]: ...

    def close_inbox(
        self, *, run_id: str, session_id: str, fence: int, cursor: int
    ) -> tuple[Steer, ...]: ...

    def finish_turn(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        cursor: int,
        events: Sequence[Event],
        end: TurnEnd,
    ) -> FinishReceipt: ...

    def hold_step(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        held_step: dict[str, Any],
        approvals: Sequence[Approval],
        events: Sequence[Event],
    ) -> None:
        """The step waits for answers: the run becomes ``waiting`` with ``held_step``,
        each asked call gets its approval row, and ``events`` are stored; fenced."""
        ...

    def defer_run(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        not_before: datetime,
        events: Sequence[Event],
    ) -> None:
        """The turn waits for provider capacity: its run is queued again in its place,
        not to be claimed before ``not_before``, and ``events`` are stored; fenced."""
        ...

    def set_trace_context(self, run_id: str, trace_context: dict[str, str]) -> None:
        """Give a run submitted without a trace context this one (its first traced
        attempt's); one it has already is kept."""
        ...

    def approvals_of_run(self, run_id: str) -> dict[str, Approval]:
        """A run's approvals by id, in step and call order."""
        ...

    def consume_approval(self, *, approval_id: str, session_id: str, fence: int) -> bool:
        """Mark an approved call as started, once: True the first time (run it), False
        if an earlier attempt marked it; fenced."""
        ...


# ---------------------------------------------------------------------------- coordination


class SessionLock(Protocol):
    """A held session lock."""

    @property
    def work_mark(self) -> object:
        """The session's work mark when the lock was taken."""
        ...

    def held(self) -> bool:
        """False once the lock was lost (expired, taken over)."""
        ...

    def release(self, *, handing_over: bool = False) -> object:
        """Give the lock back; returns the session's work mark as it stands then (None
        if unknown), for the driver to compare with the one it took the lock with.
        ``handing_over``: the driver kicks the session next, so the kick-pending flag
        stays up (no sweeper kicks it meanwhile)."""
        ...


class Coordinator(Protocol):
    """Locks, live events and steer lists."""

    def try_lock(self, session_id: str) -> SessionLock | None: ...

    def mark_work(self, session_id: str, events: Sequence[Event] = ()) -> bool:
        """Note that the session got new work (while its submission holds the session
        row, before the kick), publishing ``events`` (its ``queued`` event) with it.
        Returns whether the work needs a kick: not while an earlier kick still waits for
        a driver, nor (for a while) as a driver holds the session: it compares the work
        mark when it lets go, and goes on."""
        ...

    def publish(self, events: Sequence[Event], fence: int = 0, *, now: bool = False) -> None:
        """Publish events; batched in the background unless ``now``, which sends them
        (and anything queued before them) before returning."""
        ...

    def flush(self, turn_ids: Iterable[str] | None = None) -> None:
        """Send what ``publish`` has queued (of ``turn_ids`` only, if given), from the
        caller's thread, now."""
        ...

    def coalesce(self, token: Event, text: str, fence: int = 0) -> Event | None:
        """Append ``text`` to ``token`` if that event is still queued, unsent, as the last
        one, and return the event as it now stands; None if it has gone (then the caller
        publishes a new event)."""
        ...

    def adopt(self, turn_id: str, fence: int) -> int:
        """Make ``fence`` the only driver allowed to publish the turn's events, and return
        the newest seq already buffered (the claim numbers events above it)."""
        ...

    def read_events(self, turn_id: str, after: int, timeout: float) -> list[Event]: ...

    def last_seq(self, turn_id: str) -> int: ...

    def wait_end(self, turn_id: str, after: int, timeout: float) -> int:
        """The seq of the newest ``end`` published with seq > ``after``, waiting up to
        ``timeout`` for one; 0 if none (a hint: the store says whether the turn ended)."""
        ...

    def wait_ends(self, after: Mapping[str, int], timeout: float, doorbell: str) -> dict[str, int]:
        """For each turn of ``after`` with an ``end`` published past its seq there, the
        newest one's seq, waiting up to ``timeout`` for any, or until ``doorbell`` is
        rung (``{}`` then): one watcher's wait on many turns at once."""
        ...

    def ring(self, doorbell: str) -> None:
        """Wake the :meth:`wait_ends` waiting on ``doorbell`` (now, or the next one, if
        none waits yet): its watcher has a new turn to watch."""
        ...

    def buffer_covers(self, turn_id: str, seq: int) -> bool:
        """Whether the turn's replay buffer holds the events from ``seq + 1`` on (so a
        reader at ``seq`` can wait for it rather than read the store)."""
        ...

    def push_steer(self, turn_id: str, steer: Steer) -> None:
        """Append a steer the store accepted (committed) to the turn's steer list.  A push
        that fails, or a list that is lost, costs only speed: a boundary that finds the
        list behind the count its last commit saw reads the store."""
        ...

    def steers_after(self, turn_id: str, cursor: int, *, fresh: bool = False) -> list[Steer]:
        """The listed steers of the turn with a position past ``cursor``, in position
        order (possibly with gaps, or missing the newest: the caller checks them against
        the store's count).  An implementation may answer from a recent look unless
        ``fresh`` is asked for."""
        ...

    def publish_listing_steers(
        self, events: Sequence[Event], fence: int, turn_id: str, cursor: int
    ) -> list[Steer]:
        """Publish ``events`` now and give what a fresh :meth:`steers_after` gives, in
        one round trip where the two would take two (a driver whose step commit counted
        pending steers needs both)."""
        ...

    def ping(self) -> bool:
        """Whether the coordinator answers now (readiness checks)."""
        ...

    def outage(self) -> str | None:
        """Why the coordinator's latest read failed, naming what could not be reached,
        for an error to say (None: it answered)."""
        ...

    def forget(self, session_id: str, turn_ids: Sequence[str]) -> None:
        """Drop what is kept for a session that was pruned and for its turns (replay
        buffers, ends, steer lists, work marks; not a lock, which expires on its own)."""
        ...

    def close(self) -> None:
        """Send what ``publish`` has queued, then stop what runs in the background
        (threads, connections).  The owner calls it once it is done with the coordinator."""
        ...
