"""Batches from Python (docs/batches.md#from-python), on every deployment:
``client.submit_batch`` from a JSONL file's path or parsed lines, ``Batch.results()``
giving each line once as it ends (the first before the batch has), ``client.batch(id)``
from another client, a cancel, a request id that makes the submission idempotent, and
bad arguments refused before anything is written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.errors import BatchNotFound, InvalidRequest
from tests.acceptance.conftest import ClientFactory
from tests.support.deployments import ALL, on_deployments

pytestmark = on_deployments(*ALL)

SLOW: dict[str, Any] = {
    "when": "^slow",
    "steps": [{"text": "".join(f"w{i} " for i in range(10)), "chunk_chars": 3, "delay_ms": 30}],
}
ECHO: dict[str, Any] = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}


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
    make_client: ClientFactory, workspace: Path, tmp_path: Path
) -> None:
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
    ]
    for call in calls:
        with pytest.raises(InvalidRequest):
            call()
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
    body = row["response"]["body"]
    assert row["error"]["code"] == "cancelled" and body["status"] == "cancelled"
    assert body["output"] == []  # it never called the model
    assert client.attach(body["id"]).record().status is parley.TurnStatus.CANCELLED
    assert busy.wait(60).outcome is parley.TurnStatus.FINISHED  # the conversation's own turn
