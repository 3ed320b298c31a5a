"""``parley.WaitFor`` and the built-in ``wait`` tool (docs/time.md#waiting-for-an-event):
what a wait may name and for how long, checked before anything waits; the tool offered
only when the host asks for it."""

from __future__ import annotations

import math

import pytest

import parley
from parley.errors import InvalidRequest
from parley.ports.host import MAX_WAIT_SECONDS, ToolContext, WaitFor
from parley.tools.wait import WAIT_TOOL_NAME, WaitTool

CONTEXT = ToolContext(root="/tmp", session_id="s", turn_id="t")


@pytest.mark.parametrize(
    ("arguments", "waits_for"),
    [
        ('{"event": "finance.approved"}', WaitFor("finance.approved")),
        ('{"seconds": 90}', WaitFor(None, timeout=90.0)),
        ('{"event": "go", "seconds": 0.5}', WaitFor("go", timeout=0.5)),
    ],
)
def test_the_wait_tool_answers_a_wait_for_its_event_or_time(
    arguments: str, waits_for: WaitFor
) -> None:
    tool = WaitTool()
    assert tool.declaration.name == WAIT_TOOL_NAME
    assert tool.run(tool.parse(arguments), CONTEXT) == waits_for


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ("{}", "an event, a number of seconds, or both"),
        ('{"seconds": 0}', "seconds"),
        ('{"seconds": -1}', "seconds"),
        (f'{{"seconds": {MAX_WAIT_SECONDS + 1}}}', "seconds"),
        ('{"seconds": "60"}', "seconds"),
        ('{"seconds": NaN}', "NaN"),
        ('{"event": ""}', "event"),
        ('{"event": "two words"}', "event"),
        ('{"event": 3}', "event"),
        ('{"event": "go", "until": "later"}', "until"),
        ("[1]", "object"),
    ],
)
def test_bad_wait_arguments_are_refused_before_anything_waits(arguments: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        WaitTool().parse(arguments)


@pytest.mark.parametrize(
    ("event", "timeout", "says"),
    [
        (None, None, "an event, a timeout, or both"),
        ("", None, "event"),
        ("x" * 129, None, "event"),
        ("go", 0, "timeout"),
        ("go", -5, "timeout"),
        ("go", math.inf, "timeout"),
        ("go", math.nan, "timeout"),
        ("go", True, "timeout"),
        ("go", "60", "timeout"),
    ],
)
def test_a_bad_wait_for_is_refused_where_the_tool_makes_it(
    event: object, timeout: object, says: str
) -> None:
    with pytest.raises(InvalidRequest, match=says):
        WaitFor(event, timeout=timeout)  # type: ignore[arg-type]


def test_the_wait_tool_is_offered_only_when_the_host_asks() -> None:
    model = parley.models.ScriptedModel({"rules": [{"when": ".*", "steps": [{"text": "ok"}]}]})
    assert WAIT_TOOL_NAME not in [
        t.declaration.name for t in parley.Host(model=model).builtin_tools
    ]
    offered = parley.Host(model=model, wait_tool=True).builtin_tools
    assert [t.declaration.name for t in offered] == [WAIT_TOOL_NAME]
    with pytest.raises(InvalidRequest, match="wait_tool"):
        parley.Host(model=model, wait_tool="yes")  # type: ignore[arg-type]
