"""A driver whose process is stopping, or whose slice is over, runs no more than the turn
it has, then hands its session over (the fleet's warm shutdown and fairness between
sessions; the processes themselves are tested in tests/acceptance/test_fleet_failures.py)."""

from __future__ import annotations

from pathlib import Path

import parley
from parley.coordination.local_coordinator import LocalCoordinator
from parley.engine.turn_engine import TurnEngine
from parley.ports.host import DeltaSink, ModelReply, ModelRequest
from parley.runtime.session_drainer import SessionDrainer
from parley.schemas.records import TurnStatus
from parley.store.sql_store import SqlStore
from tests.integration.drive import new_session, submit


class StopDuringFirstTurn:
    """Answers, and on its first call says the process is stopping."""

    name = "stopper"

    def __init__(self) -> None:
        self.stop = False
        self.calls = 0

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        self.calls += 1
        self.stop = True
        return ModelReply(text="done")


def driver_for(
    store: SqlStore,
    model: StopDuringFirstTurn,
    handed: list[str],
    *,
    slice_seconds: float | None = None,
    stops: bool = True,
    coordinator: LocalCoordinator | None = None,
) -> SessionDrainer:
    """A driver whose process stops when ``model`` says so (if ``stops``)."""
    engine = TurnEngine(
        store=store, coordinator=coordinator or LocalCoordinator(), host=parley.Host(model=model)
    )
    return SessionDrainer(
        engine,
        stopping=lambda: stops and model.stop,
        slice_seconds=slice_seconds,
        hand_over=handed.append,
    )


def three_queued_turns(store: SqlStore, root: Path) -> tuple[str, list[str]]:
    """A new session with three queued turns: its id and theirs."""
    session_id = new_session(store, root=str(root))
    return session_id, [submit(store, session_id, f"turn {n}")[0] for n in range(3)]


def statuses(store: SqlStore, turns: list[str]) -> list[TurnStatus]:
    return [store.run_state(turn_id).status for turn_id in turns]


FIRST_ONLY = [TurnStatus.FINISHED, TurnStatus.QUEUED, TurnStatus.QUEUED]


def test_a_stopping_driver_finishes_its_turn_claims_no_other_and_hands_over(
    sqlite_store: SqlStore, tmp_path: Path
) -> None:
    model, handed = StopDuringFirstTurn(), list[str]()
    session_id, turns = three_queued_turns(sqlite_store, tmp_path)
    assert driver_for(sqlite_store, model, handed).drive(session_id) == 1
    # The first turn's end claimed nothing: the others are queued, not left claimed.
    assert statuses(sqlite_store, turns) == FIRST_ONLY
    assert handed == [session_id] and model.calls == 1


def test_a_stopping_driver_with_no_turn_left_hands_nothing_over(
    sqlite_store: SqlStore, tmp_path: Path
) -> None:
    # A kick for a session with nothing to run would cost another worker a lock and a
    # start transaction that finds nothing.
    model, handed = StopDuringFirstTurn(), list[str]()
    session_id = new_session(sqlite_store, root=str(tmp_path))
    turn_id, _ = submit(sqlite_store, session_id)
    assert driver_for(sqlite_store, model, handed).drive(session_id) == 1
    assert sqlite_store.run_state(turn_id).status is TurnStatus.FINISHED
    assert handed == []


class MarkWorkDuringTurn(StopDuringFirstTurn):
    """Also marks work on the session while the driver holds it, as a submission does
    (whose kick is then left to that driver)."""

    def __init__(self, coordinator: LocalCoordinator, session_id: str) -> None:
        super().__init__()
        self.coordinator, self.session_id = coordinator, session_id

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        self.coordinator.mark_work(self.session_id)
        return super().stream(request, on_delta)


def test_a_stopping_driver_hands_over_work_marked_while_it_held_the_session(
    sqlite_store: SqlStore, tmp_path: Path
) -> None:
    # The turn's end counted nothing after it, but the work mark moved: a submission
    # relied on this driver to see it, so it must reach another one.
    session_id = new_session(sqlite_store, root=str(tmp_path))
    submit(sqlite_store, session_id)
    coordinator, handed = LocalCoordinator(), list[str]()
    model = MarkWorkDuringTurn(coordinator, session_id)
    driver = driver_for(sqlite_store, model, handed, coordinator=coordinator)
    assert driver.drive(session_id) == 1
    assert handed == [session_id]


def test_a_kick_that_reaches_a_stopping_driver_is_handed_over_untouched(
    sqlite_store: SqlStore, tmp_path: Path
) -> None:
    store, model = sqlite_store, StopDuringFirstTurn()
    handed: list[str] = []
    model.stop = True
    session_id = new_session(store, root=str(tmp_path))
    turn_id, _ = submit(store, session_id)
    assert driver_for(store, model, handed).drive(session_id) == 0
    assert store.run_state(turn_id).status is TurnStatus.QUEUED
    assert handed == [session_id] and model.calls == 0


def test_a_driver_past_its_slice_runs_the_turn_it_has_then_hands_over(
    sqlite_store: SqlStore, tmp_path: Path
) -> None:
    # A session that keeps receiving turns must not keep a worker slot: past its slice
    # the driver lets the kicks queued behind it go first (and always runs one turn).
    store, model, handed = sqlite_store, StopDuringFirstTurn(), list[str]()
    session_id, turns = three_queued_turns(store, tmp_path)
    sliced = driver_for(store, model, handed, slice_seconds=0, stops=False)
    assert sliced.drive(session_id) == 1
    assert statuses(store, turns) == FIRST_ONLY and handed == [session_id]
    assert driver_for(store, model, [], slice_seconds=60, stops=False).drive(session_id) == 2
