"""A host's hooks are resolved once into what the engine calls: a ``SessionHooks``
subclass's overrides, or the methods of those names any object has."""

from __future__ import annotations

from typing import Any

import pytest

import parley
from parley.errors import InvalidRequest
from parley.ports.host import HookSet


class Audit(parley.SessionHooks):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def after_commit(self, receipt: parley.CommitReceipt) -> None:
        self.seen.append(receipt)


class DuckTyped:
    def before_commit(self, outcome: Any, context: Any) -> None:
        raise ValueError("no")


def test_a_session_hooks_subclass_has_only_the_hooks_it_overrides() -> None:
    hooks = Audit()
    resolved = parley.Host(
        model=parley.models.ScriptedModel({"rules": [{"when": ".*", "steps": [{"text": "x"}]}]}),
        hooks=hooks,
    ).hook_set
    assert resolved.after_commit == hooks.after_commit
    # The engine skips what is None: no before_commit means no extra transaction.
    assert (resolved.before_turn, resolved.before_commit, resolved.on_terminal) == (
        None,
        None,
        None,
    )


def test_any_object_with_hook_methods_serves_and_no_hooks_is_nothing() -> None:
    duck = DuckTyped()
    resolved = HookSet.of(duck)
    assert resolved.before_commit == duck.before_commit and resolved.after_commit is None
    assert HookSet.of(None) == HookSet()


def test_an_attribute_of_a_hooks_name_that_is_not_callable_is_refused() -> None:
    class Broken:
        on_terminal = "print it"

    with pytest.raises(InvalidRequest, match="on_terminal"):
        HookSet.of(Broken())
