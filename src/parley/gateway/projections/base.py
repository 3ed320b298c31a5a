"""The walk every protocol view of a turn shares (docs/protocols.md): a
:class:`TurnProjection` is fed one turn's parley events in seq order, keeps what every
protocol must know of them, and hands each to a hook of its subclass, which only formats
it in the protocol's own events.

What the walk keeps, for every protocol:

- the current step, opened by its first token, by its commit, or by a hook that shows
  something of it (:meth:`~TurnProjection._open_step`), and finished by its commit, by
  another step's opening, by an ``end`` and by the view's end;
- the text this attempt of the step streamed (a restart starts it again), and a commit
  reconciled with it (:meth:`~TurnProjection.reconcile`): what the stream lacked is
  streamed (all of it, for a replay whose tokens aged out), and a stream the committed
  text does not start with is retracted as a restart (``diverged``) before the committed
  text streams whole;
- how often each step restarted;
- the last ``end``, which :meth:`~TurnProjection.close` answers from (a turn resumed after
  an ``end`` goes on in the same feed), and whether the view is over;
- the approvals asked and not yet answered (:attr:`~TurnProjection.asked`,
  :meth:`~TurnProjection.interrupt`).

The hooks, each abstract but :meth:`~TurnProjection.before_event` and
:meth:`~TurnProjection.reconcile`:

============================  ==========================================================
the walk meets                it does, then calls
============================  ==========================================================
any event                     ``before_event``
``queued``, ``started``       ``on_queued``, ``on_started``
``token``                     (a step opens, and its text grows) ``on_text``
``tool_call``                 ``on_tool_call``
``tool_result``               ``on_tool_result``
``refusal``                   ``on_refusal``
``steer``                     ``on_steer``
``check``                     ``on_check``
``throttled``                 ``on_throttled``
``waiting``                   ``on_waiting``
``compacted``                 ``on_compacted``
``agent_started``             ``on_agent_started``
``agent_ended``               ``on_agent_ended``
``step`` (committed)          (the step opens) ``reconcile``, which may call
                              ``on_restart`` and ``on_text``; (the step finishes)
``step_restarted``            ``on_restart``; the step stays open, its text starts again
``approval_requested``        (it is pending) ``on_approval_requested``
``approval_answered``         (it is not) ``on_approval_answered``
``end``                       (the step finishes, the end is kept) ``on_end``
a step opens, finishes        ``new_step`` and ``on_step_start``; ``on_step_finish``
:meth:`close`                 (the step finishes) ``on_close``
:meth:`interrupt`             (the step finishes) ``on_interrupt``
============================  ==========================================================

Dispatch is a ``match`` over :data:`~parley.schemas.events.Payload` that ends in
``assert_never``, so a payload class added to that union is a mypy error here until the
walk dispatches it to a hook, and a new abstract hook is one in every projection (each
is ``@final``) until it formats it: CONTRIBUTING.md, "How to add an event kind".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, assert_never

from parley.schemas.events import (
    AgentEnded,
    AgentStarted,
    ApprovalAnswered,
    ApprovalRequested,
    Checked,
    Compacted,
    Ended,
    Event,
    EventKind,
    Payload,
    Queued,
    Refused,
    Started,
    Steered,
    StepCommitted,
    StepRestarted,
    Throttled,
    Token,
    ToolAnswered,
    ToolCalled,
    WaitingForEvent,
)

Out = list[dict[str, Any]]
"""The protocol's events a hook adds to, in order."""


@dataclass(kw_only=True)
class StepView:
    """What a view has shown of one step since its last restart (a protocol's own step
    record extends it)."""

    index: int
    attempt: int = 0
    """How often the step restarted before this attempt."""
    text: str = ""
    """The text this attempt streamed."""
    settled: bool = False
    """The client holds the step's text already (a view that continues another opened
    on it): its commit's text is taken as streamed."""


StepT = TypeVar("StepT", bound=StepView)


class TurnProjection(ABC, Generic[StepT]):
    """A view of one turn in a protocol's events, fed its parley events in seq order:
    the walk (see the module) and the hooks a protocol formats with."""

    def __init__(self, *, asked: Mapping[str, str] | None = None) -> None:
        """``asked``: approvals (id → call id) the client was shown asked already."""
        self._seq = 0
        self._step: StepT | None = None
        self._restarts: dict[int, int] = {}
        self._end: Ended | None = None
        self._closed = False
        self._pending: dict[str, str] = dict(asked or {})  # approval id → call id

    # ------------------------------------------------------------------ the view

    @abstractmethod
    def opening(self) -> Out:
        """What the protocol sends before any of the turn's events."""

    def feed(self, event: Event) -> Out:
        """The protocol's events for the turn's next event (none once the view is over)."""
        out: Out = []
        if self._closed:
            return out
        self._seq = event.seq
        self.before_event(out)
        if event.kind is EventKind.TOKEN:
            # The hot path (every reader projects every token): the wire form is read as
            # it is, with no payload object made (a Token payload walks the same way).
            self._stream(out, int(event.data["step"]), str(event.data["text"]))
        else:
            self._dispatch(out, event.payload)
        return out

    def close(self, cut: str | None = None) -> Out:
        """The protocol's closing events once the turn's feed is over, from the last
        ``end`` (``cut`` says why it ended without one: the reader failed or fell
        behind)."""
        if self._closed:
            return []
        self._closed = True
        out: Out = []
        self._finish_step(out)
        self.on_close(out, self._end, cut)
        return out

    @property
    def asked(self) -> set[str]:
        """The approvals this view has shown asked and not yet answered."""
        return set(self._pending)

    def interrupt(self, approval_ids: Sequence[str]) -> Out:
        """The view's end while the turn waits for ``approval_ids``, each shown asked;
        nothing if one of them was not (or the view is over)."""
        if self._closed or not approval_ids or not set(approval_ids) <= set(self._pending):
            return []
        return self._pause(approval_ids)

    @property
    def seq(self) -> int:
        """The seq of the event being fed (of the last one, between events)."""
        return self._seq

    def restarts(self, index: int) -> int:
        """How often step ``index`` restarted so far."""
        return self._restarts.get(index, 0)

    def _pause(self, approval_ids: Sequence[str]) -> Out:
        """The view's end while the turn waits for a person (``approval_ids``: on what)."""
        self._closed = True
        out: Out = []
        self._finish_step(out)
        self.on_interrupt(out, approval_ids)
        return out

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, out: Out, payload: Payload) -> None:
        match payload:
            case Token() | StepCommitted() | StepRestarted():
                self._step_event(out, payload)
            case (
                ToolCalled() | ToolAnswered() | Refused() | ApprovalRequested() | ApprovalAnswered()
            ):
                self._call_event(out, payload)
            case Steered() | Checked() | Throttled() | WaitingForEvent() | Compacted():
                self._notice(out, payload)
            case Queued() | Started() | Ended():
                self._turn_event(out, payload)
            case AgentStarted():
                self.on_agent_started(out, payload)
            case AgentEnded():
                self.on_agent_ended(out, payload)
            case _:
                assert_never(payload)

    def _step_event(self, out: Out, payload: Token | StepCommitted | StepRestarted) -> None:
        match payload:
            case Token():  # (feed walks a token's wire form, making no payload)
                self._stream(out, payload.step, payload.text)
            case StepCommitted():
                self.reconcile(out, self._open_step(out, payload.step), payload)
                self._finish_step(out)
            case StepRestarted():
                self._restart(out, payload.step, payload.reason)
            case _:
                assert_never(payload)

    def _call_event(
        self,
        out: Out,
        payload: ToolCalled | ToolAnswered | Refused | ApprovalRequested | ApprovalAnswered,
    ) -> None:
        match payload:
            case ToolCalled():
                self.on_tool_call(out, payload)
            case ToolAnswered():
                self.on_tool_result(out, payload)
            case Refused():
                self.on_refusal(out, payload)
            case ApprovalRequested():
                self._pending[payload.approval_id] = payload.call_id
                self.on_approval_requested(out, payload)
            case ApprovalAnswered():
                call_id = self._pending.pop(payload.approval_id, None)
                self.on_approval_answered(out, payload, call_id)
            case _:
                assert_never(payload)

    def _notice(
        self, out: Out, payload: Steered | Checked | Throttled | WaitingForEvent | Compacted
    ) -> None:
        match payload:
            case Steered():
                self.on_steer(out, payload)
            case Checked():
                self.on_check(out, payload)
            case Throttled():
                self.on_throttled(out, payload)
            case WaitingForEvent():
                self.on_waiting(out, payload)
            case Compacted():
                self.on_compacted(out, payload)
            case _:
                assert_never(payload)

    def _turn_event(self, out: Out, payload: Queued | Started | Ended) -> None:
        match payload:
            case Queued():
                self.on_queued(out, payload)
            case Started():
                self.on_started(out, payload)
            case Ended():
                # Not the view's end yet: a resumed turn goes on in the same feed, and
                # close() answers from the last end.
                self._finish_step(out)
                self._end = payload
                self.on_end(out, payload)
            case _:
                assert_never(payload)

    # ------------------------------------------------------------------ steps

    def _open_step(self, out: Out, index: int) -> StepT:
        """Step ``index``, opened now (and the open one finished) unless it is open."""
        step = self._step
        if step is not None and step.index == index:
            return step
        self._finish_step(out)
        step = self._step = self.new_step(index, self.restarts(index))
        self.on_step_start(out, step)
        return step

    def _continue_step(self, index: int) -> None:
        """Open step ``index`` as the client holds it already, showing nothing: the view
        continues one that ended inside it."""
        step = self._step = self.new_step(index, 0)
        step.settled = True

    def _finish_step(self, out: Out) -> None:
        step = self._step
        if step is None:
            return
        self.on_step_finish(out, step)
        self._step = None

    def _stream(self, out: Out, index: int, text: str) -> None:
        """``text`` streamed into step ``index`` (none: nothing, not even the step)."""
        if not text:
            return
        step = self._open_step(out, index)
        step.text += text
        self.on_text(out, step, text)

    def _restart(self, out: Out, index: int, reason: str) -> None:
        step = self._step if self._step is not None and self._step.index == index else None
        attempt = self.restarts(index) + 1
        self._restarts[index] = attempt
        self.on_restart(out, index, reason, step)
        if step is not None:
            # The step stays open (nothing starts it again); its text starts again.
            self._step = self.new_step(index, attempt)

    def reconcile(self, out: Out, step: StepT, committed: StepCommitted) -> None:
        """Make what the client was shown of the open ``step`` its committed text: the
        rest of it if the stream lacked some (a replay whose tokens aged out has none),
        and all of it after a restart (``diverged``) if the stream is not its start (never
        so while the step restarts as parley promises)."""
        if step.settled:
            step.text = committed.text
        if committed.text == step.text:
            return
        if not committed.text.startswith(step.text):
            self._restart(out, committed.step, "diverged")
            step = self._open_step(out, committed.step)
        self._stream(out, committed.step, committed.text[len(step.text) :])

    # ------------------------------------------------------------------ hooks

    def before_event(self, out: Out) -> None:
        """What the protocol sends before any event's own (nothing, unless overridden)."""

    @abstractmethod
    def new_step(self, index: int, attempt: int) -> StepT:
        """The record of step ``index``'s attempt ``attempt`` (0 for the first)."""

    @abstractmethod
    def on_step_start(self, out: Out, step: StepT) -> None:
        """A step opened."""

    @abstractmethod
    def on_step_finish(self, out: Out, step: StepT) -> None:
        """The open step is over (committed, another step began, the turn ended)."""

    @abstractmethod
    def on_text(self, out: Out, step: StepT, text: str) -> None:
        """``step``'s text grew by ``text`` (``step.text`` includes it)."""

    @abstractmethod
    def on_restart(self, out: Out, index: int, reason: str, dropped: StepT | None) -> None:
        """Step ``index`` restarts: retract what was shown of it (``dropped``: the open
        step as it was, None if it is not open)."""

    @abstractmethod
    def on_queued(self, out: Out, queued: Queued) -> None:
        """The turn was queued (again, by a resume or after a wait)."""

    @abstractmethod
    def on_started(self, out: Out, started: Started) -> None:
        """A driver took the turn."""

    @abstractmethod
    def on_tool_call(self, out: Out, call: ToolCalled) -> None:
        """The model asked for a call."""

    @abstractmethod
    def on_tool_result(self, out: Out, result: ToolAnswered) -> None:
        """A call's result."""

    @abstractmethod
    def on_refusal(self, out: Out, refused: Refused) -> None:
        """The policy or the approver refused a call."""

    @abstractmethod
    def on_steer(self, out: Out, steered: Steered) -> None:
        """A steer reached the model."""

    @abstractmethod
    def on_check(self, out: Out, checked: Checked) -> None:
        """The contract's check ran."""

    @abstractmethod
    def on_throttled(self, out: Out, throttled: Throttled) -> None:
        """The turn waits for provider capacity."""

    @abstractmethod
    def on_waiting(self, out: Out, waiting: WaitingForEvent) -> None:
        """A call waits for an event or a time (docs/time.md#waiting-for-an-event)."""

    @abstractmethod
    def on_compacted(self, out: Out, compacted: Compacted) -> None:
        """A compaction now stands for the older turns the model sees
        (docs/compaction.md)."""

    @abstractmethod
    def on_agent_started(self, out: Out, started: AgentStarted) -> None:
        """An agent call opened its child turn (docs/sub-agents.md)."""

    @abstractmethod
    def on_agent_ended(self, out: Out, ended: AgentEnded) -> None:
        """An agent call's child turn ended."""

    @abstractmethod
    def on_approval_requested(self, out: Out, asked: ApprovalRequested) -> None:
        """A call waits for a person's answer (it is pending now)."""

    @abstractmethod
    def on_approval_answered(
        self, out: Out, answered: ApprovalAnswered, call_id: str | None
    ) -> None:
        """A waiting call got its answer (``call_id``: that call's, if this view saw it
        asked)."""

    @abstractmethod
    def on_end(self, out: Out, end: Ended) -> None:
        """The turn ended (a resume may go on after it)."""

    @abstractmethod
    def on_close(self, out: Out, end: Ended | None, cut: str | None) -> None:
        """The view's end after the feed: ``end`` the turn's last (None if the feed was
        cut, ``cut`` saying why)."""

    @abstractmethod
    def on_interrupt(self, out: Out, approval_ids: Sequence[str]) -> None:
        """The view's end while the turn waits for a person's answers."""
