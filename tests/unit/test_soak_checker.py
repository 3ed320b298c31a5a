"""The soak's history checker finds each kind of violation it claims to: a checker that
cannot fail would let the soak pass whatever the fleet did."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.soak.checker import NOT_RUN_AGAIN, Checker, Store
from tests.soak.journal import Answer, Head, Journal, Reader, Say, TreeSnapshot, Turn

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ledger_step(mark: str, content: str = "noted") -> dict[str, Any]:
    return {
        "tool_calls": [{"id": "call_0_0", "name": "ledger", "arguments": f'{{"mark": "{mark}"}}'}],
        "tool_results": [{"call_id": "call_0_0", "name": "ledger", "content": content}],
    }


def healthy() -> tuple[Store, Journal, dict[tuple[str, str], list[float]]]:
    """A session of two turns that went right: the second ran a ledger call, took a say
    and an approval, and a reader followed it to its end."""
    store, journal = Store(), Journal()
    store.sessions["s"] = "t2"
    for number, (turn_id, parent) in enumerate((("t1", None), ("t2", "t1"))):
        store.turns[turn_id] = {
            "session_id": "s",
            "parent_id": parent,
            "ordinal": number,
            "prompt": f"tools {turn_id}",
            "request_id": turn_id,
            "created_at": at(number),
            "status": "finished",
            "steps": 1,
            "undelivered": None,
            "last_seq": 5,
            "error": None,
        }
        store.events[turn_id] = [
            (1, "queued", {}, at(number)),
            (2, "started", {}, at(number + 0.1)),
            (4, "step", {"index": 0}, at(number + 0.5)),
            (5, "end", {"outcome": "finished"}, at(number + 0.6)),
        ]
        store.steps[turn_id] = [(0, ledger_step(f"m{turn_id}"), at(number + 0.5))]
        journal.accept(
            Turn(turn_id, "s", "tools", f"tools {turn_id}", turn_id, 0, True, outcome="finished")
        )
    store.events["t2"].insert(2, (3, "steer", {"text": "hi"}, at(1.4)))
    journal.turns["t2"].says.append(Say("hi", "accepted"))
    store.approvals["ap"] = {"turn_id": "t2", "decision": "approved", "decided_at": at(1.2)}
    journal.turns["t2"].answers.append(Answer("ap", "approve", 200, 409))
    journal.readers.append(
        Reader("t2", [1, 2, 3, 4, 5], ["queued", "started", "steer", "step", "end"], 1, True)
    )
    journal.heads.append(Head("s", "t2", ["t1", "t2"]))
    # Read while t2 was still queued: it had not yet taken its place under t1.
    journal.snapshots.append(
        TreeSnapshot(
            "s", [("t1", None, "tools t1", "finished"), ("t2", None, "tools t2", "queued")]
        )
    )
    ledger = {("t1", "mt1"): [T0.timestamp() + 0.3], ("t2", "mt2"): [T0.timestamp() + 1.3]}
    return store, journal, ledger


def rules(store: Store, journal: Journal, ledger: dict[tuple[str, str], list[float]]) -> set[str]:
    return {v.rule for v in Checker(store, journal, ledger).check()}


def test_a_healthy_history_has_no_violation() -> None:
    assert rules(*healthy()) == set()


def _second_end(store: Store, journal: Journal, ledger: Any) -> None:
    store.events["t1"].append((6, "end", {"outcome": "finished"}, at(0.9)))


def _tool_after_commit(store: Store, journal: Journal, ledger: Any) -> None:
    ledger[("t1", "mt1")].append(T0.timestamp() + 2)


def _tool_never_ran(store: Store, journal: Journal, ledger: Any) -> None:
    del ledger[("t2", "mt2")]


def _denied_call_ran(store: Store, journal: Journal, ledger: Any) -> None:
    store.steps["t2"] = [(0, ledger_step("mt2", content="denied by a person"), at(1.5))]


def _approved_call_ran_twice(store: Store, journal: Journal, ledger: Any) -> None:
    store.steps["t2"] = [(0, ledger_step("mt2", content=NOT_RUN_AGAIN + ": …"), at(1.5))]
    ledger[("t2", "mt2")].append(T0.timestamp() + 1.35)


def test_an_approved_call_cut_off_while_it_ran_may_have_run_once() -> None:
    # Its attempt died after it began (the ledger has it) and before its step
    # committed: the next attempt does not run it again, and says so.  Found in a
    # 30-minute soak, which the checker then counted as a denied call that ran.
    store, journal, ledger = healthy()
    store.steps["t2"] = [(0, ledger_step("mt2", content=NOT_RUN_AGAIN + ": …"), at(1.5))]
    assert rules(store, journal, ledger) == set()


def _say_lost(store: Store, journal: Journal, ledger: Any) -> None:
    journal.turns["t2"].says.append(Say("lost", "accepted"))


def _say_twice(store: Store, journal: Journal, ledger: Any) -> None:
    store.turns["t2"]["undelivered"] = ["hi"]


def _refused_say_delivered(store: Store, journal: Journal, ledger: Any) -> None:
    journal.turns["t2"].says[0].status = "ended"


def _reader_duplicate(store: Store, journal: Journal, ledger: Any) -> None:
    journal.readers[0].seqs = [1, 2, 2, 4, 5]


def _reader_skipped(store: Store, journal: Journal, ledger: Any) -> None:
    journal.readers[0].seqs, journal.readers[0].kinds = [1, 2, 5], ["queued", "started", "end"]


def _stray_turn(store: Store, journal: Journal, ledger: Any) -> None:
    store.turns["t9"] = {**store.turns["t2"], "ordinal": 5, "parent_id": "t2"}


def _wrong_parent(store: Store, journal: Journal, ledger: Any) -> None:
    store.turns["t2"]["parent_id"] = None


def _head_moved(store: Store, journal: Journal, ledger: Any) -> None:
    store.sessions["s"] = "t1"


def _approval_answered_twice(store: Store, journal: Journal, ledger: Any) -> None:
    journal.turns["t2"].answers[0].repeat_status = 200


def _approval_decision_lost(store: Store, journal: Journal, ledger: Any) -> None:
    store.approvals["ap"]["decision"] = "denied"


def _step_twice(store: Store, journal: Journal, ledger: Any) -> None:
    store.events["t1"].insert(3, (3, "step", {"index": 0}, at(0.4)))


def _never_ended(store: Store, journal: Journal, ledger: Any) -> None:
    store.turns["t2"]["status"] = "running"


def _parent_changed(store: Store, journal: Journal, ledger: Any) -> None:
    journal.snapshots.append(TreeSnapshot("s", [("t2", None, "tools t2", "running")]))


def _prompt_changed(store: Store, journal: Journal, ledger: Any) -> None:
    journal.snapshots.append(TreeSnapshot("s", [("t1", None, "other", "finished")]))


def _started_out_of_order(store: Store, journal: Journal, ledger: Any) -> None:
    store.events["t2"][1] = (2, "started", {}, at(-1))


@pytest.mark.parametrize(
    ("break_it", "rule"),
    [
        (_second_end, "exactly one end per run"),
        (_tool_after_commit, "no tool call runs again after its step committed"),
        (_tool_never_ran, "tools really ran"),
        (_denied_call_ran, "a denied call never runs"),
        (_approved_call_ran_twice, "an approved call runs at most once"),
        (_say_lost, "a steer is delivered or reported"),
        (_say_twice, "a steer is delivered or reported"),
        (_refused_say_delivered, "a refused steer is not delivered"),
        (_reader_duplicate, "no duplicate or reordered seq"),
        (_reader_skipped, "no durable event is skipped"),
        (_stray_turn, "no stray turns"),
        (_wrong_parent, "a turn hangs under the head"),
        (_head_moved, "head and store agree"),
        (_approval_answered_twice, "an approval is answered once"),
        (_approval_decision_lost, "the answer given is the answer kept"),
        (_step_twice, "no step committed twice"),
        (_never_ended, "every turn ends"),
        (_started_out_of_order, "turns of a session start in order"),
        (_parent_changed, "the tree is append-only"),
        (_prompt_changed, "the tree is append-only"),
    ],
)
def test_each_violation_is_found(break_it: Any, rule: str) -> None:
    store, journal, ledger = healthy()
    break_it(store, journal, ledger)
    assert rule in rules(store, journal, ledger)
