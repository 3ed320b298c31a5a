"""Checked replay under random interleavings: no request ever carries an incomplete tool
round (issue 4).

Hypothesis draws whole conversations: turns of steps that call tools or answer, with
steers, interrupts (at a boundary, mid-stream, during a tool), driver crashes (mid-stream
and inside a tool) and resumes of crashed or interrupted turns.  Every request the model
is sent is checked by a verifier written here, independently of ``workers.context``: each
assistant tool call is answered by exactly one result before the conversation goes on,
and no text streamed by an attempt that never committed is ever replayed.
"""

from __future__ import annotations

import json
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import parley
from parley.errors import StoreError
from schemas.messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from workers.host_ports import DeltaSink, ModelReply, ModelRequest, ToolContext

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


class Crash(BaseException):
    """Kills the driver thread where it is, as a dying process would: nothing after this
    point commits, and nothing in the engine catches it."""


@dataclass(frozen=True)
class StepPlan:
    calls: int
    event: str


@dataclass
class Conversation:
    """The model and tool for one drawn conversation, and what they saw."""

    turns: list[list[StepPlan]]
    requests: list[tuple[Message, ...]] = field(default_factory=list)
    handle: Any = None
    fired: set[tuple[int, int, str]] = field(default_factory=set)
    turn_number: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

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
            self.handle.say(f"steer before step {step}")
        if event == "interrupt":
            self.handle.interrupt()
        if event in ("crash_mid_stream", "interrupt_mid_stream", "say_mid_stream"):
            on_delta(f"{PARTIAL} ")  # provisional text that this attempt never commits
            if event == "crash_mid_stream":
                raise Crash
            if event == "say_mid_stream":
                self.handle.say(f"steer while step {step} streams")
            else:
                self.handle.interrupt()
            on_delta("more")  # an interrupt aborts the stream here
            on_delta.restart("retry")  # a steer does not: start the answer over
        text = f"turn {self.turn_number} step {step}"
        on_delta(text)
        calls = tuple(
            ToolCall(
                id=f"t{self.turn_number}s{step}c{n}", name="work", arguments=json.dumps({"n": n})
            )
            for n in range(plan.calls)
        )
        return ModelReply(text=text, tool_calls=calls, model="planned")

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
        step = self._current_step()
        event = self._plan(step).event if step is not None else "none"
        if event in ("crash_in_tool", "interrupt_in_tool") and arguments["n"] == 0:
            fired = self._fire(step or 0, event + "/tool")
            if fired == "crash_in_tool/tool":
                raise Crash
            if fired == "interrupt_in_tool/tool":
                self.handle.interrupt()
        return f"worked {arguments['n']}"

    def _current_step(self) -> int | None:
        return _step_index(self.requests[-1]) if self.requests else None


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


def run_turn(session: parley.Session, conversation: Conversation, prompt: str) -> None:
    """Submit a turn and see it to an end, resuming it after every crash and once after
    an interrupt (a resumed interrupted turn continues from its last committed step)."""
    handle = session.submit(prompt)
    conversation.handle = handle
    resumed_interrupt = False
    for _attempt in range(20):
        try:
            result = handle.wait(timeout=30)
        except StoreError:  # the driver thread died: a crash
            event("a driver crashed and the turn was resumed")
            handle = session.resume(handle.turn_id)
            conversation.handle = handle
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
    tool = parley.tools.FunctionTool(
        name="work",
        description="does some work",
        parameters={"type": "object", "properties": {"n": {"type": "integer"}}},
        function=conversation.work,
    )
    host = parley.Host(model=conversation, tools=[tool])
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
            # Every stored step is whole: its calls and its results match.
            for turn in session.history():
                for stored in client.store.steps_of(turn.turn_id):
                    payload = stored.payload
                    assert [r.call_id for r in payload.tool_results] == [
                        c.id for c in payload.tool_calls
                    ]
                    assert PARTIAL not in payload.text
