"""A session as a caller holds it: one durable conversation, its turns submitted, run,
seeded, branched and resumed through the client that opened it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from parley import transcript
from parley.errors import ForeignTurn, InvalidRequest
from parley.mcp.spec import McpServer
from parley.seeding import seeded_turns
from parley.turn_handle import TurnHandle, name_in_logs
from parley.validation import (
    MAX_CONTEXT_BYTES,
    MAX_PROMPT_BYTES,
    check_id,
    check_if_busy,
    check_json_object,
    check_priority,
    check_request_id,
    check_text,
    check_timeout,
    check_title,
)
from schemas.events import Event
from schemas.operations import WebhookDelivery
from schemas.records import IfBusy, SessionRecord, TaskContract, TurnRecord, TurnResult
from workers.coordination.constants import SEEDED
from workers.ports.admission import Priority
from workers.telemetry import metrics, tracing, turn_spans

if TYPE_CHECKING:
    from parley.client import Client


class Session:
    """One durable conversation (a tree of turns and a head)."""

    def __init__(self, client: Client, record: SessionRecord) -> None:
        self._client = client
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
        return self._client.store.get_session(self.id).head_turn_id

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
        return self._client.store.get_session(self.id).title

    def set_title(self, title: str) -> None:
        """Give the session ``title``: one line of at most 200 characters, without
        control characters (:class:`InvalidRequest` otherwise).  One write."""
        check_title(title)
        self._client._check_open()
        self._record = self._client.store.set_title(self.id, title)

    def webhook_deliveries(self) -> list[WebhookDelivery]:
        """Its turns' webhook deliveries, oldest first, each with its state."""
        return self._client.store.deliveries(self.id)

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
        return handle._wait_until(deadline, timeout)

    def submit(
        self,
        prompt: str | bytes,
        *,
        contract: TaskContract | None = None,
        request_id: str | None = None,
        if_busy: IfBusy | str = IfBusy.ENQUEUE,
        context: dict[str, Any] | None = None,
        priority: str = "interactive",
    ) -> TurnHandle:
        """Queue a turn and return at once.  A repeated ``request_id`` returns the same turn.

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
        if contract is not None and not isinstance(contract, TaskContract):
            raise InvalidRequest("contract must be a parley.TaskContract")
        if contract is not None:
            for server in contract.mcp_servers:
                McpServer.from_json(server)  # a malformed server is refused before any write
        if request_id is not None:
            check_request_id(request_id)
        client = self._client
        client._check_open()
        client._kicker.ready()  # a client that cannot run turns says so before any write
        with turn_spans.submission(self.id, lane) as span:
            receipt = client.store.submit_turn(
                session_id=self.id,
                prompt=text,
                request_id=request_id,
                contract=contract,
                if_busy=busy,
                host_context=dict(context) if context else None,
                priority=lane,
                trace_context=tracing.carrier(),
            )
            turn = receipt.turn
            turn_spans.submitted(span, turn.turn_id, turn.run_id, created=receipt.created)
            for turn_id, steer in receipt.interrupted:
                client.coordinator.push_steer(turn_id, steer)
            for answered in receipt.denied:
                client.coordinator.publish(list(answered.events))
            # Committed: now publish and kick (inside the span, so that a traced broker
            # client's publish is in the turn's trace).  A repeated request kicks again,
            # in case its first kick was lost.
            name_in_logs(receipt.turn)
            self._announce(receipt.queued, lane)
        if receipt.created:
            metrics.turn_submitted()
        return TurnHandle(client, receipt.turn, created=receipt.created)

    def _announce(self, queued: Event | None, priority: Priority = "interactive") -> None:
        """Publish a committed turn's ``queued`` event and get a driver to the session:
        one kick, unless a kick sent earlier is still waiting for a driver, or a driver
        holds the session (either sees this turn: the submission committed first)."""
        client = self._client
        if queued is None or client.coordinator.mark_work(self.id, [queued]):
            client._kicker.kick(self.id, priority)

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
        self._client._check_open()
        return self._client.store.seed_history(
            self.id,
            [(t.prompt, t.steps) for t in turns],
            messages=list(messages),
            raw_rows=raw_rows,
        )

    def transcript(self) -> list[transcript.Row]:
        """The history path's rows (root → head), typed: see :mod:`parley.transcript`."""
        store = self._client.store
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
        return self._client.store.seeded(self.id)

    def branch_from(self, turn_id: str) -> None:
        """Make ``turn_id`` the head: the next turn hangs under it.  One write."""
        if turn_id is None or turn_id == "":
            raise InvalidRequest("branch_from needs a turn id")
        check_id(turn_id)
        self._client._check_open()
        self._client.store.branch(self.id, turn_id)

    def history(self) -> list[TurnRecord]:
        """The turns from the root to the head: what the model sees."""
        return self._client.store.history(self.id)

    def tree(self) -> list[TurnRecord]:
        """Every turn of every branch, in submission order."""
        return self._client.store.tree(self.id)

    def resume(self, turn_id: str) -> TurnHandle:
        """Continue a cancelled, failed or stranded turn from its last committed step,
        with the same turn id and run id.  Its end moves the head to it, so an ended turn
        is resumed only while nothing follows it: a turn under it, a turn still to run,
        or a head moved past it (or past its parent) is a :class:`Conflict`; to go on
        from such a turn, ``branch_from`` it and submit a new turn."""
        check_id(turn_id)
        client = self._client
        client._check_open()
        turn = client.store.get_turn(turn_id)
        if turn.session_id != self.id:
            raise ForeignTurn(f"turn {turn_id!r} belongs to session {turn.session_id!r}")
        client._kicker.ready()
        turn, queued = client.store.resume_turn(turn_id, client.coordinator.last_seq(turn_id))
        name_in_logs(turn)
        self._announce(queued)
        return TurnHandle(client, turn)
