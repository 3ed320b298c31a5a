"""A plan-then-act agent on parley's driver seam (``Host(driver=PlanThenAct())``).

It runs a different loop from parley's own: first one step that asks the model for a
numbered plan, offering no tools, and then steps that carry the plan out with the tools,
the plan in view, until the model answers.  A steer said after it answered brings a new
plan first.  Every step goes through ``turn.step``, so the turn streams, obeys steers and
interrupts, keeps its budgets, asks the policy and the approver, and commits each step;
and since the driver keeps nothing in memory (the plan is the text of the step labelled
``plan``), a turn taken over after a crash goes on where the last commit left it.
"""

from __future__ import annotations

from parley import DriverStep, DriverTurn
from parley.errors import DriverFailed
from parley.transcript import Message, UserMessage

PLAN = "plan"
ACT = "act"
PLANNING = (
    "Before doing anything, write a short numbered plan for the request above. "
    "Do not call tools yet."
)
ACTING = "Carry out the plan above step by step, with the tools; then answer the request."


class PlanThenAct:
    """Plan first (no tools), then act on the plan."""

    def __init__(self, *, max_act_steps: int = 20) -> None:
        self.max_act_steps = max_act_steps

    def drive(self, turn: DriverTurn) -> None:
        steps = turn.steps
        answered = bool(steps) and steps[-1].label == ACT and not steps[-1].tool_calls
        if turn.input.kind == "resume" and answered:
            return  # it had answered before this attempt: parley settles that answer
        if turn.input.kind in ("prompt", "steer") or _latest_plan(steps) is None:
            plan = turn.step(
                messages=(*turn.messages(), UserMessage(text=PLANNING, origin="driver")),
                tools=(),
                final=False,
                label=PLAN,
            )
            if not plan.text.strip():
                raise DriverFailed("the model gave no plan")
        while True:
            if _acted_since_plan(turn.steps) >= self.max_act_steps:
                # What the person is shown of the failed turn (display only, never
                # replayed): how far the plan got.
                planned = turn.steps[_latest_plan(turn.steps) or 0].text
                raise DriverFailed(
                    f"the plan was not carried out in {self.max_act_steps} steps",
                    partial=f"Stopped after {self.max_act_steps} steps of the plan:\n{planned}",
                )
            step = turn.step(messages=_acting(turn), label=ACT)
            if step.ended or not step.tool_calls:
                return


def _latest_plan(steps: tuple[DriverStep, ...]) -> int | None:
    """The position of the latest plan among ``steps``."""
    return next((n for n in range(len(steps) - 1, -1, -1) if steps[n].label == PLAN), None)


def _acted_since_plan(steps: tuple[DriverStep, ...]) -> int:
    latest = _latest_plan(steps)
    return len(steps) - 1 - latest if latest is not None else 0


def _acting(turn: DriverTurn) -> tuple[Message, ...]:
    """The turn up to its latest plan, the instruction to carry it out, and what was done
    since: the scaffolding is sent, never stored as conversation."""
    steps = turn.steps
    latest = _latest_plan(steps)
    assert latest is not None
    planned = turn.messages(steps[: latest + 1])
    since = turn.messages(steps[latest + 1 :])[1:]  # without the prompt again
    return (*planned, UserMessage(text=ACTING, origin="driver"), *since)
