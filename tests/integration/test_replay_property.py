"""Checked replay under random interleavings: no request ever carries an incomplete tool
round (issue 4), and an approved call runs at most once per answer (issue 19).

Hypothesis draws whole conversations: turns of steps that call tools or answer, with
steers, interrupts (at a boundary, mid-stream, during a tool), driver crashes (mid-stream
and inside a tool) and resumes of crashed or interrupted turns.  Every request the model
is sent is checked by a verifier written here, independently of ``parley.engine.context``: each
assistant tool call is answered by exactly one result before the conversation goes on,
and no text streamed by an attempt that never committed is ever replayed.

With approvals, a step's calls may ask (the policy asks about ``asked_work``): the turn
waits, and its calls are answered in any order, approved or denied, with a steer or an
interrupt (before any answer, or midway) while it waits, and the driver crashes right
after the hold commits, as it goes on, right after an approved call is marked started, or
inside an approved call.  Besides the replay, the verifier checks every asked call
against the store: it has one answer, the one given (or ``interrupted``), a denied call
never ran, an approved one ran at most once, and its result says what happened.

In both, every accepted ``say`` is in exactly one of a committed step's request (and one
``steer`` event, naming that step, says so) or the turn's ``undelivered`` (and one ``end``
event reports it): never both, never neither, whatever interrupted or crashed.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest.mock import patch

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import parley
from parley.engine.tool_calls import NOT_RUN_INTERRUPTED
from parley.errors import StoreError, TurnEnded, WaitTimeout
from parley.ports.host import DeltaSink, ModelReply, ModelRequest, ToolContext
from parley.schemas.events import EventKind
from parley.schemas.messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from parley.schemas.records import Decision, TurnStatus

EVENTS = (
    "none",
    "say",
    "say_mid_stream",
    "interrupt",
    "interrupt_mid_stream",
    "interrupt_in_tool",
    "crash_mid_stream",
    "crash_in_tool",
)
PARTIAL = "UNCOMMITTED"
# What a person does while a step waits for answers: answer every call in the planned
# order, steer first, interrupt before any answer, or interrupt after half the answers.
WHILE_WAITING = ("answer", "say", "interrupt_first", "interrupt_midway")
# Where a driver dies around a step that waited: just after the hold committed, as the
# next driver goes on with it (before any call ran), just after an approved call was
# marked started (before it ran), or inside the first approved call that runs.
CRASHES = (
    "none",
    "crash_after_hold",
    "crash_going_on",
    "crash_after_consume",
    "crash_in_approved",
)
DENIAL = "not now"


class Crash(BaseException):
    """Kills the driver thread where it is, as a dying process would: nothing after this
    point commits, and nothing in the engine catches it."""


@dataclass(frozen=True)
class StepPlan:
    calls: int
    event: str
    asks: tuple[bool, ...] = ()
    """Per call: whether it asks for an answer (the step then waits)."""
    order: tuple[int, ...] = ()
    """The asking calls' positions, in the order they are answered..."""
    approve: tuple[bool, ...] = ()
    """...and each answer, in that order."""
    waiting: str = "answer"
    crash: str = "none"

    def asks_at(self, position: int) -> bool:
        return position < len(self.asks) and self.asks[position]


@dataclass
class Conversation:
    """The model and tool for one drawn conversation, and what they saw."""

    turns: list[list[StepPlan]]
    requests: list[tuple[Message, ...]] = field(default_factory=list)
    handle: Any = None
    fired: set[tuple[int, int, str]] = field(default_factory=set)
    turn_number: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    runs: Counter[str] = field(default_factory=Counter)
    """How many times each call (by id) started running."""
    answers: dict[str, bool] = field(default_factory=dict)
    """The answer given to each asked call (by id): approved or not."""
    said: dict[str, list[str]] = field(default_factory=dict)
    """The says accepted for each turn (by id)."""

    def say(self, handle: parley.TurnHandle, text: str) -> None:
        handle.say(text)
        self.said.setdefault(handle.turn_id, []).append(text)

    # ------------------------------------------------------------------ model

    @property
    def name(self) -> str:
        return "planned"

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        self.requests.append(request.messages)
        step = _step_index(request.messages)
        plan = self._plan(step)
        event = self._fire(step, plan.event)
        if event == "say":
            self.say(self.handle, f"steer before step {step}")
        if event == "interrupt":
            self.handle.interrupt()
        if event in ("crash_mid_stream", "interrupt_mid_stream", "say_mid_stream"):
            on_delta(f"{PARTIAL} ")  # provisional text that this attempt never commits
            if event == "crash_mid_stream":
                raise Crash
            if event == "say_mid_stream":
                self.say(self.handle, f"steer while step {step} streams")
            else:
                self.handle.interrupt()
            on_delta("more")  # an interrupt aborts the stream here
            on_delta.restart("retry")  # a steer does not: start the answer over
        text = f"turn {self.turn_number} step {step}"
        on_delta(text)
        calls = tuple(
            ToolCall(
                id=self.call_id(step, n),
                name="asked_work" if plan.asks_at(n) else "work",
                arguments=json.dumps({"n": n, "call": self.call_id(step, n)}),
            )
            for n in range(plan.calls)
        )
        return ModelReply(text=text, tool_calls=calls, model="planned")

    def call_id(self, step: int, position: int) -> str:
        return f"t{self.turn_number}s{step}c{position}"

    def _plan(self, step: int) -> StepPlan:
        plans = self.turns[self.turn_number]
        # Steps beyond the plan (steers add some) answer without tools, ending the turn.
        return plans[step] if step < len(plans) else StepPlan(calls=0, event="none")

    def _fire(self, step: int, event: str) -> str:
        """Each planned event happens once, on the first attempt that reaches it."""
        key = (self.turn_number, step, event)
        with self.lock:
            if event == "none" or key in self.fired:
                return "none"
            self.fired.add(key)
        return event

    # ------------------------------------------------------------------ tool

    def work(self, arguments: dict[str, Any], _context: ToolContext) -> str:
        self.runs[arguments["call"]] += 1  # the side effect: done, whatever follows
        step = self._current_step()
        if step is not None and self._dies_in_asked_call(step, arguments["n"]):
            raise Crash
        event = self._plan(step).event if step is not None else "none"
        if event in ("crash_in_tool", "interrupt_in_tool") and arguments["n"] == 0:
            fired = self._fire(step or 0, event + "/tool")
            if fired == "crash_in_tool/tool":
                raise Crash
            if fired == "interrupt_in_tool/tool":
                self.handle.interrupt()
        return f"worked {arguments['n']}"

    def _dies_in_asked_call(self, step: int, position: int) -> bool:
        plan = self._plan(step)
        if plan.crash != "crash_in_approved" or not plan.asks_at(position):
            return False
        return self._fire(step, plan.crash) == plan.crash

    def _current_step(self) -> int | None:
        return _step_index(self.requests[-1]) if self.requests else None

    # ------------------------------------------------------------------ approvals

    def crashing(self, method: Callable[..., Any], crash: str) -> Callable[..., Any]:
        """``method`` of the store, after which the driver dies (once per planned step)."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            value = method(*args, **kwargs)
            step = self._current_step()
            planned = step is not None and self._plan(step).crash == crash
            if planned and self._fire(step or 0, crash) == crash:
                raise Crash
            return value

        return wrapper

    def answer(self, handle: parley.TurnHandle) -> None:
        """A person answers the waiting step's calls as planned."""
        pending = {a.call_id: a for a in handle.approvals()}
        if not pending:
            return  # answered meanwhile (by an interrupt)
        step = next(iter(pending.values())).step
        plan = self._plan(step)
        if plan.waiting == "say":
            self.say(handle, f"steer while step {step} waits")
        if plan.waiting == "interrupt_first":
            handle.interrupt()
            return
        answers = list(zip(plan.order, plan.approve, strict=True))
        half = (len(answers) + 1) // 2 if plan.waiting == "interrupt_midway" else len(answers)
        for position, approve in answers[:half]:
            call_id = self.call_id(step, position)
            approval = pending[call_id]
            self.answers[call_id] = approve
            if approve:
                handle.approve(approval.approval_id)
            else:
                handle.deny(approval.approval_id, reason=DENIAL)
        if plan.waiting == "interrupt_midway":
            try:
                handle.interrupt()  # after the last answer, the turn may be over already
            except TurnEnded:
                event("an interrupt after the last answer came too late")


def _step_index(messages: tuple[Message, ...]) -> int:
    """Assistant messages since the turn's prompt: the step being asked for."""
    last_prompt = max(
        i for i, m in enumerate(messages) if isinstance(m, UserMessage) and m.origin == "prompt"
    )
    return sum(isinstance(m, AssistantMessage) for m in messages[last_prompt:])


def verify(messages: tuple[Message, ...]) -> None:
    """Every tool call answered by exactly one result, right after it; no orphan results;
    no uncommitted text."""
    position = 0
    while position < len(messages):
        message = messages[position]
        assert not isinstance(message, ToolMessage), f"orphan tool result at {position}"
        if isinstance(message, UserMessage | AssistantMessage):
            assert PARTIAL not in message.text, "uncommitted streamed text was replayed"
        position += 1
        if isinstance(message, AssistantMessage) and message.tool_calls:
            wanted = sorted(c.id for c in message.tool_calls)
            answers = messages[position : position + len(wanted)]
            assert all(isinstance(a, ToolMessage) for a in answers), "a tool round is incomplete"
            assert sorted(a.call_id for a in answers) == wanted, "results do not match calls"  # type: ignore[union-attr]
            position += len(wanted)


step_plans = st.builds(
    StepPlan, calls=st.integers(min_value=0, max_value=3), event=st.sampled_from(EVENTS)
)
conversations = st.lists(st.lists(step_plans, min_size=1, max_size=4), min_size=1, max_size=3)


@st.composite
def asking_steps(draw: st.DrawFn) -> StepPlan:
    """A step with one to three calls, at least one of which asks, and how it is answered."""
    calls = draw(st.integers(min_value=1, max_value=3))
    asks = draw(st.lists(st.booleans(), min_size=calls, max_size=calls))
    asks[draw(st.integers(min_value=0, max_value=calls - 1))] = True
    asked = [n for n, a in enumerate(asks) if a]
    return StepPlan(
        calls=calls,
        # Mostly none of the other events: half of them end the step before it waits.
        event=draw(st.one_of(st.just("none"), st.sampled_from(EVENTS))),
        asks=tuple(asks),
        order=tuple(draw(st.permutations(asked))),
        approve=tuple(draw(st.lists(st.booleans(), min_size=len(asked), max_size=len(asked)))),
        waiting=draw(st.one_of(st.just("answer"), st.sampled_from(WHILE_WAITING))),
        crash=draw(st.sampled_from(CRASHES)),
    )


conversations_with_approvals = st.lists(
    st.lists(st.one_of(asking_steps(), asking_steps(), step_plans), min_size=1, max_size=3),
    min_size=1,
    max_size=3,
)


def work_tool(conversation: Conversation, name: str = "work") -> parley.tools.FunctionTool:
    return parley.tools.FunctionTool(
        name=name,
        description="does some work",
        parameters={
            "type": "object",
            "properties": {"n": {"type": "integer"}, "call": {"type": "string"}},
        },
        function=conversation.work,
    )


def ended_or_waiting(handle: parley.TurnHandle, timeout: float = 30) -> parley.TurnResult | None:
    """The turn's result once it ends, or None as soon as it waits for answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return handle.wait(timeout=0.05)
        except WaitTimeout:
            if handle.record().status is TurnStatus.WAITING:
                return None
    raise AssertionError(f"turn {handle.turn_id} neither ended nor waited")


def run_turn(session: parley.Session, conversation: Conversation, prompt: str) -> None:
    """Submit a turn and see it to an end, answering its calls whenever it waits,
    resuming it after every crash and once after an interrupt (a resumed interrupted turn
    continues from its last committed step)."""
    handle = session.submit(prompt)
    conversation.handle = handle
    resumed_interrupt = False
    for _attempt in range(40):
        try:
            result = ended_or_waiting(handle)
        except StoreError:  # the driver thread died: a crash
            event("a driver crashed and the turn was resumed")
            handle = session.resume(handle.turn_id)
            conversation.handle = handle
            continue
        if result is None:
            event("a turn waited for answers")
            conversation.answer(handle)
            continue
        if result.outcome == parley.TurnStatus.CANCELLED and not resumed_interrupt:
            resumed_interrupt = True
            event("an interrupted turn was resumed")
            handle = session.resume(handle.turn_id)
            conversation.handle = handle
            continue
        return
    raise AssertionError("the turn never ended")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(turns=conversations)
def test_no_request_ever_carries_an_incomplete_tool_round(turns: list[list[StepPlan]]) -> None:
    conversation = Conversation(turns=turns)
    host = parley.Host(model=conversation, tools=[work_tool(conversation)])
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        with parley.connect(f"sqlite:///{root / 'db.sqlite'}", host=host) as client:
            session = client.open_session(str(root))
            for number in range(len(turns)):
                conversation.turn_number = number
                run_turn(session, conversation, f"turn {number}")
            assert conversation.requests, "the model was never asked"
            for request in conversation.requests:
                verify(request)
            for turn in session.tree():
                verify_steers(client.store, conversation, turn.turn_id)
            # Every stored step is whole: its calls and its results match.
            for turn in session.history():
                for stored in client.store.steps_of(turn.turn_id):
                    payload = stored.payload
                    assert [r.call_id for r in payload.tool_results] == [
                        c.id for c in payload.tool_calls
                    ]
                    assert PARTIAL not in payload.text


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(turns=conversations_with_approvals)
def test_approvals_run_each_approved_call_at_most_once_and_leave_no_incomplete_round(
    turns: list[list[StepPlan]],
) -> None:
    conversation = Conversation(turns=turns)
    host = parley.Host(
        model=conversation,
        tools=[work_tool(conversation), work_tool(conversation, "asked_work")],
        policy=parley.Policy(ask_tools=["asked_work"]),
    )
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        with parley.connect(f"sqlite:///{root / 'db.sqlite'}", host=host) as client:
            store = client.store
            crashes = [
                ("hold_step", "crash_after_hold"),
                ("approvals_of_run", "crash_going_on"),
                ("consume_approval", "crash_after_consume"),
            ]
            patches = [
                patch.object(store, name, conversation.crashing(getattr(store, name), crash))
                for name, crash in crashes
            ]
            for patched in patches:
                patched.start()
            try:
                session = client.open_session(str(root))
                for number in range(len(turns)):
                    conversation.turn_number = number
                    run_turn(session, conversation, f"turn {number}")
            finally:
                for patched in patches:
                    patched.stop()
            for request in conversation.requests:
                verify(request)
            asked = 0
            for turn in session.tree():
                steps = {s.index: s.payload for s in store.steps_of(turn.turn_id)}
                for payload in steps.values():
                    assert [r.call_id for r in payload.tool_results] == [
                        c.id for c in payload.tool_calls
                    ]
                verify_streamed(client.attach(turn.turn_id), steps)
                verify_steers(store, conversation, turn.turn_id)
                approvals = store.approvals(turn.turn_id)
                assert len({a.call_id for a in approvals}) == len(approvals)  # one each
                for approval in approvals:
                    asked += 1
                    verify_answered(conversation, approval, steps)
            event(f"{asked} calls asked" if asked < 3 else "3 or more calls asked")
            for crash in sorted({e for _t, _s, e in conversation.fired if e in CRASHES}):
                event(f"{crash} happened")


def verify_streamed(handle: parley.TurnHandle, steps: dict[int, Any]) -> None:
    """A reader that drops a step's text at each ``step_restarted`` of it is left with
    exactly the step's committed text (a held step too, whose driver died going on)."""
    shown: dict[int, str] = {}
    for item in handle.events():
        if item.kind is EventKind.STEP_RESTARTED:
            shown[item.data["index"]] = ""
        elif item.kind is EventKind.TOKEN:
            index = item.data["step"]
            shown[index] = shown.get(index, "") + item.data["text"]
    for index, payload in steps.items():
        assert shown.get(index, "") == payload.text, f"step {index} shows {shown.get(index)!r}"


def verify_steers(store: Any, conversation: Conversation, turn_id: str) -> None:
    """Each say accepted for the turn is delivered (in a committed step's request, and
    announced by one ``steer`` event naming that step) or undelivered (in the result, and
    reported by one ``end`` event): exactly one of the two."""
    steps = {s.index: s.payload for s in store.steps_of(turn_id)}
    delivered = Counter(i.text for p in steps.values() for i in p.inputs if i.origin == "steer")
    result = store.turn_result(turn_id)
    assert result is not None, f"turn {turn_id} has not ended"
    undelivered = Counter(result.undelivered)
    said = Counter(conversation.said.get(turn_id, []))
    assert delivered + undelivered == said, (said, delivered, undelivered)
    events = store.events_after(turn_id, 0)
    steers = [e.data for e in events if e.kind is EventKind.STEER]
    assert Counter(d["text"] for d in steers) == delivered, (steers, delivered)
    for steer in steers:
        assert steer["text"] in [i.text for i in steps[steer["step"]].inputs], steer
    reported = Counter(t for e in events if e.kind is EventKind.END for t in e.data["undelivered"])
    assert reported == undelivered, (reported, undelivered)
    if undelivered:
        event("a say was reported undelivered")
    if delivered:
        event("a say was delivered")


def verify_answered(
    conversation: Conversation, approval: parley.Approval, steps: dict[int, Any]
) -> None:
    """An asked call ended with the answer given it (else the interrupt's), ran at most
    once if approved and never if denied, and its result says which."""
    call_id = approval.call_id
    given = conversation.answers.get(call_id)
    if given is None:
        assert (approval.decision, approval.reason) == (Decision.DENIED, "interrupted")
    else:
        wanted = Decision.APPROVED if given else Decision.DENIED
        assert approval.decision is wanted and approval.reason == (None if given else DENIAL)
    [result] = [r for r in steps[approval.step].tool_results if r.call_id == call_id]
    ran = conversation.runs[call_id]
    turn, step = call_id[1:].split("c")[0].split("s")
    crashed = {e for t, s, e in conversation.fired if (t, s) == (int(turn), int(step))}
    if approval.decision is Decision.DENIED:
        assert ran == 0, f"denied call {call_id} ran"
        assert "the operator denied this call" in result.content
        return
    assert ran <= 1, f"approved call {call_id} ran {ran} times"
    if result.content.startswith("worked"):
        assert ran == 1
        event("an approved call ran")
    elif result.content == NOT_RUN_INTERRUPTED:
        assert ran == 0
        event("an approved call was not run: interrupted")
    else:
        assert "effect is unknown" in result.content, result.content
        assert crashed & {"crash_after_consume", "crash_in_approved", "crash_in_tool/tool"}
        event("an approved call's driver died as it started or ran it")
