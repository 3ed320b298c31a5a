"""The walk every protocol view shares (``parley.gateway.projections.base``), on its own:
a projection that records each hook it is handed shows which hook each kind reaches and
what the walk keeps (the open step, its text, a commit reconciled with it, restarts, the
last end, approvals pending); and a projection without a kind's hook cannot be made."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from parley.gateway.projections.agui import AgUiRun
from parley.gateway.projections.aisdk import UiMessageStream
from parley.gateway.projections.base import Out, StepView, TurnProjection
from parley.gateway.projections.responses import ResponsesProjection
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
    EventPayload,
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

TURN = "11111111-2222-3333-4444-555555555555"


class Recorder(TurnProjection[StepView]):
    """Each hook adds one record of itself: its name and what it was handed."""

    def opening(self) -> Out:
        return [{"hook": "opening"}]

    def before_event(self, out: Out) -> None:
        out.append({"hook": "before_event", "seq": self.seq})

    def new_step(self, index: int, attempt: int) -> StepView:
        return StepView(index=index, attempt=attempt)

    def on_step_start(self, out: Out, step: StepView) -> None:
        out.append({"hook": "on_step_start", "step": step.index, "attempt": step.attempt})

    def on_step_finish(self, out: Out, step: StepView) -> None:
        out.append({"hook": "on_step_finish", "step": step.index, "text": step.text})

    def on_text(self, out: Out, step: StepView, text: str) -> None:
        out.append({"hook": "on_text", "step": step.index, "text": text, "so_far": step.text})

    def on_restart(self, out: Out, index: int, reason: str, dropped: StepView | None) -> None:
        shown = None if dropped is None else dropped.text
        record = {"hook": "on_restart", "step": index, "reason": reason, "dropped": shown}
        out.append({**record, "restarts": self.restarts(index)})

    def on_queued(self, out: Out, queued: Queued) -> None:
        out.append({"hook": "on_queued"})

    def on_started(self, out: Out, started: Started) -> None:
        out.append({"hook": "on_started"})

    def on_tool_call(self, out: Out, call: ToolCalled) -> None:
        out.append({"hook": "on_tool_call", "call": call.call_id})

    def on_tool_result(self, out: Out, result: ToolAnswered) -> None:
        out.append({"hook": "on_tool_result", "call": result.call_id})

    def on_refusal(self, out: Out, refused: Refused) -> None:
        out.append({"hook": "on_refusal"})

    def on_steer(self, out: Out, steered: Steered) -> None:
        out.append({"hook": "on_steer"})

    def on_check(self, out: Out, checked: Checked) -> None:
        out.append({"hook": "on_check"})

    def on_throttled(self, out: Out, throttled: Throttled) -> None:
        out.append({"hook": "on_throttled"})

    def on_waiting(self, out: Out, waiting: WaitingForEvent) -> None:
        out.append({"hook": "on_waiting"})

    def on_compacted(self, out: Out, compacted: Compacted) -> None:
        out.append({"hook": "on_compacted"})

    def on_agent_started(self, out: Out, started: AgentStarted) -> None:
        out.append({"hook": "on_agent_started"})

    def on_agent_ended(self, out: Out, ended: AgentEnded) -> None:
        out.append({"hook": "on_agent_ended"})

    def on_approval_requested(self, out: Out, asked: ApprovalRequested) -> None:
        out.append({"hook": "on_approval_requested", "asked": sorted(self.asked)})

    def on_approval_answered(
        self, out: Out, answered: ApprovalAnswered, call_id: str | None
    ) -> None:
        out.append({"hook": "on_approval_answered", "call": call_id})

    def on_end(self, out: Out, end: Ended) -> None:
        out.append({"hook": "on_end", "outcome": end.outcome})

    def on_close(self, out: Out, end: Ended | None, cut: str | None) -> None:
        out.append({"hook": "on_close", "outcome": end and end.outcome, "cut": cut})

    def on_interrupt(self, out: Out, approval_ids: Sequence[str]) -> None:
        out.append({"hook": "on_interrupt", "approvals": list(approval_ids)})


def events_of(*payloads: EventPayload) -> list[Event]:
    return [Event.of(TURN, seq, p) for seq, p in enumerate(payloads, 1)]


def walk(view: Recorder, *payloads: EventPayload) -> list[dict[str, Any]]:
    """What ``view`` answers to ``payloads``, without the ``before_event`` records."""
    out = [record for event in events_of(*payloads) for record in view.feed(event)]
    return [record for record in out if record["hook"] != "before_event"]


def hooks(records: list[dict[str, Any]]) -> list[str]:
    return [record["hook"] for record in records]


ASKED = ApprovalRequested(approval_id="ap1", step=0, call_id="c", tool="t", arguments={})
EVERY_KIND: list[tuple[EventPayload, list[str]]] = [
    (Queued(run_id="r"), ["on_queued"]),
    (Started(run_id="r", attempt=1, worker="w"), ["on_started"]),
    (Token(step=0, text="hi"), ["on_step_start", "on_text"]),
    (ToolCalled(step=0, call_id="c", name="t", arguments="{}"), ["on_tool_call"]),
    (ToolAnswered(step=0, call_id="c", name="t", content="x"), ["on_tool_result"]),
    (Refused(call_id="c", tool="t", rule="deny", reason="no"), ["on_refusal"]),
    (Steered(position=1, text="s"), ["on_steer"]),
    (Checked(passed=True, exit_code=0, output=""), ["on_check"]),
    (StepCommitted(step=0, text=""), ["on_step_start", "on_step_finish"]),
    (StepRestarted(step=0, reason="failed"), ["on_restart"]),
    (ASKED, ["on_approval_requested"]),
    (ApprovalAnswered(approval_id="ap1", decision="approved"), ["on_approval_answered"]),
    (Throttled(model="m", seconds=1.0), ["on_throttled"]),
    (WaitingForEvent(step=0, call_id="c", event="go"), ["on_waiting"]),
    (
        Compacted(
            compaction_id="k",
            through_turn_id="t",
            strategy="trim",
            text="x",
            tokens_before=9,
            tokens_after=3,
        ),
        ["on_compacted"],
    ),
    (AgentStarted(call_id="c", agent="a", turn_id="t", session_id="s"), ["on_agent_started"]),
    (AgentEnded(call_id="c", outcome="finished"), ["on_agent_ended"]),
    (Ended(outcome="finished"), ["on_end"]),
]


@pytest.mark.parametrize(("payload", "reached"), EVERY_KIND)
def test_every_kind_is_handed_to_its_hook(payload: EventPayload, reached: list[str]) -> None:
    view = Recorder()
    [event] = events_of(payload)
    out = view.feed(event)
    assert out[0] == {"hook": "before_event", "seq": 1}
    assert hooks(out[1:]) == reached


def test_every_kind_has_a_case_here() -> None:
    assert {type(payload).KIND for payload, _ in EVERY_KIND} == set(EventKind)


def test_a_step_opens_with_its_first_token_and_finishes_at_its_commit_or_the_end() -> None:
    out = walk(
        Recorder(),
        Token(step=0, text=""),  # nothing streamed: not even the step opens
        Token(step=0, text="a"),
        Token(step=0, text="b"),
        StepCommitted(step=0, text="ab"),
        Token(step=1, text="c"),
        Token(step=2, text="d"),  # another step's token finishes step 1
        Ended(outcome="cancelled"),
    )
    assert out == [
        {"hook": "on_step_start", "step": 0, "attempt": 0},
        {"hook": "on_text", "step": 0, "text": "a", "so_far": "a"},
        {"hook": "on_text", "step": 0, "text": "b", "so_far": "ab"},
        {"hook": "on_step_finish", "step": 0, "text": "ab"},
        {"hook": "on_step_start", "step": 1, "attempt": 0},
        {"hook": "on_text", "step": 1, "text": "c", "so_far": "c"},
        {"hook": "on_step_finish", "step": 1, "text": "c"},
        {"hook": "on_step_start", "step": 2, "attempt": 0},
        {"hook": "on_text", "step": 2, "text": "d", "so_far": "d"},
        {"hook": "on_step_finish", "step": 2, "text": "d"},
        {"hook": "on_end", "outcome": "cancelled"},
    ]


def test_a_commit_streams_what_the_stream_lacked() -> None:
    out = walk(
        Recorder(),
        Token(step=0, text="It sa"),
        StepCommitted(step=0, text="It says A."),
        StepCommitted(step=1, text="whole"),  # its tokens aged out of the replay buffer
    )
    assert out == [
        {"hook": "on_step_start", "step": 0, "attempt": 0},
        {"hook": "on_text", "step": 0, "text": "It sa", "so_far": "It sa"},
        {"hook": "on_text", "step": 0, "text": "ys A.", "so_far": "It says A."},
        {"hook": "on_step_finish", "step": 0, "text": "It says A."},
        {"hook": "on_step_start", "step": 1, "attempt": 0},
        {"hook": "on_text", "step": 1, "text": "whole", "so_far": "whole"},
        {"hook": "on_step_finish", "step": 1, "text": "whole"},
    ]


def test_a_commit_the_stream_is_not_the_start_of_is_a_restart() -> None:
    out = walk(Recorder(), Token(step=0, text="Hello wor"), StepCommitted(step=0, text="Hi."))
    assert out == [
        {"hook": "on_step_start", "step": 0, "attempt": 0},
        {"hook": "on_text", "step": 0, "text": "Hello wor", "so_far": "Hello wor"},
        {
            "hook": "on_restart",
            "step": 0,
            "reason": "diverged",
            "dropped": "Hello wor",
            "restarts": 1,
        },
        {"hook": "on_text", "step": 0, "text": "Hi.", "so_far": "Hi."},
        {"hook": "on_step_finish", "step": 0, "text": "Hi."},
    ]


def test_a_restart_keeps_its_step_open_and_starts_its_text_again() -> None:
    view = Recorder()
    out = walk(
        view,
        Token(step=0, text="draft"),
        StepRestarted(step=0, reason="resumed"),
        Token(step=0, text="final"),
        StepCommitted(step=0, text="final"),
        StepRestarted(step=1, reason="failed"),  # a step not open: nothing of it dropped
        Token(step=1, text="x"),
    )
    restart = {"hook": "on_restart", "step": 0, "reason": "resumed", "dropped": "draft"}
    assert out == [
        {"hook": "on_step_start", "step": 0, "attempt": 0},
        {"hook": "on_text", "step": 0, "text": "draft", "so_far": "draft"},
        {**restart, "restarts": 1},
        {"hook": "on_text", "step": 0, "text": "final", "so_far": "final"},
        {"hook": "on_step_finish", "step": 0, "text": "final"},
        {"hook": "on_restart", "step": 1, "reason": "failed", "dropped": None, "restarts": 1},
        {"hook": "on_step_start", "step": 1, "attempt": 1},
        {"hook": "on_text", "step": 1, "text": "x", "so_far": "x"},
    ]
    assert (view.restarts(0), view.restarts(1), view.restarts(2)) == (1, 1, 0)


def test_a_continued_view_takes_its_open_steps_commit_as_streamed() -> None:
    view = Recorder()
    view._continue_step(0)
    out = walk(view, Token(step=0, text=" more"), StepCommitted(step=0, text="held more"))
    assert out == [
        {"hook": "on_text", "step": 0, "text": " more", "so_far": " more"},
        {"hook": "on_step_finish", "step": 0, "text": "held more"},
    ]


def test_close_answers_once_from_the_last_end_and_the_view_takes_nothing_after() -> None:
    view = Recorder()
    walk(view, Token(step=0, text="a"), Ended(outcome="cancelled"), Ended(outcome="finished"))
    assert view.close("ignored") == [{"hook": "on_close", "outcome": "finished", "cut": "ignored"}]
    assert view.close() == []
    assert view.feed(events_of(Token(step=0, text="late"))[0]) == []
    cut = Recorder()
    walk(cut, Token(step=0, text="a"))
    assert cut.close("fell behind") == [
        {"hook": "on_step_finish", "step": 0, "text": "a"},
        {"hook": "on_close", "outcome": None, "cut": "fell behind"},
    ]


def test_an_interrupt_needs_every_approval_shown_asked_and_not_answered() -> None:
    view = Recorder(asked={"ap0": "c0"})  # a view that continues one the client saw
    second = ApprovalRequested(approval_id="ap2", step=0, call_id="c2", tool="t", arguments={})
    out = walk(view, ASKED, second, ApprovalAnswered(approval_id="ap2", decision="denied"))
    assert out[-2:] == [
        {"hook": "on_approval_requested", "asked": ["ap0", "ap1", "ap2"]},
        {"hook": "on_approval_answered", "call": "c2"},
    ]
    assert view.asked == {"ap0", "ap1"}
    assert view.interrupt([]) == []
    assert view.interrupt(["ap1", "ap2"]) == []  # ap2 is answered
    assert view.interrupt(["ap0", "ap1"]) == [{"hook": "on_interrupt", "approvals": ["ap0", "ap1"]}]
    assert view.interrupt(["ap0"]) == [] and view.close() == []  # the view is over


def test_a_projection_without_a_kinds_hook_cannot_be_made() -> None:
    class NoCheck(Recorder):
        on_check = TurnProjection.on_check  # (as if it were never written)

    with pytest.raises(TypeError, match="on_check"):
        NoCheck()
    # Each protocol's view is final: mypy checks it has every hook where it is declared.
    for view in (AgUiRun, UiMessageStream, ResponsesProjection):
        assert getattr(view, "__final__", False), view
