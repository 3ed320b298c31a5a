"""When a turn gives up: after ``MAX_ATTEMPTS`` claims in a row that committed no step (a
crash loop), not after that many claims of a turn that goes on moving (a long turn taken
over again and again, as when Redis is emptied every few seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import parley
from parley.coordination.local_coordinator import LocalCoordinator
from parley.engine.turn_engine import MAX_ATTEMPTS, TurnEngine, worker_name
from parley.runtime.session_drainer import SessionDrainer
from parley.schemas.records import TurnStatus
from parley.store.sql_store import SqlStore
from tests.integration.drive import commit, migrated_store, new_session, start, submit


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    with migrated_store(db_url) as store:
        yield store


def engine_for(store: SqlStore, label: str | None = None) -> TurnEngine:
    model = parley.models.ScriptedModel({"rules": [{"when": ".*", "steps": [{"text": "ok"}]}]})
    host = parley.Host(model=model)
    return TurnEngine(store=store, coordinator=LocalCoordinator(), host=host, label=label)


def drive_to_the_end(store: SqlStore, session_id: str) -> TurnStatus:
    """A driver that takes the session and runs the claimed turn to its end."""
    fence, claim = store.start_drive(session_id, worker="last", seq_floor=lambda _t, _f: 0)
    assert claim is not None
    status, _receipt = engine_for(store).run_claimed(claim, fence)
    return status


def test_a_turn_taken_over_many_times_while_it_commits_steps_goes_on(
    store: SqlStore, tmp_path: Path
) -> None:
    session_id = new_session(store, str(tmp_path))
    turn_id, _run = submit(store, session_id)
    for index in range(MAX_ATTEMPTS + 2):
        # Each driver commits a step, then loses the session to the next one.
        driving = start(store, session_id, worker=f"w{index}")
        assert store.run_state(turn_id).stalled_attempts == 1
        commit(store, driving, index)
        assert store.run_state(turn_id).stalled_attempts == 0

    assert drive_to_the_end(store, session_id) is TurnStatus.FINISHED
    state = store.run_state(turn_id)
    assert state.attempts == MAX_ATTEMPTS + 3 and state.error is None
    assert state.steps == MAX_ATTEMPTS + 2  # the last step's answer ended the turn as is


def test_a_turn_claimed_again_and_again_without_a_step_gives_up_and_a_resume_retries(
    store: SqlStore, tmp_path: Path
) -> None:
    session_id = new_session(store, str(tmp_path))
    turn_id, _run = submit(store, session_id)
    driving = start(store, session_id)
    commit(store, driving, 0)  # progress first: only the claims after it count
    for _ in range(MAX_ATTEMPTS - 1):
        start(store, session_id)  # each claimant dies before its first commit
    assert store.run_state(turn_id).stalled_attempts == MAX_ATTEMPTS - 1
    assert drive_to_the_end(store, session_id) is TurnStatus.FINISHED  # the tenth in a row

    second, _run = submit(store, session_id, "second")
    for _ in range(MAX_ATTEMPTS):
        start(store, session_id)
    assert drive_to_the_end(store, session_id) is TurnStatus.FAILED  # the eleventh
    state = store.run_state(second)
    assert state.error == f"gave up after {MAX_ATTEMPTS} attempts in a row that committed no step"
    assert state.steps == 0

    store.resume_turn(second, 0)  # a person looked into it: a fresh set of attempts
    assert store.run_state(second).stalled_attempts == 0
    assert drive_to_the_end(store, session_id) is TurnStatus.FINISHED


def test_a_run_names_the_engine_that_claimed_it_by_its_label_or_host_pid_and_thread(
    store: SqlStore, tmp_path: Path
) -> None:
    session_id = new_session(store, str(tmp_path))
    labelled, _run = submit(store, session_id)
    SessionDrainer(engine_for(store, label="engine-a")).drive(session_id)
    unlabelled, _run = submit(store, session_id, "second")
    SessionDrainer(engine_for(store)).drive(session_id)
    assert store.run_state(labelled).worker == "engine-a"
    assert store.run_state(unlabelled).worker == worker_name()
