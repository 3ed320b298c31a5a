"""``parley status`` says how many turns of each tenant and lane wait for their time and
when the next is due (docs/time.md#what-an-operator-sees)."""

from __future__ import annotations

from datetime import UTC, datetime

from parley.status import _lane_lines
from parley.store.status import LaneWork


def test_a_lane_with_delayed_turns_is_listed_with_its_next_time() -> None:
    due = datetime(2027, 1, 4, 8, 0, tzinfo=UTC)
    lanes = (
        LaneWork(
            tenant="acme",
            priority="interactive",
            unfinished=3,
            waiting_capacity=0,
            delayed=2,
            next_due=due,
        ),
    )
    assert _lane_lines(lanes) == [
        "by tenant and priority:",
        "  acme interactive: 3 unfinished, 0 waiting for capacity, 2 waiting for a time "
        "(the next at 2027-01-04T08:00:00+00:00)",
    ]


def test_interactive_lanes_with_nothing_waiting_add_no_lines() -> None:
    lanes = (LaneWork(tenant="", priority="interactive", unfinished=1, waiting_capacity=0),)
    assert _lane_lines(lanes) == []
