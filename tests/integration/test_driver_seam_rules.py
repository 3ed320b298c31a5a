"""The rules of the driver seam that a driver cannot break: a lost session or a stopped
turn stays lost or stopped whatever the driver catches, a drive that runs no step fails,
bad arguments to ``step`` are clear errors that change nothing, and a step outside its
drive is refused.  (The seam end to end, embedded and on the fleet, is
tests/acceptance/test_driver_seam.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import parley
from parley.coordination.local_coordinator import LocalCoordinator
from parley.engine.turn_engine import TurnEngine
from parley.errors import DriverFailed, InvalidRequest
from parley.runtime.session_drainer import SessionDrainer
from parley.schemas.records import TurnStatus
from parley.store.sql_store import SqlStore
from tests.integration.drive import new_session, submit
from tests.support.helpers import RecordingModel, scripted_host

TWO_CALLS = {
    "when": ".*",
    "steps": [
        {"tool_calls": [{"name": "list_files"}]},
        {"tool_calls": [{"name": "list_files"}]},
        {"text": "done"},
    ],
}


def run(
    tmp_path: Path, driver: Any, rules: list[dict[str, Any]] | None = None
) -> parley.TurnResult:
    host = scripted_host(rules or [TWO_CALLS], driver=driver)
    with parley.connect(f"sqlite:///{tmp_path / 'p.db'}", host=host) as client:
        return client.open_session(tmp_path).turn("go", timeout=30)


class Thief:
    """After the first step, another driver takes the session over (its fence); then the
    driver swallows whatever stops it and keeps asking for steps."""

    def __init__(self, store: SqlStore, session_id: str) -> None:
        self.store, self.session_id = store, session_id
        self.refusals: list[str] = []

    def drive(self, turn: parley.DriverTurn) -> None:
        turn.step()
        self.store.start_drive(self.session_id, worker="thief", seq_floor=lambda *_: 0)
        for _ in range(3):
            try:
                turn.step()
            except BaseException as exc:  # the worst a driver can do
                self.refusals.append(type(exc).__name__)
        raise DriverFailed("I give up", partial="never kept")


def test_a_driver_that_swallows_a_lost_session_commits_nothing_more(
    sqlite_store: SqlStore, tmp_path: Path
) -> None:
    session_id = new_session(sqlite_store, root=str(tmp_path))
    turn_id, _run_id = submit(sqlite_store, session_id, "go")
    thief = Thief(sqlite_store, session_id)
    model = RecordingModel(parley.models.ScriptedModel({"rules": [TWO_CALLS]}))
    engine = TurnEngine(
        store=sqlite_store,
        coordinator=LocalCoordinator(),
        host=parley.Host(model=model, driver=thief),
    )
    SessionDrainer(engine).drive(session_id)  # Fenced: logged, the session let go
    assert thief.refusals == ["TurnStopped"] * 3
    assert len(sqlite_store.steps_of(turn_id)) == 1  # the thief's fence refused step 1
    state = sqlite_store.run_state(turn_id)
    assert state.status is TurnStatus.RUNNING and state.partial is None  # the thief's now
    assert len(model.requests) == 2  # the fenced step's call, and no other after it


def test_a_driver_that_catches_an_interrupt_cannot_keep_the_turn_going(tmp_path: Path) -> None:
    clients: list[parley.Client] = []

    class Stubborn:
        attempts = 0

        def drive(self, turn: parley.DriverTurn) -> None:
            turn.step()
            clients[0].attach(turn.options.turn_id).interrupt()
            for _ in range(3):
                try:
                    turn.step()
                except parley.TurnStopped:
                    self.attempts += 1

    model = RecordingModel(parley.models.ScriptedModel({"rules": [TWO_CALLS]}))
    driver = Stubborn()
    with parley.connect(
        f"sqlite:///{tmp_path / 'p.db'}", host=parley.Host(model=model, driver=driver)
    ) as client:
        clients.append(client)
        result = client.open_session(tmp_path).turn("go", timeout=30)
    assert result.outcome is TurnStatus.CANCELLED and result.steps == 1
    assert driver.attempts == 3 and len(model.requests) == 1


def test_a_drive_that_runs_no_step_fails_the_turn(tmp_path: Path) -> None:
    class Idle:
        def drive(self, turn: parley.DriverTurn) -> None:
            return None

    result = run(tmp_path, Idle())
    assert result.outcome is TurnStatus.FAILED
    assert result.error == "the driver Idle returned before any step"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"messages": "hello"}, "list of parley messages"),
        ({"messages": [{"role": "user", "text": "x"}]}, "list of parley messages"),
        ({"tools": "list_files"}, "list of tool names"),
        ({"tools": ["no_such_tool"]}, "unknown tools"),
        ({"label": "x" * 65}, "up to 64 characters"),
    ],
)
def test_bad_step_arguments_are_clear_errors_that_change_nothing(
    tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    seen: list[str] = []

    class Careless:
        def drive(self, turn: parley.DriverTurn) -> None:
            try:
                turn.step(**arguments)
            except InvalidRequest as exc:
                seen.append(str(exc))
            assert turn.steps == ()  # nothing ran, nothing committed
            parley.AgentLoop().drive(turn)

    result = run(tmp_path, Careless())
    assert result.outcome is TurnStatus.FINISHED and result.steps == 3
    assert len(seen) == 1 and message in seen[0]


def test_a_call_to_a_tool_the_step_did_not_offer_is_answered_with_an_error(
    tmp_path: Path,
) -> None:
    class Narrow:
        def drive(self, turn: parley.DriverTurn) -> None:
            while not turn.step(tools=["read_file"]).ended:
                pass

    host = scripted_host([TWO_CALLS], driver=Narrow())
    with parley.connect(f"sqlite:///{tmp_path / 'p.db'}", host=host) as client:
        result = client.open_session(tmp_path).turn("go", timeout=30)
        steps = client.store.steps_of(result.turn_id)
    assert result.outcome is TurnStatus.FINISHED
    [refused] = steps[0].payload.tool_results
    assert refused.is_error and "not offered at this step" in refused.content


def test_a_step_after_the_drive_is_refused_and_a_failure_after_the_end_changes_nothing(
    tmp_path: Path,
) -> None:
    kept: list[parley.DriverTurn] = []

    class Late:
        def drive(self, turn: parley.DriverTurn) -> None:
            kept.append(turn)
            parley.AgentLoop().drive(turn)
            raise DriverFailed("after the end")

    result = run(tmp_path, Late())
    assert result.outcome is TurnStatus.FINISHED and result.reply == "done"
    with pytest.raises(InvalidRequest, match="ended"):
        kept[0].step()


def test_a_host_driver_must_drive() -> None:
    with pytest.raises(InvalidRequest, match="drive"):
        scripted_host([TWO_CALLS], driver=object())
