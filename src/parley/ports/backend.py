"""The contract a back end implements: the store (durable state, one transaction per
method) and the coordinator (locks, live events, steer lists), with what crosses them
(claims, receipts, turn ends).  :class:`parley.store.sql_store.SqlStore` is the store on SQLite
and PostgreSQL; :class:`parley.coordination.local_coordinator.LocalCoordinator` and
:class:`parley.coordination.redis_coordinator.RedisCoordinator` are the coordinators.  (What a host
author implements is in :mod:`parley.ports.host`.)"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from parley.schemas.compactions import CompactionDraft, CompactionRecord
from parley.schemas.events import Event
from parley.schemas.messages import Prefix, StepPayload
from parley.schemas.records import (
    Approval,
    RunState,
    SessionRecord,
    Steer,
    SteerKind,
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
    """The history path to the turn's parent, root first, or only its turns after
    ``compaction``'s ``through_turn_id`` when one applies (the turns it covers are not
    read: docs/compaction.md#which-one-applies)."""
    steps: tuple[CommittedStep, ...]
    pending: tuple[Steer, ...]
    previous_status: str
    next_seq: int
    compaction: CompactionRecord | None = None
    """What the model sees instead of the history through its ``through_turn_id``
    (docs/compaction.md); those turns are not in ``history``."""


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
    kicks: tuple[Kick, ...] = ()
    """The sessions a child turn's end gave work, to kick once this commits
    (docs/sub-agents.md): a sibling's that took its place, or its parent's, queued
    again when this was its step's last child."""
    parent_events: tuple[Event, ...] = ()
    """A child turn's end: its parent's ``agent_ended`` event, stored with it, to
    publish."""


@dataclass(frozen=True, kw_only=True)
class Kick:
    """A session to kick after a commit, on the queue of ``priority``."""

    session_id: str
    priority: str = "interactive"


@dataclass(frozen=True, kw_only=True)
class ChildTurn:
    """An agent call of a held step, as its child turn is opened (docs/sub-agents.md):
    the call, the agent's path (``writer/critic``), the task (the child's prompt) and
    the contract the child runs under."""

    call_id: str
    agent: str
    task: str
    session_id: str
    turn_id: str
    run_id: str
    """The child's ids, chosen by the caller: the parent's ``agent_started`` event names
    them, stored in the same transaction."""
    contract: Any = None
    """The child turn's ``TaskContract`` (None: none)."""
    trace_context: dict[str, str] | None = None
    """The W3C context of the call's ``execute_tool`` span, stored with the child's run so
    that its spans nest under the call (None: the parent run's, or tracing is off)."""


@dataclass(frozen=True, kw_only=True)
class ChildEnd:
    """A call's child turn as its store row says: running (``status`` unfinished) or
    ended, with its reply or error."""

    call_id: str
    agent: str
    session_id: str
    turn_id: str
    status: TurnStatus
    reply: str | None
    error: str | None


@dataclass(frozen=True, kw_only=True)
class EventWait:
    """A call of a held step that waits for an event or a time
    (docs/time.md#waiting-for-an-event): ``event`` (None: a timer), until when
    (``until``, None: no deadline), and, once it ended, how (``state``: ``waiting``,
    ``signalled``, ``timed_out`` or ``cancelled``) with the payload of the signal that
    woke it."""

    call_id: str
    position: int
    event: str | None
    until: datetime | None
    state: str = "waiting"
    payload: Any = None


@dataclass(frozen=True, kw_only=True)
class EventHold:
    """A step held for its calls that wait (docs/time.md#waiting-for-an-event): its
    turn, index and steer ``cursor``, its stored form, and each waiting call's wait."""

    turn_id: str
    step: int
    cursor: int
    held_step: dict[str, Any]
    waits: Sequence[EventWait]


@dataclass(frozen=True, kw_only=True)
class Spawned:
    """What an attempt that held its step for child turns asks of its driver: a kick of
    each child's session, and the children's ``queued`` events to publish."""

    kicks: tuple[Kick, ...]
    events: tuple[Event, ...] = ()


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
    # The turn's path as its claim read it (from the root, or after ``compaction``, the
    # compaction that applied to it), the turn itself last: a claim in the same
    # transaction need not read the path it extends.
    path: tuple[TurnRecord, ...] = ()
    compaction: CompactionRecord | None = None
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
    transaction (:class:`parley.store.sql_store.SqlStore` implements it on SQLite and
    PostgreSQL)."""

    def start_drive(
        self,
        session_id: str,
        *,
        worker: str,
        seq_floor: SeqFloor,
        known: KnownTurns | None = None,
        held_back: frozenset[str] = frozenset(),
    ) -> tuple[int, Claim | None]:
        """A new fencing token for a driver that took the session's lock, and the claim
        of its next runnable turn.  ``held_back``: tenants whose interactive turns do not
        start now (each holds its share of the fleet's workers while another tenant's
        wait: src/parley/runtime/interactive_share.py); such a turn moves to the batch lane
        instead, and nothing is claimed."""
        ...

    def steps_of(self, turn_id: str) -> list[CommittedStep]: ...

    def history(self, session_id: str) -> list[TurnRecord]:
        """The session's turns on its history path, root first (a replay's original)."""
        ...

    def path(self, head: str | None) -> list[TurnRecord]:
        """The turns from the root to ``head``, root first (none without a head)."""
        ...

    def compacted_path(
        self, head: str | None, native_of: str
    ) -> tuple[CompactionRecord | None, list[TurnRecord]]:
        """The compaction that applies under ``head`` for a model of the provider
        ``native_of`` names (``""``: a model that takes no native item), and the path's
        turns after it, root first (all of them when none applies)."""
        ...

    def add_steer(self, turn_id: str, kind: SteerKind, text: str) -> Steer:
        """Accept a steer into a turn's inbox (a replay places its original's steers)."""
        ...

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

    def hold_for_agents(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        held_step: dict[str, Any],
        children: Sequence[ChildTurn],
        events: Sequence[Event],
        parallel: int,
    ) -> Spawned:
        """The step waits for its agent calls' child turns: the run becomes ``waiting``
        (for agents) with ``held_step``, each call's child session, turn and run are
        inserted (once per run, step and call; ``parallel`` of them runnable at once,
        the others waiting for a place), and ``events`` are stored; fenced."""
        ...

    def children_of_step(self, run_id: str, step: int) -> dict[str, ChildEnd]:
        """The child turns of a run's step by call id (a read)."""
        ...

    def resumable_children(self, run_id: str, step: int) -> list[ChildEnd]:
        """The children of a run's step that an interrupt of their parent cancelled and
        that may be resumed, in the model's order of the calls (a read)."""
        ...

    def resume_for_agents(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        held_step: dict[str, Any],
        children: Sequence[ChildEnd],
        events: Sequence[Event],
        parallel: int,
    ) -> Spawned:
        """A resumed parent's step waits again for its ``children``, each resumed
        (``parallel`` of them runnable at once, the others waiting for a place): the run
        becomes ``waiting`` (for agents) with ``held_step``, and ``events`` are stored;
        fenced."""
        ...

    def hold_for_event(
        self, *, run_id: str, session_id: str, fence: int, hold: EventHold, events: Sequence[Event]
    ) -> bool:
        """The step waits for events or times: each waiting call gets its row and takes
        a signal kept for it (or, with an interrupt accepted past the step's steer
        cursor, is cancelled), and ``events`` are stored; fenced.  True when every wait
        ended at once (the run still runs, holding its step); else the run becomes
        ``waiting`` (for an event) until its soonest deadline."""
        ...

    def waits_of_step(self, run_id: str, step: int) -> dict[str, EventWait]:
        """The waits of a run's step by call id, each as it ended (a read)."""
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

    def compact_for_run(
        self,
        *,
        run_id: str,
        session_id: str,
        fence: int,
        draft: CompactionDraft,
        seq: int,
        events: Sequence[Event],
    ) -> tuple[CompactionRecord, Event]:
        """Store a compaction the run made before its first model call, with ``events``
        and its ``compacted`` event (``seq``), charging what it cost; fenced."""
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
