"""The store's side of batches (workers/store/batches.py), on SQLite and PostgreSQL: a
batch is written in one transaction, five rows per line that opens a session (bulk: COPY
on PostgreSQL), and nothing when it cannot be; a request id makes it idempotent; its
counts and files are queries over its lines' runs; a cancel ends the unstarted lines
unrun, each with its end event, and leaves a line a driver took to its driver; the batch
window's reads see the oldest queued batch runs, not the deferred ones, and the sweeper's
look at work leaves queued batch runs to the window; prune deletes ended batches with
their files."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from schemas.batches import BatchStatus, FileKind, FileRecord, LinePlan, LineRefusal
from schemas.errors import BatchNotFound, SessionNotFound
from schemas.events import EventKind
from schemas.records import TurnStatus
from tests.conftest import BACKENDS
from tests.integration.batch_plans import clear_batch_runs, new_batch, opening, wait_for_capacity
from tests.integration.drive import finish, migrated_store, new_session, start
from workers.store.batches import CANCELLED_UNSTARTED, NewBatch
from workers.store.clock import utc_now
from workers.store.ids import new_id
from workers.store.sql_store import SqlStore


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[SqlStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        url = request.getfixturevalue("postgres_url")
    with migrated_store(url) as opened:
        yield opened


def refusal(n: int) -> LineRefusal:
    return LineRefusal(line=n, custom_id=None, code="invalid_json", message="not JSON")


def test_a_batch_is_five_rows_a_line_written_in_one_go_and_counted_from_its_runs(
    store: SqlStore,
) -> None:
    before = store.table_counts()
    batch, created = store.create_batch(
        new_batch(), [opening(n) for n in range(1, 51)], [refusal(51)]
    )
    after = store.table_counts()

    assert created and batch.status is BatchStatus.IN_PROGRESS
    grown = {
        table: after[table] - before[table] for table in after if after[table] != before[table]
    }
    assert grown == {
        "sessions": 50,
        "turns": 50,
        "runs": 50,
        "events": 50,
        "batch_lines": 51,
        "batches": 1,
        "files": 2,
    }
    counts = batch.counts
    assert (counts.total, counts.completed, counts.failed, counts.queued) == (51, 0, 1, 50)
    # Each line is an ordinary session's queued turn: the tenant's, titled by its prompt.
    line = store.batch_lines(batch.batch_id, None, 0, 1)[0]
    assert line.custom_id == "c1" and line.turn_id is not None and line.session_id is not None
    session = store.get_session(line.session_id)
    assert session.tenant == "acme" and session.title == "ticket 1"
    run = store.run_state(line.turn_id)
    assert run.status is TurnStatus.QUEUED and run.priority == "batch"
    assert store.get_turn(line.turn_id).request_id == "c1"
    assert [e.kind for e in store.events_after(line.turn_id, 0)] == [EventKind.QUEUED]
    assert [r.line for r in store.batch_lines(batch.batch_id, FileKind.BATCH_ERROR, 0, 10)] == [51]
    assert store.batch_lines(batch.batch_id, FileKind.BATCH_OUTPUT, 0, 10) == []


def test_a_request_id_returns_the_batch_it_made(store: SqlStore) -> None:
    first, created = store.create_batch(new_batch(request_id="job-1"), [opening(1)], [])
    again, created_again = store.create_batch(new_batch(request_id="job-1"), [opening(1)], [])
    assert created and not created_again and again.batch_id == first.batch_id
    other, _ = store.create_batch(new_batch(tenant="other", request_id="job-1"), [opening(1)], [])
    assert other.batch_id != first.batch_id  # request ids are the tenant's own


def test_a_batch_that_cannot_be_written_writes_nothing(store: SqlStore) -> None:
    before = store.table_counts()
    continuing = LinePlan(line=2, custom_id="c2", prompt="p", session_id=new_id(), root=None)
    with pytest.raises(SessionNotFound):
        store.create_batch(new_batch(), [opening(1), continuing], [])
    assert store.table_counts() == before


def test_a_line_continues_its_session_after_what_it_has(store: SqlStore) -> None:
    session_id = new_session(store)
    plans = [
        LinePlan(line=n, custom_id=f"c{n}", prompt=f"p{n}", session_id=session_id, root=None)
        for n in (1, 2)
    ]
    batch, _ = store.create_batch(new_batch(), plans, [])
    turns = store.tree(session_id)
    assert [t.request_id for t in turns] == ["c1", "c2"]
    # A custom_id that was a request id of the session already is refused, alone.
    again, _ = store.create_batch(new_batch(), [plans[0], opening(3)], [])
    assert (again.counts.total, again.counts.failed, again.counts.queued) == (2, 1, 1)
    [refused] = store.batch_lines(again.batch_id, FileKind.BATCH_ERROR, 0, 10)
    assert refused.error is not None and refused.error["code"] == "duplicate_custom_id"
    assert len(store.tree(session_id)) == 2
    assert batch.counts.queued == 2


def test_a_batch_none_of_whose_lines_is_accepted_fails_saying_why(store: SqlStore) -> None:
    batch, _ = store.create_batch(new_batch(), [], [refusal(1), refusal(2)])
    assert batch.status is BatchStatus.FAILED and batch.ended_at is not None
    assert batch.errors is not None and [e["line"] for e in batch.errors] == [1, 2]


def test_a_cancel_ends_the_unstarted_lines_unrun_and_leaves_a_taken_one_to_its_driver(
    store: SqlStore,
) -> None:
    batch, _ = store.create_batch(new_batch(), [opening(n) for n in range(1, 6)], [])
    lines = store.batch_lines(batch.batch_id, None, 0, 10)
    taken = start(store, lines[0].session_id or "")

    cancelled = store.cancel_batch(batch.batch_id)

    assert cancelled.unfinished == (taken.turn_id,)
    assert {e.turn_id for e in cancelled.ended} == {line.turn_id for line in lines[1:]}
    for line in lines[1:]:
        assert line.turn_id is not None
        run = store.run_state(line.turn_id)
        assert run.status is TurnStatus.CANCELLED and run.error == CANCELLED_UNSTARTED
        assert run.attempts == 0  # never claimed
        kinds = [e.kind for e in store.events_after(line.turn_id, 0)]
        assert kinds == [EventKind.QUEUED, EventKind.END]
    mid = store.get_batch(batch.batch_id)
    assert mid.status is BatchStatus.CANCELLING and mid.counts.running == 1
    finish(store, taken, taken.next_seq)
    ended = store.get_batch(batch.batch_id)
    assert ended.status is BatchStatus.CANCELLED and ended.ended_at is not None
    assert (ended.counts.completed, ended.counts.failed) == (1, 4)
    assert [r.line for r in store.batch_lines(batch.batch_id, FileKind.BATCH_OUTPUT, 0, 10)] == [1]


def test_the_window_reads_the_oldest_startable_batch_runs(store: SqlStore) -> None:
    clear_batch_runs(store)
    batch, _ = store.create_batch(new_batch(), [opening(n) for n in range(1, 5)], [])
    lines = store.batch_lines(batch.batch_id, None, 0, 10)
    sessions = [line.session_id for line in lines]
    assert store.oldest_queued_batch_sessions(10) == sessions
    # Queued batch runs are the window's to start, not the sweeper's.
    assert not set(sessions) & set(store.sessions_with_work())
    taken = start(store, sessions[0] or "")
    wait_for_capacity(store, lines[1].turn_id)
    assert store.oldest_queued_batch_sessions(10) == sessions[2:]
    assert store.batch_runs_in_flight() == 2  # the one driven, the one waiting for capacity
    assert sessions[0] in store.sessions_with_work()  # a taken line is recovered as any
    finish(store, taken, taken.next_seq)


def test_prune_deletes_the_batches_that_ended_before_the_cut_with_their_files(
    store: SqlStore,
) -> None:
    upload = FileRecord(
        file_id=f"file-{uuid.uuid4().hex}",
        tenant="acme",
        purpose="batch",
        filename="in.jsonl",
        kind=FileKind.UPLOAD,
        bytes=None,
        batch_id=None,
        created_at=utc_now(),
    )
    stored = store.create_file(upload, iter([b"a" * 10, b"b" * 5]))
    assert stored.bytes == 15 and store.file_part(upload.file_id, 1) == b"b" * 5
    assert store.file_part(upload.file_id, 2) is None
    plan = NewBatch(**{**new_batch().__dict__, "input_file_id": upload.file_id})
    batch, _ = store.create_batch(plan, [], [refusal(1)])  # failed: ended at once
    running, _ = store.create_batch(new_batch(), [opening(1)], [])
    cut = utc_now() + timedelta(seconds=1)
    # (The PostgreSQL database is shared: other tests' ended batches may be listed too.)
    listed = store.prune_batches(cut, dry_run=True)
    assert batch.batch_id in listed and running.batch_id not in listed
    assert store.get_batch(batch.batch_id).status is BatchStatus.FAILED
    assert batch.batch_id in store.prune_batches(cut)
    with pytest.raises(BatchNotFound):
        store.get_batch(batch.batch_id)
    for file_id in (upload.file_id, batch.output_file_id, batch.error_file_id):
        with pytest.raises(Exception, match="no file"):
            store.get_file(file_id)
    assert store.get_batch(running.batch_id).status is BatchStatus.IN_PROGRESS


def test_a_batch_whose_continuations_are_all_refused_fails_saying_why(store: SqlStore) -> None:
    session_id = new_session(store)
    plan = LinePlan(line=1, custom_id="c1", prompt="p", session_id=session_id, root=None)
    store.create_batch(new_batch(), [plan], [])
    again, _ = store.create_batch(new_batch(), [plan], [])
    assert again.status is BatchStatus.FAILED and again.counts.failed == again.counts.total == 1
    assert again.errors is not None and again.errors[0]["code"] == "duplicate_custom_id"
