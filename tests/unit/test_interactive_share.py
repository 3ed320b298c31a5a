"""Who is held back from starting interactive turns (src/parley/runtime/interactive_share.py):
a tenant at or over its share of the running interactive turns, while a tenant under
its share has interactive turns waiting for a worker; nobody otherwise."""

from __future__ import annotations

import pytest

from parley.runtime.interactive_share import held_back


@pytest.mark.parametrize(
    ("load", "weights", "held"),
    [
        # Issue 43: one tenant's turns hold the four slots; another's one waits.
        ({"flood": (4, 36), "other": (0, 1)}, {}, {"flood"}),
        # Alone, a tenant takes every slot: nobody else waits.
        ({"flood": (4, 36)}, {}, set()),
        # Both hold their shares: the one waiting is not under its share.
        ({"a": (2, 0), "b": (2, 5)}, {}, set()),
        # b is under its share (1 of 2) and waits: a, over its share, is held back.
        ({"a": (3, 4), "b": (1, 1)}, {}, {"a"}),
        # By weight: b weighs 3, so its share of four is three.
        ({"a": (2, 0), "b": (2, 1)}, {"b": 3.0}, {"a"}),
        ({"a": (1, 1), "b": (3, 0)}, {"b": 3.0}, set()),
        # Nothing running yet: nobody holds anything.
        ({"a": (0, 3), "b": (0, 1)}, {}, set()),
    ],
)
def test_a_tenant_over_its_share_is_held_back_while_one_under_its_share_waits(
    load: dict[str, tuple[int, int]], weights: dict[str, float], held: set[str]
) -> None:
    assert held_back(load, weights) == held


def test_nobody_is_held_back_without_interactive_turns() -> None:
    assert held_back({}, {}) == frozenset()
    assert held_back({"a": (0, 0)}, {}) == frozenset()
