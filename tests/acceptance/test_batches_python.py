"""Batches from Python (docs/batches.md#from-python), on every deployment:
``client.submit_batch`` from a JSONL file's path or parsed lines, ``Batch.results()``
giving each line once as it ends (the first before the batch has), ``client.batch(id)``
from another client, a cancel, a request id that makes the submission idempotent, and
bad arguments refused before anything is written."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import parley
from parley import batch_acceptance
from parley.errors import BatchNotFound, InvalidRequest
from parley.schemas.batches import FileKind, LinePlan
from parley.store.batch_acceptance import Acceptance, NewBatch
from tests.acceptance.conftest import ClientFactory
from tests.support.abusive_lines import ABUSIVE
from tests.support.deployments import ALL, on_deployments
from tests.support.helpers import Control
from tests.support.waiting import wait_until

pytestmark = on_deployments(*ALL)

SLOW: dict[str, Any] = {
    "when": "^slow",
    "steps": [{"text": "".join(f"w{i} " for i in range(10)), "chunk_chars": 3, "delay_ms": 30}],
}
ECHO: dict[str, Any] = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
ASKS: dict[str, Any] = {
    "when": "^ask",
    "steps": [{"tool_calls": [{"name": "record_call", "arguments": {}}]}, {"text": "done"}],
}


def lines(prompts: list[str]) -> list[dict[str, Any]]:
    return [
        {"custom_id": f"c{n}", "method": "POST", "url": "/v1/responses", "body": {"input": p}}
        for n, p in enumerate(prompts)
    ]


def test_a_batch_from_a_file_gives_each_line_once_as_it_ends(
    make_client: ClientFactory, workspace: Path, tmp_path: Path
) -> None:
    client = make_client([SLOW, ECHO])
    source = tmp_path / "lines.jsonl"
    rows = lines([f"slow {n}" for n in range(6)])
    source.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    batch = client.submit_batch(source, root=workspace)

    seen: list[str | None] = []
    first_while_running = None
    for row in batch.results(timeout=60):
        if first_while_running is None:
            first_while_running = not batch.status().ended
        seen.append(row["custom_id"])

    assert sorted(seen, key=str) == sorted([f"c{n}" for n in range(6)] + [None], key=str)
    assert first_while_running, "results came only once the batch had ended"
    state = batch.status()
    assert state.status == "completed" and state.request_counts == {
        "total": 7,
        "completed": 6,
        "failed": 1,
    }
    assert state.counts.running == state.counts.queued == 0
    output = list(batch.output())
    assert [r["custom_id"] for r in output] == [f"c{n}" for n in range(6)]
    for row in output:
        turn = client.attach(row["response"]["body"]["id"])
        assert turn.record().request_id == row["custom_id"]
        assert turn.record().reply == row["response"]["body"]["output_text"]
    assert [r["error"]["code"] for r in batch.errors()] == ["invalid_json"]


def test_lines_the_store_cannot_keep_fail_alone_in_the_error_file(
    make_client: ClientFactory, workspace: Path, tmp_path: Path
) -> None:
    client = make_client([ECHO])
    good = lines(["first", "last"])
    first, last = (json.dumps(row).encode() for row in good)
    source = tmp_path / "abusive.jsonl"
    source.write_bytes(b"\n".join([first, *(raw for raw, _code in ABUSIVE.values()), last]))
    deep: dict[str, Any] = {}
    for _ in range(1000):
        deep = {"k": deep}
    given = [
        {"custom_id": "x" * 201, "body": {"input": "hi"}},
        {"custom_id": "a\x00", "body": {"input": "hi"}},
        {"custom_id": "k", "body": {"input": "hi", "metadata": {"k\x00": "v"}}},
        {"custom_id": "s", "body": {"input": "hi", "instructions": "\ud800"}},
        {"custom_id": "d", "body": {"input": "hi", "metadata": deep}},
        {"custom_id": "n", "body": {"input": "hi", "max_output_tokens": 10**5000}},
        {"custom_id": "f", "body": {"input": "hi", "temperature": float("nan")}},
    ]
    bad = [{"method": "POST", "url": "/v1/responses", **row} for row in given]
    for submitted, refused in (
        (source, len(ABUSIVE)),
        ([good[0], *bad, good[1]], len(bad)),
    ):
        batch = client.submit_batch(submitted, root=workspace)
        answered = [row["custom_id"] for row in batch.results(timeout=60) if row["error"] is None]
        state = batch.status()
        assert state.status == "completed", state
        total = refused + 2
        assert state.request_counts == {"total": total, "completed": 2, "failed": refused}
        assert sorted(answered) == ["c0", "c1"]
        errors = list(batch.errors())
        assert len(errors) == refused and all(row["response"] is None for row in errors)
        assert all(row["custom_id"] in (None, "c", "k", "s", "d", "n", "f") for row in errors)
    codes = [row["error"]["code"] for row in batch.errors()]
    assert codes == ["invalid_custom_id", *["invalid_line"] * 6], codes


def test_a_batch_is_reopened_by_its_id_and_cancelled(
    make_client: ClientFactory, workspace: Path, db_url: str
) -> None:
    client = make_client([SLOW, ECHO])
    batch = client.submit_batch(lines([f"slow {n}" for n in range(150)]), root=workspace)
    with parley.connect(db_url, redis_url=_redis_of(client)) as reader:
        assert reader.batch(batch.id).status().request_counts["total"] == 150
    for row in batch.results(timeout=60):
        assert row["error"] is None
        break
    state = batch.cancel()
    assert state.status in ("cancelling", "cancelled")
    for _ in batch.results(timeout=60):
        pass
    ended = batch.status()
    assert ended.status == "cancelled"
    counts = ended.request_counts
    assert counts["completed"] + counts["failed"] == 150 and counts["completed"] >= 1
    assert len(list(batch.output())) == counts["completed"]
    assert len(list(batch.errors())) == counts["failed"]


def test_a_request_id_submits_a_batch_once(make_client: ClientFactory, workspace: Path) -> None:
    client = make_client([ECHO])
    first = client.submit_batch(lines(["a", "b"]), root=workspace, request_id="nightly-1")
    again = client.submit_batch(lines(["a", "b"]), root=workspace, request_id="nightly-1")
    assert again.id == first.id
    assert sum(1 for _ in first.results(timeout=60)) == 2


def test_bad_arguments_are_refused_and_write_nothing(
    make_client: ClientFactory, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tenant is a directory under PARLEY_WORKSPACES (read as the client is made): never
    # a path out of it.
    places = tmp_path / "places"
    monkeypatch.setenv("PARLEY_WORKSPACES", str(places / "workspaces"))
    client = make_client([ECHO])
    before = client.store.table_counts()
    good = lines(["a"])
    calls: list[Callable[[], object]] = [
        lambda: client.submit_batch(b"{}", root=workspace),  # type: ignore[arg-type]
        lambda: client.submit_batch(tmp_path / "missing.jsonl", root=workspace),
        lambda: client.submit_batch([], root=workspace),
        lambda: client.submit_batch(good, root=tmp_path / "nowhere"),
        lambda: client.submit_batch(good, root=workspace, tenant=""),
        lambda: client.submit_batch(good, root=workspace, request_id="x" * 201),
        lambda: client.submit_batch(good, root=workspace, endpoint="/v1/embeddings"),
    ]
    for tenant in ("../..", "..", str(places / "elsewhere"), "a/b", ".hidden", "t" * 65):
        calls.append(partial(client.submit_batch, good, tenant=tenant))
    for call in calls:
        with pytest.raises(InvalidRequest):
            call()
    assert not places.exists() or [p.name for p in places.rglob("*")] == ["workspaces"]
    for unknown in ("batch_0123456789abcdef0123456789abcdef", "nonsense"):
        with pytest.raises(BatchNotFound):
            client.batch(unknown)
    assert client.store.table_counts() == before


def _redis_of(client: parley.Client) -> str | None:
    """The fleet client's Redis URL (None embedded: a reader needs none)."""
    url: str | None = getattr(client.coordinator, "url", None)
    return url if client.fleet else None


def test_a_cancelled_line_queued_in_a_busy_conversation_never_runs(
    make_client: ClientFactory, workspace: Path
) -> None:
    client = make_client([SLOW, ECHO])
    session = client.open_session(workspace)
    busy = session.submit("slow, holding the conversation")
    follow = {"input": "after it", "conversation": session.id}
    batch = client.submit_batch(
        [{"custom_id": "next", "method": "POST", "url": "/v1/responses", "body": follow}]
    )
    batch.cancel()
    [row] = list(batch.results(timeout=60))
    assert row["response"] is None and row["error"]["code"] == "batch_cancelled"
    assert "before this line committed anything" in row["error"]["message"]
    turn = client.attach(row["id"].removeprefix("batch_req_"))
    assert turn.record().status is parley.TurnStatus.CANCELLED
    assert client.store.steps_of(turn.turn_id) == []  # it never called the model
    assert busy.wait(60).outcome is parley.TurnStatus.FINISHED  # the conversation's own turn


def test_a_cancel_ends_a_line_queued_behind_a_turn_that_waits_for_a_person(
    make_client: ClientFactory, workspace: Path
) -> None:
    client = make_client([ASKS, ECHO], policy={"ask_tools": ["record_call"]})
    session = client.open_session(workspace)
    asking = session.submit("ask a person first")
    wait_until(lambda: asking.record().status is parley.TurnStatus.WAITING, timeout=30)
    follow = {"input": "after it", "conversation": session.id}
    batch = client.submit_batch(
        [{"custom_id": "next", "method": "POST", "url": "/v1/responses", "body": follow}]
    )

    batch.cancel()

    # It ends now: the person need not answer the conversation's turn first.
    [row] = list(batch.results(timeout=30))
    assert row["error"]["code"] == "batch_cancelled" and row["response"] is None
    assert batch.status().status == "cancelled"
    assert asking.record().status is parley.TurnStatus.WAITING
    [pending] = asking.approvals()
    asking.approve(pending.approval_id)
    assert asking.wait(60).outcome is parley.TurnStatus.FINISHED
    [ended] = client.store.batch_lines(batch.id, FileKind.BATCH_ERROR, 0, 10)
    assert ended.turn_id is not None
    line = client.attach(ended.turn_id).record()
    assert line.status is parley.TurnStatus.CANCELLED  # never run, after it either


def numbered(count: int, stop: Callable[[int], None]) -> Iterator[dict[str, Any]]:
    """``count`` lines, calling ``stop(n)`` before the ``n``th is read."""
    for n in range(count):
        stop(n)
        yield {
            "custom_id": f"c{n}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"input": "p"},
        }


def made_workspaces(place: Path) -> list[Path]:
    """The lines' workspaces under a tenant's directory (not the test's control files)."""
    return sorted(p for p in place.iterdir() if p.name[0] != ".") if place.exists() else []


def scripted_workspaces(place: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PARLEY_WORKSPACES at ``place`` (set before the client is made, which reads it),
    where tenant ``acme``'s lines find the test's script (beside their workspaces, as
    every test workspace has it)."""
    monkeypatch.setenv("PARLEY_WORKSPACES", str(place))
    Control(place / "acme" / "workspace").script([ECHO])
    return place / "acme"


def test_a_batch_is_written_a_chunk_at_a_time_and_seen_only_whole(
    make_client: ClientFactory, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acme = scripted_workspaces(tmp_path / "workspaces", monkeypatch)
    client = make_client([ECHO])
    monkeypatch.setattr(batch_acceptance, "CHUNK_LINES", 10)
    request = f"chunked-{uuid.uuid4().hex}"
    seen: dict[str, Any] = {}

    def look(n: int) -> None:
        if n != 35:
            return
        # Between two chunks: three are committed, and another writer goes at once.
        with parley.connect(db_url, redis_url=_redis_of(client)) as other:
            seen["acceptance"] = other.store.batch_by_request("acme", request)
            seen["session"] = other.open_session(tmp_path).id
        seen["workspaces"] = len(made_workspaces(acme))

    batch = client.submit_batch(numbered(100, look), tenant="acme", request_id=request)

    acceptance = seen["acceptance"]
    assert isinstance(acceptance, Acceptance) and acceptance.lines == 30, acceptance
    assert acceptance.batch_id == batch.id
    assert seen["workspaces"] == 30  # each made once its session was committed
    assert batch.status().request_counts["total"] == 100
    assert sum(1 for row in batch.results(timeout=60) if row["error"] is None) == 100
    assert len(made_workspaces(acme)) == 100


def test_a_batch_stopped_half_way_or_submitted_again_leaves_no_workspace(
    make_client: ClientFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acme = scripted_workspaces(tmp_path / "workspaces", monkeypatch)
    client = make_client([ECHO])
    monkeypatch.setattr(batch_acceptance, "CHUNK_LINES", 10)
    before = client.store.table_counts()

    def interrupt(n: int) -> None:
        if n == 35:
            raise KeyboardInterrupt  # Ctrl-C while the lines are read

    with pytest.raises(KeyboardInterrupt):
        client.submit_batch(numbered(100, interrupt), tenant="acme", request_id="once")
    assert made_workspaces(acme) == []
    assert client.store.table_counts() == before
    # Its request id is free: the batch is made once, and submitting it again makes
    # neither another batch nor another directory.
    first = client.submit_batch(lines(["a", "b"]), tenant="acme", request_id="once")
    made = made_workspaces(acme)
    again = client.submit_batch(lines(["a", "b"]), tenant="acme", request_id="once")
    assert again.id == first.id and made_workspaces(acme) == made and len(made) == 2
    assert sum(1 for row in first.results(timeout=60) if row["error"] is None) == 2


def test_an_acceptance_whose_process_died_is_dropped_by_a_retry_that_makes_the_batch(
    make_client: ClientFactory, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make_client([ECHO])
    monkeypatch.setattr(batch_acceptance, "STALLED_SECONDS", 0.5)
    request = f"retried-{uuid.uuid4().hex}"
    # What a process killed half-way leaves: a batch row, a chunk and its directory.
    dead = NewBatch(
        batch_id=f"batch_{uuid.uuid4().hex}",
        tenant="acme",
        input_file_id=None,
        output_file_id=f"file-{uuid.uuid4().hex}",
        error_file_id=f"file-{uuid.uuid4().hex}",
        endpoint="/v1/responses",
        completion_window="24h",
        metadata=None,
        request_id=request,
    )
    root = tmp_path / "dead-line"
    root.mkdir()
    session_id = str(uuid.uuid4())
    plan = LinePlan(line=1, custom_id="c0", prompt="p", session_id=session_id, root=str(root))
    assert client.store.open_batch(dead) is None
    client.store.accept_lines(dead.batch_id, "acme", [plan], [])

    batch = client.submit_batch(
        lines(["a", "b", "c"]), root=workspace, tenant="acme", request_id=request
    )

    assert batch.id != dead.batch_id and not root.exists()
    with pytest.raises(parley.errors.SessionNotFound):
        client.session(session_id)
    assert [row["custom_id"] for row in batch.results(timeout=60)].count("c0") == 1
    assert batch.status().request_counts == {"total": 3, "completed": 3, "failed": 0}


def test_a_retry_while_the_batch_is_accepted_waits_for_it_and_makes_no_other(
    make_client: ClientFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make_client([ECHO])
    monkeypatch.setattr(batch_acceptance, "CHUNK_LINES", 10)
    request = f"twice-{uuid.uuid4().hex}"
    go_on = threading.Event()

    def hold(n: int) -> None:
        if n == 35:  # three chunks written, the batch not yet whole
            assert go_on.wait(60)

    first: dict[str, Any] = {}
    submitting = threading.Thread(
        target=lambda: first.update(
            batch=client.submit_batch(numbered(50, hold), root=workspace, request_id=request)
        )
    )
    submitting.start()
    wait_until(lambda: isinstance(client.store.batch_by_request(None, request), Acceptance))
    retried: dict[str, Any] = {}
    retry = threading.Thread(
        target=lambda: retried.update(
            batch=client.submit_batch(lines(["other"]), root=workspace, request_id=request)
        )
    )
    retry.start()
    retry.join(0.5)
    assert retry.is_alive()  # it waits for the acceptance under way
    go_on.set()
    submitting.join(60)
    retry.join(60)

    assert retried["batch"].id == first["batch"].id
    assert retried["batch"].status().request_counts["total"] == 50
    assert sum(1 for row in first["batch"].results(timeout=60) if row["error"] is None) == 50
