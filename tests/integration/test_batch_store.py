"""The store's side of batches (src/parley/store/batches.py), on SQLite and PostgreSQL: a
batch is written in one transaction, five rows per line that opens a session (bulk: COPY
on PostgreSQL), and nothing when it cannot be; a request id makes it idempotent; its
counts, usage, model and files are queries over its lines' runs; a line may open its
session on an imported conversation (a chat completion's earlier messages), written in
the same bulk write as Session.seed_history would leave it; a cancel ends the unstarted
lines unrun, each with its end event, and leaves a line a driver took to its driver; the batch
window's reads see the oldest queued batch runs, not the deferred ones, and the sweeper's
look at work leaves queued batch runs to the window; prune deletes ended batches with
their files; every tenant's batches are listed newest first; an upload no batch was made
from can be deleted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, text

import parley
from parley.ports.backend import CommittedStep
from parley.schemas import tables as t
from parley.schemas.batches import (
    BatchStatus,
    FileKind,
    FileRecord,
    LinePlan,
    LineRefusal,
    SeededHistory,
)
from parley.schemas.errors import BatchNotFound, Conflict, FileNotFound, TurnEnded
from parley.schemas.events import EventKind
from parley.schemas.messages import StepPayload, ToolCall, ToolResult
from parley.schemas.records import SteerKind, TurnStatus, Usage
from parley.seeding import SEEDED_MODEL
from parley.store.batch_acceptance import Acceptance, NewBatch
from parley.store.batches import CANCELLED_UNSTARTED
from parley.store.clock import utc_now
from parley.store.ids import new_id
from parley.store.sql_store import SqlStore
from parley.store.statements import batches as bq
from tests.conftest import BACKENDS
from tests.integration.batch_plans import (
    clear_batch_runs,
    create_batch,
    give_place,
    new_batch,
    opening,
    wait_for_an_answer,
    wait_for_capacity,
)
from tests.integration.drive import Driving, finish, migrated_store, new_session, start, submit


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


def test_a_batch_is_five_rows_a_line_written_in_bulk_and_counted_from_its_runs(
    store: SqlStore,
) -> None:
    before = store.table_counts()
    batch, created = create_batch(
        store, new_batch(), [opening(n) for n in range(1, 51)], [refusal(51)]
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
    first, created = create_batch(store, new_batch(request_id="job-1"), [opening(1)], [])
    again, created_again = create_batch(store, new_batch(request_id="job-1"), [opening(1)], [])
    assert created and not created_again and again.batch_id == first.batch_id
    other, _ = create_batch(store, new_batch(tenant="other", request_id="job-1"), [opening(1)], [])
    assert other.batch_id != first.batch_id  # request ids are the tenant's own


def test_a_line_whose_conversation_is_gone_is_refused_alone(store: SqlStore) -> None:
    continuing = LinePlan(line=2, custom_id="c2", prompt="p", session_id=new_id(), root=None)
    batch, _ = create_batch(store, new_batch(), [opening(1), continuing], [])
    assert (batch.counts.total, batch.counts.queued, batch.counts.failed) == (2, 1, 1)
    [refused] = store.batch_lines(batch.batch_id, FileKind.BATCH_ERROR, 0, 10)
    assert refused.error is not None and refused.error["code"] == "conversation_not_found"


def test_a_batch_is_seen_and_started_only_once_its_last_transaction_made_it_whole(
    store: SqlStore,
) -> None:
    clear_batch_runs(store)
    batch = new_batch(request_id=f"job-{uuid.uuid4().hex}")
    assert store.open_batch(batch) is None
    store.accept_lines(batch.batch_id, "acme", [opening(1), opening(2)], [refusal(3)])
    lines = store.batch_lines(batch.batch_id, None, 0, 10)
    sessions = [line.session_id for line in lines if line.session_id is not None]
    assert len(sessions) == 2  # written, in a transaction of its own

    # Half accepted: no batch to a reader, no line to start, and no second batch made.
    with pytest.raises(BatchNotFound):
        store.get_batch(batch.batch_id)
    with pytest.raises(BatchNotFound):
        store.cancel_batch(batch.batch_id)
    assert batch.batch_id not in [b.batch_id for b in store.list_batches(tenant="acme", limit=100)]
    assert store.place_batch_runs(10, {}) == []  # the window places none of its lines
    assert not set(sessions) & set(store.sessions_with_work())
    assert store.batch_runs_in_flight() == 0
    retried = new_batch(request_id=batch.request_id)
    assert store.open_batch(retried) == Acceptance(batch_id=batch.batch_id, lines=3, dropping=False)
    store.accept_lines(batch.batch_id, "acme", [opening(4)], [])

    whole = store.finish_batch(batch.batch_id, [])

    assert whole.status is BatchStatus.IN_PROGRESS and whole.counts.total == 4
    assert store.open_batch(retried) == store.get_batch(batch.batch_id)
    assert set(store.place_batch_runs(10, {})) == {
        line.session_id for line in store.batch_lines(batch.batch_id, None, 0, 10) if line.turn_id
    }
    with pytest.raises(Conflict):  # finished: no more lines, and no second finish
        store.accept_lines(batch.batch_id, "acme", [opening(5)], [])
    with pytest.raises(Conflict):
        store.finish_batch(batch.batch_id, [])
    assert store.drop_batch(batch.batch_id) is None  # nor is it dropped


def test_a_dropped_acceptance_leaves_nothing_and_names_its_roots(store: SqlStore) -> None:
    before = store.table_counts()
    batch = new_batch(request_id="dropped")
    assert store.open_batch(batch) is None
    store.accept_lines(batch.batch_id, "acme", [opening(1, "/w/1"), opening(2, "/w/2")], [])
    store.accept_lines(batch.batch_id, "acme", [opening(3, "/w/3")], [refusal(4)])

    # A retry that saw it at another count finds it alive: it is not dropped.
    assert store.drop_batch(batch.batch_id, seen=2) is None
    assert sorted(store.drop_batch(batch.batch_id, seen=4) or []) == ["/w/1", "/w/2", "/w/3"]

    assert store.table_counts() == before
    assert store.batch_by_request("acme", "dropped") is None
    with pytest.raises(Conflict):  # its process, if it went on, stops at its next chunk
        store.accept_lines(batch.batch_id, "acme", [opening(5)], [])
    assert store.open_batch(batch) is None  # the request id is free again
    assert store.drop_batch(batch.batch_id) == []


def test_an_acceptance_abandoned_an_hour_ago_is_listed_to_drop(store: SqlStore) -> None:
    old, fresh = new_batch(), new_batch()
    for batch in (old, fresh):
        assert store.open_batch(batch) is None
        store.accept_lines(batch.batch_id, "acme", [opening(1)], [])
    with store.engine.begin() as db:
        db.execute(
            text("UPDATE batches SET created_at = :t WHERE id = :id"),
            {"t": utc_now() - timedelta(hours=2), "id": old.batch_id},
        )
    abandoned = store.abandoned_acceptances(utc_now() - timedelta(hours=1))
    assert Acceptance(batch_id=old.batch_id, lines=1, dropping=False) in abandoned
    assert fresh.batch_id not in [a.batch_id for a in abandoned]
    for batch in (old, fresh):
        store.drop_batch(batch.batch_id)


def test_a_line_continues_its_session_after_what_it_has(store: SqlStore) -> None:
    session_id = new_session(store)
    plans = [
        LinePlan(line=n, custom_id=f"c{n}", prompt=f"p{n}", session_id=session_id, root=None)
        for n in (1, 2)
    ]
    batch, _ = create_batch(store, new_batch(), plans, [])
    turns = store.tree(session_id)
    assert [t.request_id for t in turns] == ["c1", "c2"]
    # A custom_id that was a request id of the session already is refused, alone.
    again, _ = create_batch(store, new_batch(), [plans[0], opening(3)], [])
    assert (again.counts.total, again.counts.failed, again.counts.queued) == (2, 1, 1)
    [refused] = store.batch_lines(again.batch_id, FileKind.BATCH_ERROR, 0, 10)
    assert refused.error is not None and refused.error["code"] == "duplicate_custom_id"
    assert len(store.tree(session_id)) == 2
    assert batch.counts.queued == 2


def test_the_sessions_a_batch_opens_name_it_and_a_listing_may_leave_them_out(
    store: SqlStore,
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    older = store.create_session(root="/r", metadata={}, token_ceiling=None, tenant=tenant)
    continued = store.create_session(root="/r", metadata={}, token_ceiling=None, tenant=tenant)
    plans = [
        opening(1),
        LinePlan(line=2, custom_id="c2", prompt="p", session_id=continued.session_id, root=None),
        opening(3),
    ]
    batch, _ = create_batch(store, new_batch(tenant=tenant), plans, [])
    newer = store.create_session(root="/r", metadata={}, token_ceiling=None, tenant=tenant)

    opened = {plans[0].session_id, plans[2].session_id}
    everything = store.list_sessions(tenant=tenant, limit=10)
    assert {r.session_id for r in everything} == opened | {
        older.session_id,
        continued.session_id,
        newer.session_id,
    }
    assert {r.session_id for r in everything if r.batch_id == batch.batch_id} == opened
    # A session a line only continued stays a conversation; the batch's own are left out.
    conversations = [older.session_id, continued.session_id, newer.session_id][::-1]
    listed = store.list_sessions(tenant=tenant, limit=10, batch_sessions=False)
    assert [r.session_id for r in listed] == conversations
    assert all(r.batch_id is None for r in listed)
    first = store.list_sessions(tenant=tenant, limit=1, batch_sessions=False)
    rest = store.list_sessions(
        tenant=tenant, limit=10, before=first[0].session_id, batch_sessions=False
    )
    assert [r.session_id for r in first + rest] == conversations
    # A batch's session is a page mark like any of the tenant's (newest first from it).
    from_line = store.list_sessions(
        tenant=tenant, limit=10, before=plans[0].session_id, batch_sessions=False
    )
    assert [r.session_id for r in from_line] == conversations[1:]
    assert store.get_session(plans[2].session_id).batch_id == batch.batch_id


def test_a_batch_none_of_whose_lines_is_accepted_fails_saying_why(store: SqlStore) -> None:
    batch, _ = create_batch(store, new_batch(), [], [refusal(1), refusal(2)])
    assert batch.status is BatchStatus.FAILED and batch.ended_at is not None
    assert batch.errors is not None and [e["line"] for e in batch.errors] == [1, 2]


def test_a_cancel_ends_the_unstarted_lines_unrun_and_leaves_a_taken_one_to_its_driver(
    store: SqlStore,
) -> None:
    batch, _ = create_batch(store, new_batch(), [opening(n) for n in range(1, 6)], [])
    lines = store.batch_lines(batch.batch_id, None, 0, 10)
    give_place(store, lines[0].turn_id)
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


def test_a_cancel_ends_the_lines_queued_in_a_conversation_whose_turn_waits(
    store: SqlStore,
) -> None:
    session_id = new_session(store)
    submit(store, session_id, "asks a person")
    waiting = start(store, session_id)
    wait_for_an_answer(store, waiting.turn_id)
    plans = [
        LinePlan(line=n, custom_id=f"c{n}", prompt=f"p{n}", session_id=session_id, root=None)
        for n in (1, 2)
    ]
    batch, _ = create_batch(store, new_batch(), [*plans, opening(3)], [])
    lines = store.batch_lines(batch.batch_id, None, 0, 10)
    steered = lines[1].turn_id or ""
    store.add_steer(steered, SteerKind.SAY, "and this too")

    cancelled = store.cancel_batch(batch.batch_id)

    assert cancelled.unfinished == ()  # none left behind the waiting turn
    ends = {e.turn_id: e.data for e in cancelled.ended}
    assert set(ends) == {line.turn_id for line in lines}
    assert ends[steered]["undelivered"] == ["and this too"]
    assert store.run_state(steered).undelivered == ("and this too",)
    for line in lines:
        run = store.run_state(line.turn_id or "")
        assert (run.status, run.error, run.attempts) == (
            TurnStatus.CANCELLED,
            CANCELLED_UNSTARTED,
            0,
        )
    ended = store.get_batch(batch.batch_id)
    assert ended.status is BatchStatus.CANCELLED and ended.counts.failed == 3
    assert store.run_state(waiting.turn_id).status is TurnStatus.WAITING  # not the batch's
    with pytest.raises(TurnEnded):
        store.add_steer(steered, SteerKind.SAY, "too late")


def test_a_cancel_of_a_batch_whose_lines_all_ended_leaves_it_completed(store: SqlStore) -> None:
    batch, _ = create_batch(store, new_batch(), [opening(1)], [])
    [line] = store.batch_lines(batch.batch_id, None, 0, 1)
    give_place(store, line.turn_id)
    taken = start(store, line.session_id or "")
    finish(store, taken, taken.next_seq)

    cancelled = store.cancel_batch(batch.batch_id)  # before any read wrote its end

    assert cancelled.ended == () and cancelled.unfinished == ()
    ended = store.get_batch(batch.batch_id)
    assert ended.status is BatchStatus.COMPLETED and ended.cancelling_at is None


def ended(store: SqlStore, batch_id: str, *, start: datetime) -> None:
    """End every line of the batch, one a millisecond from ``start``, the last first."""
    lines = store.batch_lines(batch_id, None, 0, 100_000)
    with store.engine.begin() as db:
        for n, line in enumerate(reversed(lines)):
            db.execute(
                t.runs.update()
                .where(t.runs.c.turn_id == line.turn_id)
                .values(status="finished", ended_at=start + timedelta(milliseconds=n)),
            )


def test_a_batchs_ends_are_read_from_an_index_a_page_at_a_time(store: SqlStore) -> None:
    start = utc_now()
    batches = [create_batch(store, new_batch(), [opening(n) for n in range(1, 301)], [])[0]]
    batches += [create_batch(store, new_batch(), [opening(n) for n in range(1, 301)], [])[0]]
    for batch in batches:
        ended(store, batch.batch_id, start=start)
    first = batches[0].batch_id

    pages, after = [], (start - timedelta(seconds=5), 0)
    while page := store.lines_ended_after(first, after, 70):
        pages.append(page)
        assert page[-1].ended_at is not None
        after = (page[-1].ended_at, page[-1].line)
    read = [line.line for page in pages for line in page]
    assert read == list(range(300, 0, -1)) and len(pages) == 5  # each once, in end order

    plan = explained(store, bq.ended_after(store.engine.dialect.name), first, start)
    assert "ix_runs_batch_ended" in plan, plan
    # Not every line of the batch for every page (its key, or a hash of it).
    assert "(batch_id=?)" not in plan and "Seq Scan on batch_lines" not in plan, plan


def test_following_a_batch_costs_as_much_a_line_whatever_its_size(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'follow.db'}"
    sizes = {"small": 300, "large": 2400}
    with migrated_store(url) as store:
        made = {
            name: create_batch(store, new_batch(), [opening(n) for n in range(1, size + 1)], [])[0]
            for name, size in sizes.items()
        }
        for batch in made.values():
            ended(store, batch.batch_id, start=utc_now())
    steps = {}
    with parley.connect(url) as client:
        # The work SQLite does, counted in steps of its virtual machine.
        counted = [0]

        def count() -> int:
            counted[0] += 1
            return 0

        engine = client.store.engine
        event.listen(
            engine, "connect", lambda dbapi, _record: dbapi.set_progress_handler(count, 100)
        )
        engine.dispose()
        for name, batch in made.items():
            counted[0] = 0
            assert sum(1 for _ in client.batch(batch.batch_id).results()) == sizes[name]
            steps[name] = counted[0]
    # Eight times the lines, at most eight times the work (it was 18 times: every page
    # read the whole batch, and asked for more the more it had given).
    assert steps["large"] < 8 * steps["small"], steps


def explained(store: SqlStore, statement: Any, batch_id: str, after: datetime) -> str:
    """The database's plan for the read of a page of ended lines."""
    prefix = "EXPLAIN QUERY PLAN " if store.engine.dialect.name == "sqlite" else "EXPLAIN "

    def explain(*args: Any) -> tuple[str, Any]:
        return prefix + args[2], args[3]

    binds = {"b_batch_id": batch_id, "b_after_at": after, "b_after_line": 0, "b_limit": 70}
    with store.engine.connect() as db:
        event.listen(db, "before_cursor_execute", explain, retval=True)
        rows = db.execute(statement, binds).cursor.fetchall()  # (the plan's, not the read's)
        return "\n".join(str(row[-1]) for row in rows)


def test_the_window_places_the_oldest_batch_runs_and_a_driver_claims_only_those(
    store: SqlStore,
) -> None:
    clear_batch_runs(store)
    batch, _ = create_batch(store, new_batch(), [opening(n) for n in range(1, 5)], [])
    lines = store.batch_lines(batch.batch_id, None, 0, 10)
    sessions = [line.session_id or "" for line in lines]
    # Waiting for a place: not the sweeper's to kick, and a kick claims nothing.
    assert not set(sessions) & set(store.sessions_with_work())
    assert store.start_drive(sessions[0], worker="w", seq_floor=lambda _t, _f: 0)[1] is None
    assert store.place_batch_runs(2, {}) == sessions[:2]
    assert store.batch_runs_in_flight() == 2
    assert set(sessions[:2]) <= set(store.sessions_with_work())  # placed: recovered as any
    assert set(store.placed_batch_sessions()) == set(sessions[:2])
    taken = start(store, sessions[0])
    wait_for_capacity(store, lines[1].turn_id)
    # Driven, or waiting for capacity: both hold their places (the driven one is listed:
    # a recovery's kick finds it there if its driver dies).
    assert store.place_batch_runs(2, {}) == []
    assert store.placed_batch_sessions() == [sessions[0]]
    finish(store, taken, taken.next_seq)
    assert store.place_batch_runs(2, {}) == [sessions[2]]


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
    batch, _ = create_batch(store, plan, [], [refusal(1)])  # failed: ended at once
    running, _ = create_batch(store, new_batch(), [opening(1)], [])
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
    create_batch(store, new_batch(), [plan], [])
    again, _ = create_batch(store, new_batch(), [plan], [])
    assert again.status is BatchStatus.FAILED and again.counts.failed == again.counts.total == 1
    assert again.errors is not None and again.errors[0]["code"] == "duplicate_custom_id"


def imported(session_id: str) -> LinePlan:
    """A chat completion's line: its session starts with two turns, one a tool round."""
    call = ToolCall(id="c1", name="read_file", arguments='{"path": "a"}')
    turns = (
        ("hello", (StepPayload(text="hi!", model=SEEDED_MODEL),)),
        (
            "read a",
            (
                StepPayload(
                    tool_calls=(call,),
                    tool_results=(ToolResult(call_id="c1", name="read_file", content="A"),),
                    model=SEEDED_MODEL,
                ),
                StepPayload(text="it says A", model=SEEDED_MODEL),
            ),
        ),
    )
    messages = ({"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi!"})
    return LinePlan(
        line=1,
        custom_id="chat-1",
        prompt="and now?",
        session_id=session_id,
        root="/tmp",
        history=SeededHistory(turns=turns, messages=messages),
    )


def test_a_line_opens_its_session_on_the_conversation_it_imports_in_the_same_bulk_write(
    store: SqlStore,
) -> None:
    plan = imported(new_id())
    before = store.table_counts()
    batch, _ = create_batch(store, new_batch(), [plan, opening(2)], [])
    after = store.table_counts()

    grown = {t: after[t] - before[t] for t in after if after[t] != before[t]}
    assert grown == {
        "sessions": 2,
        "turns": 2 + 2,  # the lines', and the two imported
        "runs": 2 + 2,
        "steps": 3,
        "seeds": 1,
        "events": 2,
        "batch_lines": 2,
        "batches": 1,
        "files": 2,
    }
    # As Session.seed_history leaves it: the imported turns finished, the last the head,
    # the messages kept as given; the line's turn queued after them.
    seeded = store.history(plan.session_id)
    assert [(t.prompt, t.reply, t.status) for t in seeded] == [
        ("hello", "hi!", TurnStatus.FINISHED),
        ("read a", "it says A", TurnStatus.FINISHED),
    ]
    assert store.get_session(plan.session_id).head_turn_id == seeded[-1].turn_id
    assert store.seeded(plan.session_id) == (list(plan.history.messages), None)  # type: ignore[union-attr]
    assert [s.payload.tool_results[0].content for s in store.steps_of(seeded[-1].turn_id)[:1]] == [
        "A"
    ]
    line = store.batch_lines(batch.batch_id, None, 0, 1)[0]
    give_place(store, line.turn_id)
    taken = start(store, plan.session_id)
    assert taken.turn_id == line.turn_id
    assert store.get_turn(taken.turn_id).parent_id == seeded[-1].turn_id
    finish(store, taken, taken.next_seq)
    assert [t.prompt for t in store.history(plan.session_id)] == ["hello", "read a", "and now?"]


def test_a_batch_sums_what_its_ended_lines_spent_and_names_the_model_that_ran_them(
    store: SqlStore,
) -> None:
    batch, _ = create_batch(store, new_batch(), [opening(n) for n in range(1, 4)], [refusal(4)])
    assert batch.model is None and batch.usage == Usage()
    lines = store.batch_lines(batch.batch_id, None, 0, 10)
    for placed in lines:
        give_place(store, placed.turn_id)

    def run_a_step(session_id: str | None) -> Driving:
        driving = start(store, session_id or "")
        spent = Usage(input_tokens=30, output_tokens=7, cached_tokens=4)
        store.commit_step(
            run_id=driving.run_id,
            session_id=driving.session_id,
            fence=driving.fence,
            step=CommittedStep(
                index=0, payload=StepPayload(text="x", usage=spent, model="openai:gpt-4o-mini")
            ),
            steer_cursor=0,
            events=[],
            close_inbox_if_idle=False,
        )
        return driving

    first, second = run_a_step(lines[0].session_id), run_a_step(lines[1].session_id)
    finish(store, first, first.next_seq)

    ended = store.get_batch(batch.batch_id)
    # The ended line's usage, not the running one's: what OpenAI counts is what ended.
    assert ended.usage == Usage(input_tokens=30, output_tokens=7, cached_tokens=4)
    assert ended.model == "openai:gpt-4o-mini"
    finish(store, second, second.next_seq)
    assert store.get_batch(batch.batch_id).usage == Usage(
        input_tokens=60, output_tokens=14, cached_tokens=8
    )


def test_every_tenants_batches_are_listed_newest_first(store: SqlStore) -> None:
    older, _ = create_batch(store, new_batch(tenant="acme"), [opening(1)], [])
    newer, _ = create_batch(store, new_batch(tenant=None), [opening(1)], [])
    # (The PostgreSQL database is shared: other tests' batches may be listed too.)
    listed = [b.batch_id for b in store.all_batches(limit=1000)]
    assert listed.index(newer.batch_id) < listed.index(older.batch_id)
    assert store.all_batches(limit=1)[0].batch_id == listed[0]
    after = [b.batch_id for b in store.all_batches(limit=1000, after=newer.batch_id)]
    assert newer.batch_id not in after and older.batch_id in after
    with pytest.raises(BatchNotFound):
        store.all_batches(limit=10, after=f"batch_{uuid.uuid4().hex}")


def test_an_upload_no_batch_was_made_from_is_deleted_and_one_in_use_is_kept(
    store: SqlStore,
) -> None:
    uploads = [
        store.create_file(
            FileRecord(
                file_id=f"file-{uuid.uuid4().hex}",
                tenant=None,
                purpose="batch",
                filename="in.jsonl",
                kind=FileKind.UPLOAD,
                bytes=None,
                batch_id=None,
                created_at=utc_now(),
            ),
            iter([b"{}\n"]),
        )
        for _ in range(2)
    ]
    used, unused = uploads
    plan = NewBatch(**{**new_batch().__dict__, "input_file_id": used.file_id})
    batch, _ = create_batch(store, plan, [opening(1)], [])
    assert not store.delete_upload(used.file_id)
    assert store.file_part(used.file_id, 0) == b"{}\n"
    assert store.delete_upload(unused.file_id)
    with pytest.raises(FileNotFound):
        store.get_file(unused.file_id)
    with pytest.raises(FileNotFound):  # (a reader caught mid-file is told so)
        store.file_part(unused.file_id, 0)
    assert not store.delete_upload(batch.output_file_id)  # a batch's own file: never
