"""Injected failures at each phase of a turn (docs/guarantees.md#14-hooks,
docs/host.md#5-hooks-and-commit-receipts): the driver, each hook, the database's commit, a
cancellation; embedded and on the fleet, each asserting what is durable and what every hook saw.
The host (``tests.support.hosts:failing_host``) records each hook call and fails where the turn's
host context says; the database is made to refuse a step by a trigger the test adds."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

import parley
from parley.errors import StoreError
from tests.acceptance.conftest import deployed_client, host_fleet
from tests.support.deployments import ALL, on_deployments
from tests.support.helpers import Control
from tests.support.hosts import failing_host
from tests.support.waiting import wait_until

pytestmark = [on_deployments(*ALL), pytest.mark.postgres]

TWO_STEPS = {
    "when": "two steps",
    "steps": [{"tool_calls": [{"name": "list_files"}]}, {"text": "done"}],
}
GATED = {
    "when": "gated",
    "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "done"}],
}
ANSWERED = ["before_turn", "before_commit", "after_commit", "on_terminal"]

failing_fleet = host_fleet("tests.support.hosts:failing_host")


@pytest.fixture
def client(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[parley.Client]:
    """A client of the deployment under test (``backend``, which the acceptance suite
    parametrizes: embedded on SQLite and PostgreSQL, and this module's fleet)."""
    with deployed_client(
        backend, request, tmp_path, fleet="failing_fleet", host=failing_host
    ) as deployed:
        yield deployed


def hooks_seen(control: Control, turn_id: str, *, ended: int = 1) -> list[dict[str, Any]]:
    """The hook calls of the turn, once ``on_terminal`` was called ``ended`` times (the
    observational hooks run after the end is published, so a waiter may see it first)."""
    path = control.dir / "hooks.jsonl"

    def calls() -> list[dict[str, Any]]:
        lines = path.read_text().splitlines() if path.exists() else []
        return [call for call in map(json.loads, lines) if call["turn_id"] == turn_id]

    wait_until(
        lambda: sum(c["hook"] == "on_terminal" for c in calls()) >= ended,
        what=f"on_terminal called {ended} time(s)",
    )
    return calls()


def hook_names(control: Control, turn_id: str, *, ended: int = 1) -> list[str]:
    return [c["hook"] for c in hooks_seen(control, turn_id, ended=ended)]


def committed(client: parley.Client, turn_id: str) -> int:
    return len(client.store.steps_of(turn_id))


def go_on_afterwards(session: parley.Session) -> None:
    """The session is not bricked: its next turn runs."""
    assert session.turn("two steps again", timeout=60).outcome is parley.TurnStatus.FINISHED


@pytest.mark.parametrize(
    ("phase", "outcome", "error", "steps", "partial", "seen"),
    [
        ("", "finished", None, 2, None, ANSWERED),
        (
            "driver_before_step",
            "failed",
            "RuntimeError: injected driver crash",
            0,
            None,
            ["before_turn", "on_terminal"],
        ),
        (
            "driver_after_step",
            "failed",
            "driver failed: injected driver failure",
            1,
            "half a thought",
            ["before_turn", "on_terminal"],
        ),
        (
            "before_turn",
            "failed",
            "InvalidRequest: before_turn failed: RuntimeError: injected failure in before_turn",
            0,
            None,
            ["before_turn", "on_terminal"],
        ),
        (
            "before_commit",
            "failed",
            "rejected by before_commit: RuntimeError: injected failure in before_commit",
            1,  # the rejected answer is not kept
            None,
            ["before_turn", "before_commit", "on_terminal"],
        ),
        ("after_commit", "finished", None, 2, None, ANSWERED),
        ("on_terminal", "finished", None, 2, None, ANSWERED),
    ],
)
def test_a_failure_at_each_phase_leaves_what_is_durable_and_what_the_hooks_saw(
    client: parley.Client,
    workspace: Path,
    control: Control,
    phase: str,
    outcome: str,
    error: str | None,
    steps: int,
    partial: str | None,
    seen: list[str],
) -> None:
    control.script([TWO_STEPS])
    session = client.open_session(workspace)
    context = {"control": str(control.dir), "fail": phase}
    result = session.submit("two steps", context=context).wait(timeout=60)
    assert (result.outcome.value, result.error, result.partial) == (outcome, error, partial)
    assert result.reply == ("done" if outcome == "finished" else None)
    assert committed(client, result.turn_id) == steps
    calls = hooks_seen(control, result.turn_id)
    assert [c["hook"] for c in calls] == seen
    assert calls[-1] == {
        "hook": "on_terminal",
        "turn_id": result.turn_id,
        "outcome": outcome,
        "steps": steps,
    }
    for call in calls:
        if call["hook"] == "after_commit":
            assert (call["outcome"], call["steps"], call["delta"]) == ("finished", 2, 4)
            assert call["host_context"] == context
        if call["hook"] == "before_commit":
            assert (call["outcome"], call["steps"]) == ("finished", 2)
    head = session.head
    assert (head == result.turn_id) == (outcome == "finished")  # a failure moves no head
    go_on_afterwards(session)


def test_a_cancellation_keeps_its_committed_steps_and_calls_only_on_terminal(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script([GATED])
    session = client.open_session(workspace)
    handle = session.submit("gated", context={"control": str(control.dir)})
    control.wait_entered()
    handle.interrupt()
    control.open_gate()
    result = handle.wait(timeout=60)
    assert result.outcome is parley.TurnStatus.CANCELLED and result.reply is None
    assert committed(client, result.turn_id) == 1  # the gate's step, with its result
    assert [c["hook"] for c in hooks_seen(control, result.turn_id)] == [
        "before_turn",
        "on_terminal",
    ]
    resumed = session.resume(result.turn_id).wait(timeout=60)
    assert resumed.reply == "done" and committed(client, result.turn_id) == 2
    # Ended twice now: the resumed end's hooks may come just after its waiter returned.
    assert [c["hook"] for c in hooks_seen(control, result.turn_id, ended=2)][-2:] == [
        "after_commit",
        "on_terminal",
    ]


@contextmanager
def refusing_steps(database_url: str) -> Iterator[None]:
    """While inside, the database refuses to commit any step but a turn's first (a
    trigger, so it fails inside the engine's own commit, on any back end)."""
    if database_url.startswith("sqlite"):
        path = database_url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TRIGGER refuse_steps BEFORE INSERT ON steps WHEN NEW.step_index >= 1 "
                "BEGIN SELECT RAISE(ABORT, 'injected: the database refuses this step'); END"
            )
        try:
            yield
        finally:
            with sqlite3.connect(path) as db:
                db.execute("DROP TRIGGER refuse_steps")
        return
    url = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(
            "CREATE FUNCTION refuse_steps() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'injected: the database refuses this step'; END $$"
        )
        db.execute(
            "CREATE TRIGGER refuse_steps BEFORE INSERT ON steps FOR EACH ROW "
            "WHEN (NEW.step_index >= 1) EXECUTE FUNCTION refuse_steps()"
        )
    try:
        yield
    finally:
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("DROP TRIGGER refuse_steps ON steps")
            db.execute("DROP FUNCTION refuse_steps()")


def database_of(client: parley.Client) -> str:
    return client.store.engine.url.render_as_string(hide_password=False)


def test_a_commit_the_database_refuses_is_never_seen_by_after_commit(
    client: parley.Client, backend: str, workspace: Path, control: Control
) -> None:
    """The final step's commit fails: the turn is left as its last commit left it
    (running, one step), no hook is told it ended, and once the database takes commits
    again the turn goes on (the fleet retries by itself; embedded, its caller resumes it)
    and after_commit and on_terminal see it end once."""
    control.script([TWO_STEPS])
    session = client.open_session(workspace)
    with refusing_steps(database_of(client)):
        handle = session.submit("two steps", context={"control": str(control.dir)})
        if backend.startswith("fleet"):
            # Step 1 asked again: a commit was refused, and retried.
            wait_until(
                lambda: len(control.requests()) >= 3,
                timeout=60,
                what="the refused commit to be retried",
            )
        else:
            with pytest.raises(StoreError, match="refuses this step"):
                handle.wait(timeout=60)
        state = client.store.run_state(handle.turn_id)
        assert state.status is parley.TurnStatus.RUNNING
        assert committed(client, handle.turn_id) == 1
        seen = hook_names(control, handle.turn_id, ended=0)
        assert "after_commit" not in seen and "on_terminal" not in seen
    if not backend.startswith("fleet"):
        handle = session.resume(handle.turn_id)
    result = handle.wait(timeout=60)
    assert result.outcome is parley.TurnStatus.FINISHED and result.reply == "done"
    assert committed(client, result.turn_id) == 2
    seen = hook_names(control, result.turn_id)
    assert seen.count("after_commit") == 1 and seen.count("on_terminal") == 1
    assert seen[-2:] == ["after_commit", "on_terminal"]
    go_on_afterwards(session)
