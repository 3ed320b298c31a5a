"""A session as a caller holds it: one durable conversation, its turns submitted, run,
seeded, branched and resumed through the runtime that opened it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from parley import compactions, transcript
from parley.coordination.constants import SEEDED
from parley.errors import ForeignTurn, InvalidRequest
from parley.mcp.spec import McpServer
from parley.ports.admission import Priority
from parley.schemas.compactions import CompactionRecord
from parley.schemas.events import Event
from parley.schemas.operations import WebhookDelivery
from parley.schemas.records import IfBusy, SessionRecord, TaskContract, TurnRecord, TurnResult
from parley.seeding import seeded_turns
from parley.telemetry import metrics, tracing, turn_spans
from parley.turn_handle import TurnHandle, name_in_logs
from parley.validation import (
    MAX_CONTEXT_BYTES,
    MAX_PROMPT_BYTES,
    check_id,
    check_if_busy,
    check_json_object,
    check_priority,
    check_request_id,
    check_start,
    check_text,
    check_timeout,
    check_title,
)

if TYPE_CHECKING:
    from parley.client_runtime import Runtime
    from parley.store.submissions import SubmitReceipt


class Session:
    """One durable conversation (a tree of turns and a head)."""

    def __init__(self, runtime: Runtime, record: SessionRecord) -> None:
        self._runtime = runtime
        self._record = record

    @property
    def id(self) -> str:
        """The session id: all a later process needs."""
        return self._record.session_id

    @property
    def root(self) -> str:
        """The workspace root, as stored."""
        return self._record.root

    @property
    def metadata(self) -> dict[str, Any]:
        """The metadata given at creation."""
        return dict(self._record.metadata)

    @property
    def tenant(self) -> str | None:
        """The gateway tenant that owns the session (None: created from Python)."""
        return self._record.tenant

    @property
    def created_at(self) -> datetime:
        """When the session was created (UTC)."""
        return self._record.created_at

    @property
    def head(self) -> str | None:
        """The turn the next one hangs under (None before the first)."""
        return self._runtime.store.get_session(self.id).head_turn_id

    @property
    def retention(self) -> timedelta | None:
        """The session's own time to live once ended (None: the host's, if any)."""
        return self._record.retention

    @property
    def webhook_url(self) -> str | None:
        """Where its turns' ends are posted (None: the host's URL, if any)."""
        return self._record.webhook_url

    @property
    def title(self) -> str | None:
        """What a list of sessions shows: the title given, else the first prompt's
        (None before the first turn).  Read from the store: a submission sets it."""
        return self._runtime.store.get_session(self.id).title

    @property
    def parent_turn_id(self) -> str | None:
        """A child session's parent turn: the turn whose agent call opened it (None: no
        call opened it; docs/sub-agents.md)."""
        return self._record.parent_turn_id

    @property
    def parent_call_id(self) -> str | None:
        """The call of the parent turn that opened this child session (None: none)."""
        return self._record.parent_call_id

    @property
    def agent(self) -> str | None:
        """The path of the agent this child session runs (``writer/critic``; None: it
        is no agent's)."""
        return self._record.agent

    @property
    def replay_of(self) -> str | None:
        """The session this one replays (None: not a replay; docs/replay.md)."""
        return self._record.replay_of

    def set_title(self, title: str) -> None:
        """Give the session ``title``: one line of at most 200 characters, without
        control characters (:class:`InvalidRequest` otherwise).  One write."""
        check_title(title)
        self._runtime.check_open()
        self._record = self._runtime.store.set_title(self.id, title)

    def webhook_deliveries(self) -> list[WebhookDelivery]:
        """Its turns' webhook deliveries, oldest first, each with its state."""
        return self._runtime.store.deliveries(self.id)

    def __repr__(self) -> str:
        return f"<parley.Session {self.id} root={self.root!r}>"

    def turn(
        self,
        prompt: str,
        *,
        contract: TaskContract | None = None,
        on_event: Callable[[Event], None] | None = None,
        request_id: str | None = None,
        if_busy: IfBusy | str = IfBusy.ENQUEUE,
        timeout: float | None = None,
        context: dict[str, Any] | None = None,
        priority: str = "interactive",
    ) -> TurnResult:
        """Run a turn and wait for its result; ``on_event`` sees every event as it happens.
        :class:`WaitTimeout` once ``timeout`` seconds have passed, events included."""
        if on_event is not None and not callable(on_event):
            raise InvalidRequest("on_event must be a callable taking an Event")
        check_timeout(timeout)
        handle = self.submit(
            prompt,
            contract=contract,
            request_id=request_id,
            if_busy=if_busy,
            context=context,
            priority=priority,
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        if on_event is not None:
            stop = threading.Event()
            # The events stop at the deadline (a turn that never ends must not hold the
            # call past it), and the wait after them then says why.
            timer = None if timeout is None else threading.Timer(timeout, stop.set)
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                for event in handle.events(stop=stop):
                    on_event(event)
            finally:
                if timer is not None:
                    timer.cancel()
        return handle.wait(timeout, deadline=deadline)

    def submit(
        self,
        prompt: str | bytes,
        *,
        contract: TaskContract | None = None,
        request_id: str | None = None,
        if_busy: IfBusy | str = IfBusy.ENQUEUE,
        context: dict[str, Any] | None = None,
        priority: str = "interactive",
        at: datetime | None = None,
        after: float | None = None,
    ) -> TurnHandle:
        """Queue a turn and return at once.  A repeated ``request_id`` returns the same turn.

        ``at`` (an aware datetime) or ``after`` (seconds) delays the turn
        (docs/time.md#delayed-turns): it is stored now, queued with its ``not_before``,
        and starts no earlier, on any worker, holding nothing until then; the session's
        later turns wait behind it.  A naive datetime, a negative or non-finite
        ``after``, or both at once are :class:`InvalidRequest`.

        ``priority`` is the turn's lane (docs/admission.md): ``interactive`` (someone
        waits for it: its kick and its model calls go first) or ``batch``.

        ``context`` is the host context of this turn: a JSON object (at most
        ``MAX_CONTEXT_BYTES``) stored with its run, which reaches ``before_turn`` (in
        ``TurnOptions``), every tool (``ToolContext.host_context``), the model request's
        context (never the conversation) and ``after_commit``'s receipt, on whichever
        worker runs the turn; a resume keeps it."""
        text = check_text(prompt, "prompt", MAX_PROMPT_BYTES)
        if context is not None:
            check_json_object(context, "context", MAX_CONTEXT_BYTES)
        busy = check_if_busy(if_busy)
        lane = check_priority(priority)
        not_before = check_start(at, after)
        _check_contract(contract)
        if request_id is not None:
            check_request_id(request_id)
        runtime = self._runtime
        runtime.ready()  # a client that cannot run turns says so before any write
        with turn_spans.submission(self.id, lane) as span:
            receipt = runtime.store.submit_turn(
                session_id=self.id,
                prompt=text,
                request_id=request_id,
                contract=contract,
                if_busy=busy,
                host_context=dict(context) if context else None,
                priority=lane,
                trace_context=tracing.carrier(),
                not_before=not_before,
            )
            turn = receipt.turn
            turn_spans.submitted(span, turn.turn_id, turn.run_id, created=receipt.created)
            # Committed: now publish and kick (inside the span, so that a traced broker
            # client's publish is in the turn's trace).
            self._after_submission(receipt, lane, not_before)
        if receipt.created:
            metrics.turn_submitted()
        return TurnHandle(runtime, receipt.turn, created=receipt.created)

    def _after_submission(
        self, receipt: SubmitReceipt, lane: Priority, not_before: datetime | None
    ) -> None:
        """What follows a submission's commit: the steers it interrupted a turn with,
        the calls it denied, its ``queued`` event and its kick (a repeated request kicks
        again, in case its first kick was lost), and, for a delayed turn, the kick at
        its time."""
        runtime = self._runtime
        for turn_id, steer in receipt.interrupted:
            runtime.coordinator.push_steer(turn_id, steer)
        for answered in receipt.denied:
            runtime.coordinator.publish(list(answered.events))
        name_in_logs(receipt.turn)
        if receipt.created and not_before is not None and not_before > datetime.now(UTC):
            # A delayed turn: nothing for a driver to do before its time, so no kick now
            # (ten thousand of them would queue ten thousand useless kicks ahead of those
            # that start turns due); its timer, or the release of due runs, kicks then
            # (docs/time.md#how-it-starts-on-time).
            runtime.coordinator.publish([receipt.queued] if receipt.queued else [])
            runtime.kicker.kick_at(self.id, not_before, lane)
        else:
            self._announce(receipt.queued, lane)

    def _announce(self, queued: Event | None, priority: Priority = "interactive") -> None:
        """Publish a committed turn's ``queued`` event and get a driver to the session:
        one kick, unless a kick sent earlier is still waiting for a driver, or a driver
        holds the session (either sees this turn: the submission committed first)."""
        runtime = self._runtime
        if queued is None:
            runtime.kicker.kick(self.id, priority)  # (a kick sent earlier may be lost)
        else:
            runtime.wake(self.id, [queued], priority)

    def seed_history(
        self, messages: list[dict[str, Any]], raw_rows: list[Any] | None = None
    ) -> list[TurnRecord]:
        """Import an existing conversation before the session's first turn: ``messages``
        in the OpenAI chat format (``role`` user, assistant or tool; ``content``;
        ``tool_calls``; ``tool_call_id``), which become the session's first turns and
        replay like any others, checked like any others (:class:`CodecError` for a tool
        call without its result); ``raw_rows``, the host's lossless form of the same
        conversation, kept beside them (:meth:`seeded`).  :class:`Conflict` once the
        session has a turn."""
        turns = seeded_turns(messages)
        if raw_rows is not None:
            if not isinstance(raw_rows, list):
                raise InvalidRequest("raw_rows must be a list (of JSON values) or None")
            check_json_object({"raw_rows": raw_rows}, "raw_rows", MAX_PROMPT_BYTES * 10)
        check_json_object({"messages": list(messages)}, "messages", MAX_PROMPT_BYTES * 10)
        self._runtime.check_open()
        return self._runtime.store.seed_history(
            self.id,
            [(t.prompt, t.steps) for t in turns],
            messages=list(messages),
            raw_rows=raw_rows,
        )

    def transcript(self) -> list[transcript.Row]:
        """The history path's rows (root → head), typed: see :mod:`parley.transcript`."""
        store = self._runtime.store
        found: list[transcript.Row] = []
        for turn in store.history(self.id):
            state = store.run_state(turn.turn_id)
            found.extend(
                transcript.rows(
                    turn.turn_id,
                    turn.prompt,
                    store.steps_of(turn.turn_id),
                    partial=state.partial,
                    seeded=state.worker == SEEDED,
                )
            )
        return found

    def seeded(self) -> tuple[list[dict[str, Any]], list[Any] | None] | None:
        """The seeded messages and raw rows as they were given (None: not seeded)."""
        return self._runtime.store.seeded(self.id)

    def compact(
        self, *, strategy: str = "summarize", keep_turns: int = 4, keep: int = 2
    ) -> CompactionRecord:
        """Compact the history now (docs/compaction.md): the model sees the path but its
        newest ``keep_turns`` turns as the compaction's messages from the next turn on;
        ``trim`` keeps the newest ``keep`` tool rounds of what it covers whole.  Stored
        in one transaction with its ``compacted`` event (on the head turn), between
        turns only (:class:`Conflict` while one is unfinished)."""
        chosen = compactions.check_request(strategy, keep_turns, keep)
        self._runtime.check_open()
        return compactions.compact(
            self._runtime, self.id, strategy=chosen, keep_turns=keep_turns, keep=keep
        )

    def compactions(self) -> list[CompactionRecord]:
        """The session's compactions, oldest first, dropped ones included."""
        return self._runtime.store.compactions(self.id)

    def drop_compaction(self, compaction_id: str) -> CompactionRecord:
        """Drop a compaction: from the next turn on the model sees what it covered again.
        The turns were never changed, so nothing is restored; the record stays listed,
        dropped.  :class:`CompactionNotFound` for an id the session has not."""
        check_id(compaction_id)
        self._runtime.check_open()
        return self._runtime.store.drop_compaction(self.id, compaction_id)

    def branch_from(self, turn_id: str) -> None:
        """Make ``turn_id`` the head: the next turn hangs under it.  One write."""
        if turn_id is None or turn_id == "":
            raise InvalidRequest("branch_from needs a turn id")
        check_id(turn_id)
        self._runtime.check_open()
        self._runtime.store.branch(self.id, turn_id)

    def history(self) -> list[TurnRecord]:
        """The turns from the root to the head: what the model sees."""
        return self._runtime.store.history(self.id)

    def tree(self) -> list[TurnRecord]:
        """Every turn of every branch, in submission order."""
        return self._runtime.store.tree(self.id)

    def resume(self, turn_id: str) -> TurnHandle:
        """Continue a cancelled, failed or stranded turn from its last committed step,
        with the same turn id and run id.  Its end moves the head to it, so an ended turn
        is resumed only while nothing follows it: a turn under it, a turn still to run,
        or a head moved past it (or past its parent) is a :class:`Conflict`; to go on
        from such a turn, ``branch_from`` it and submit a new turn.  A turn an interrupt
        ended while it waited for its agent calls' child turns resumes the children the
        interrupt cancelled, and goes on with their new results (docs/sub-agents.md)."""
        check_id(turn_id)
        runtime = self._runtime
        runtime.check_open()
        turn = runtime.store.get_turn(turn_id)
        if turn.session_id != self.id:
            raise ForeignTurn(f"turn {turn_id!r} belongs to session {turn.session_id!r}")
        runtime.kicker.ready()
        turn, queued = runtime.store.resume_turn(turn_id, runtime.coordinator.last_seq(turn_id))
        name_in_logs(turn)
        self._announce(queued)
        return TurnHandle(runtime, turn)


def _check_contract(contract: TaskContract | None) -> None:
    """Refuse a contract that is not one, or names a malformed MCP server, before any
    write."""
    if contract is None:
        return
    if not isinstance(contract, TaskContract):
        raise InvalidRequest("contract must be a parley.TaskContract")
    for server in contract.mcp_servers:
        McpServer.from_json(server)
