"""``parley batch`` (docs/batches.md#on-the-command-line) as a user runs it: ``submit``
prints the batch's id as its first line and, embedded, runs the lines to the end;
``status``, ``results -o`` and ``cancel``; ``list``, newest first; the file it read is
the batch's input file, which the gateway serves; a bad file refused with exit status 2
and nothing written; on a real terminal (tmux) a progress bar that counts the lines
done and ends with the batch; and what the command line makes embedded (a batch, its
sessions, a session of ``new`` or ``chat``) belongs to the tenant ``local``, the page's,
while on a fleet it has none, as before."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

import parley
from parley.gateway.settings import LOCAL_TENANT
from tests.support.abusive_lines import ABUSIVE
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import REDIS_TEST_URL
from tests.support.gateway import start_gateway
from tests.support.terminal import Terminal

PARLEY = str(Path(sys.executable).parent / "parley")
SCRIPT = {"rules": [{"when": ".", "steps": [{"text": "ok: {last_message}"}]}]}
SLOW = {
    "rules": [{"when": ".", "steps": [{"text": "a b c d e f", "chunk_chars": 2, "delay_ms": 60}]}]
}


def write_lines(path: Path, count: int, *, broken: bool = False) -> Path:
    rows = [
        json.dumps(
            {
                "custom_id": f"l{n}",
                "method": "POST",
                "url": "/v1/responses",
                "body": {"input": f"line {n}"},
            }
        )
        for n in range(count)
    ]
    if broken:
        rows.append("{broken")
    path.write_text("\n".join(rows) + "\n")
    return path


def run(
    tmp_path: Path, *argv: str, db: str | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.json"
    if not script.exists():
        script.write_text(json.dumps(SCRIPT))
    db = db or f"sqlite:///{tmp_path / 'cli.db'}"
    return subprocess.run(
        [PARLEY, "--db", db, "--host", f"scripted:{script}", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        input=stdin,
        env={**os.environ, "PARLEY_WORKSPACES": str(tmp_path / "workspaces")},
    )


def test_submit_prints_the_id_first_and_runs_the_batch_to_its_end(tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.jsonl", 5, broken=True)
    submitted = run(tmp_path, "batch", "submit", str(source), "--root", str(tmp_path))
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.splitlines()[0]
    assert re.fullmatch(r"batch_[0-9a-f]{32}", batch_id), submitted.stdout
    assert "completed: 5 completed, 1 failed, of 6" in submitted.stderr

    status = run(tmp_path, "batch", "status", batch_id)
    assert status.returncode == 0 and "completed" in status.stdout
    as_json: dict[str, Any] = json.loads(
        run(tmp_path, "batch", "status", "--json", batch_id).stdout
    )
    assert as_json["request_counts"] == {"total": 6, "completed": 5, "failed": 1}

    out = tmp_path / "out.jsonl"
    results = run(tmp_path, "batch", "results", batch_id, "-o", str(out))
    assert results.returncode == 0, results.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(str(r["custom_id"]) for r in rows) == sorted(
        [f"l{n}" for n in range(5)] + ["None"]
    )
    answered = {r["custom_id"]: r["response"]["body"]["output_text"] for r in rows if r["response"]}
    assert answered["l3"] == "ok: line 3"
    cancelled = run(tmp_path, "batch", "cancel", batch_id)
    assert cancelled.returncode == 0 and "completed" in cancelled.stdout  # (it had ended)


def test_a_bad_file_or_id_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    missing = run(tmp_path, "batch", "submit", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "no file" in missing.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    refused = run(tmp_path, "batch", "submit", str(empty), "--root", str(tmp_path))
    assert refused.returncode == 2 and "no lines" in refused.stderr
    unknown = run(tmp_path, "batch", "status", "batch_0123456789abcdef0123456789abcdef")
    assert unknown.returncode == 2 and "no batch" in unknown.stderr
    lines = write_lines(tmp_path / "lines.jsonl", 2)
    for bad in (["--tenant", "t" * 65], ["--root", str(tmp_path / "nowhere")]):
        refused = run(tmp_path, "batch", "submit", str(lines), *bad)
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    for tenant in ("../..", str(tmp_path / "elsewhere")):
        outside = run(tmp_path, "batch", "submit", str(lines), "--tenant", tenant)
        assert outside.returncode == 2, outside.stderr
        assert outside.stderr.count("\n") == 1 and "tenant" in outside.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cli.db",
        "empty.jsonl",
        "lines.jsonl",
        "script.json",
    ]
    with parley.connect(f"sqlite:///{tmp_path / 'cli.db'}") as client:
        counts = client.store.table_counts()
    assert counts["batches"] == 0 and counts["files"] == 0  # not even the upload


def test_lines_the_store_cannot_keep_are_in_the_error_file_not_a_traceback(
    tmp_path: Path,
) -> None:
    source = write_lines(tmp_path / "abusive.jsonl", 1)
    source.write_bytes(source.read_bytes() + b"\n".join(raw for raw, _ in ABUSIVE.values()))
    submitted = run(tmp_path, "batch", "submit", str(source), "--root", str(tmp_path))
    assert "Traceback" not in submitted.stderr, submitted.stderr
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.splitlines()[0]
    results = run(tmp_path, "batch", "results", batch_id)
    assert results.returncode == 0, results.stderr
    rows = [json.loads(row) for row in results.stdout.splitlines()]
    assert [row["custom_id"] for row in rows if row["error"] is None] == ["l0"]
    codes = sorted(row["error"]["code"] for row in rows if row["error"] is not None)
    assert codes == sorted(code for _, code in ABUSIVE.values())


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_terminal_shows_a_progress_bar_that_ends_with_the_batch(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SLOW))
    source = write_lines(tmp_path / "in.jsonl", 40)
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    command = [PARLEY, "--db", db, "--host", f"scripted:{script}", "batch", "submit"]
    term = Terminal(
        f"parley-test-{uuid.uuid4().hex[:8]}", [*command, str(source), "--root", str(tmp_path)],
        tmp_path, env={"PARLEY_BATCH_WINDOW": "4"},
    )  # fmt: skip
    terminals.append(term)

    first = term.wait_for(r"batch_[0-9a-f]{32}")
    assert first.strip().splitlines()[0].startswith("batch_")
    # Mid-way: some lines done, some running, the rate and the bar's count.
    mid = term.wait_for(r"done [1-9]\d* · failed 0 · running [1-4] · waiting for capacity 0")
    assert re.search(r"\d+/40", mid) and "lines/s" in mid
    end = term.wait_for(r"\[exited\]", timeout=60)
    assert "40/40" in end and "done 40 · failed 0 · running 0" in end
    assert "completed: 40 completed, 0 failed, of 40" in end


def test_embedded_work_belongs_to_the_local_tenant_and_on_a_fleet_to_none(tmp_path: Path) -> None:
    new = run(tmp_path, "new", str(tmp_path))
    assert new.returncode == 0, new.stderr
    chat = run(tmp_path, "chat", "--root", str(tmp_path), stdin="hello\n")
    assert chat.returncode == 0 and "ok: hello" in chat.stdout, chat.stderr
    source = write_lines(tmp_path / "in.jsonl", 2)
    submitted = run(tmp_path, "batch", "submit", str(source))
    assert submitted.returncode == 0, submitted.stderr
    named = run(tmp_path, "batch", "submit", str(source), "--tenant", "acme")
    assert named.returncode == 0, named.stderr

    with parley.connect(f"sqlite:///{tmp_path / 'cli.db'}") as client:
        local = client.store.list_sessions(tenant=LOCAL_TENANT, limit=10)
        conversations = client.store.list_sessions(
            tenant=LOCAL_TENANT, limit=10, batch_sessions=False
        )
        batch = client.store.get_batch(submitted.stdout.splitlines()[0])
        other = client.store.get_batch(named.stdout.splitlines()[0])
        acme = client.store.list_sessions(tenant="acme", limit=10)
    assert len(local) == 4  # new's, chat's, and the batch's two
    assert new.stdout.strip() in {s.session_id for s in conversations}
    assert len(conversations) == 2
    assert batch.tenant == LOCAL_TENANT and other.tenant == "acme"
    assert {s.batch_id for s in local} == {batch.batch_id, None}
    assert len(acme) == 2 and {s.batch_id for s in acme} == {other.batch_id}
    # The lines' workspaces are where the gateway makes the tenant's.
    for session in local:
        if session.batch_id is not None:
            assert Path(session.root).parent == tmp_path / "workspaces" / LOCAL_TENANT

    with fresh_postgres_database("cli_tenant") as url:
        fleet = {**os.environ, "PARLEY_REDIS_URL": REDIS_TEST_URL}
        made = subprocess.run(
            [PARLEY, "--db", url, "new", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            env=fleet,
        )
        assert made.returncode == 0, made.stderr
        with parley.connect(url, redis_url=REDIS_TEST_URL) as client:
            assert client.fleet
            assert client.session(made.stdout.strip()).tenant is None


def test_list_shows_the_batches_newest_first_with_their_status_and_counts(tmp_path: Path) -> None:
    smaller = write_lines(tmp_path / "a.jsonl", 2)
    larger = write_lines(tmp_path / "b.jsonl", 3, broken=True)
    first = run(tmp_path, "batch", "submit", str(smaller), "--root", str(tmp_path))
    second = run(tmp_path, "batch", "submit", str(larger), "--root", str(tmp_path),
                 "--tenant", "acme").stdout.splitlines()[0]  # fmt: skip
    listed = run(tmp_path, "batch", "list")
    assert listed.returncode == 0, listed.stderr
    newest, oldest = listed.stdout.splitlines()
    first_id = first.stdout.splitlines()[0]
    assert newest.startswith(f"{second}  completed")
    assert oldest.startswith(f"{first_id}  completed")
    assert "3 completed, 1 failed, of 4" in newest and newest.endswith("tenant acme")
    # (Embedded, a batch submitted without --tenant is the page's: the tenant local.)
    assert "2 completed, 0 failed, of 2" in oldest and oldest.endswith("tenant local")

    as_json: dict[str, Any] = json.loads(run(tmp_path, "batch", "list", "--json").stdout)
    assert [b["id"] for b in as_json["data"]] == [second, first_id]
    assert as_json["first_id"] == second and as_json["has_more"] is False
    assert all(b["input_file_id"].startswith("file-") for b in as_json["data"])
    one = run(tmp_path, "batch", "list", "--limit", "1")
    assert one.stdout.splitlines() == [newest] and f"--after {second}" in one.stderr
    after = run(tmp_path, "batch", "list", "--after", second)
    assert after.stdout.splitlines() == [oldest]
    acme = run(tmp_path, "batch", "list", "--tenant", "acme", "--json").stdout
    assert [b["id"] for b in json.loads(acme)["data"]] == [second]
    for bad in (["--limit", "0"], ["--after", "batch_" + "0" * 32]):
        refused = run(tmp_path, "batch", "list", *bad)
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr


def test_the_file_a_batch_was_submitted_from_is_its_input_file_which_the_gateway_serves(
    tmp_path: Path,
) -> None:
    source = write_lines(tmp_path / "tickets.jsonl", 3)
    args = ("batch", "submit", str(source), "--root", str(tmp_path), "--tenant", "acme")
    batch_id = run(tmp_path, *args, "--request-id", "job-1").stdout.splitlines()[0]
    again = run(tmp_path, *args, "--request-id", "job-1")
    assert again.stdout.splitlines()[0] == batch_id  # the same batch, and no second upload
    status: dict[str, Any] = json.loads(run(tmp_path, "batch", "status", "--json", batch_id).stdout)
    input_file_id = status["input_file_id"]
    assert re.fullmatch(r"file-[0-9a-f]{32}", input_file_id)
    with parley.connect(f"sqlite:///{tmp_path / 'cli.db'}") as client:
        assert client.store.table_counts()["files"] == 3  # input, output, errors

    env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    env["PARLEY_DATABASE_URL"] = f"sqlite:///{tmp_path / 'cli.db'}"
    gateway = start_gateway(env, tmp_path / "gateway", tokens={"acme": "tok-acme-0123456789abcdef"})
    try:
        api = OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.token)
        batch = api.batches.retrieve(batch_id)
        assert batch.input_file_id == input_file_id
        upload = api.files.retrieve(input_file_id)
        assert (upload.filename, upload.purpose, upload.bytes) == (
            "tickets.jsonl",
            "batch",
            source.stat().st_size,
        )
        assert api.files.content(input_file_id).content == source.read_bytes()
    finally:
        gateway.stop()
