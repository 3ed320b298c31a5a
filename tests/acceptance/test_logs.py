"""``PARLEY_LOG_FORMAT=json`` (docs/operations.md#logs), with real processes: every line a worker,
the sweeper, a gateway or a command writes to its log is one JSON object, and the lines
about a turn carry its session, turn and run ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.chaos import CHAOS_REDIS_URL
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import REPO, Fleet, flush_redis
from tests.support.gateway import Tenant, make_tokens, start_gateway
from tests.support.helpers import Control

JSON = {"PARLEY_LOG_FORMAT": "json"}
TOOL_THEN_TEXT: list[dict[str, Any]] = [
    {"when": "fail", "steps": [{"text": "unused"}]},
    {"when": ".*", "steps": [{"tool_calls": [{"name": "list_files"}]}, {"text": "listed"}]},
]


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a log, each parsed as one JSON object (any other line fails)."""
    text = path.read_text()
    assert text, f"{path} is empty"
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"{path}:{number} is not JSON: {line!r}")
        assert isinstance(value, dict), f"{path}:{number}: {line!r}"
        assert {"time", "level", "logger", "message", "pid"} <= set(value), line
        found.append(value)
    return found


def assert_named(lines: list[dict[str, Any]], turn: dict[str, Any]) -> list[dict[str, Any]]:
    """Each line whose message mentions the turn, or names its run or session, carries
    all three ids; returns the lines about the turn."""
    ids = {"session_id": turn["session_id"], "turn_id": turn["turn_id"], "run_id": turn["run_id"]}
    about = [
        line
        for line in lines
        if turn["turn_id"] in line["message"] or line.get("turn_id") == turn["turn_id"]
    ]
    for line in about:
        assert {name: line.get(name) for name in ids} == ids, line
    for line in lines:
        if turn["session_id"] in line["message"]:
            assert line.get("session_id") == turn["session_id"], line
    return about


LOUD_HOST = """
from tests.support.hosts import workspace_host


class Loud:
    def on_terminal(self, outcome):
        print(f"the host saw turn {outcome.turn_id} end: {outcome.outcome}")


host = workspace_host(hooks=Loud())
"""


def gateway_turn(tenant: Tenant, prompt: str) -> dict[str, Any]:
    session = tenant.new_session(workspace="workspace")
    submitted = tenant.submit(session["id"], prompt)
    turn = tenant.result(submitted["turn_id"])
    return {**turn, "session_id": session["id"]}


@pytest.mark.postgres
@pytest.mark.slow
def test_a_fleet_in_json_logs_one_object_per_line_naming_each_turn(tmp_path: Path) -> None:
    with fresh_postgres_database("logs") as url:
        flush_redis(CHAOS_REDIS_URL)
        # A host that prints, as host code may: in JSON that too is a line naming its turn.
        (tmp_path / "loud_host.py").write_text(LOUD_HOST)
        fleet = Fleet(
            database_url=url,
            redis_url=CHAOS_REDIS_URL,
            host="loud_host:host",
            environment={**JSON, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])},
        )
        worker = fleet.start_worker()  # prefork: the turns run in forked pool processes
        beat = fleet.start_beat()
        gateway_env = {k: v for k, v in fleet.env().items() if k != "PARLEY_HOST"}
        gateway = start_gateway(gateway_env, tmp_path / "gw", tokens=make_tokens(["acme"]))
        try:
            fleet.wait_ready()
            tenant = gateway.tenant("acme")
            tenant.control.script(TOOL_THEN_TEXT)
            listed = gateway_turn(tenant, "list the files")
            assert (listed["status"], listed["reply"]) == ("finished", "listed")
            tenant.control.fail_model("the provider is down")
            failed = gateway_turn(tenant, "fail")
            assert failed["status"] == "failed"
        finally:
            gateway.stop()
            fleet.stop()  # the shutdown's own lines are JSON too

    worker_lines = json_lines(fleet.log_of(worker))
    for turn, outcome in ((listed, "finished"), (failed, "failed")):
        messages = [line["message"] for line in assert_named(worker_lines, turn)]
        assert f"running turn {turn['turn_id']} (attempt 1)" in messages
        assert f"turn {turn['turn_id']} ended: {outcome}" in messages
        printed = [line for line in worker_lines if line["logger"] == "celery.redirected"]
        assert f"the host saw turn {turn['turn_id']} end: {outcome}" in [
            line["message"] for line in printed if line.get("turn_id") == turn["turn_id"]
        ]
    [model_failed] = [line for line in worker_lines if "model failed" in line["message"]]
    assert model_failed["turn_id"] == failed["turn_id"] and model_failed["level"] == "WARNING"
    assert "RuntimeError: the provider is down" in model_failed["exception"]
    # Celery's own lines, in the worker's main process and its pool's, are JSON too.
    loggers = {line["logger"] for line in worker_lines}
    assert {"celery.apps.worker", "parley.driver", "parley.tasks"} <= loggers
    assert len({line["pid"] for line in worker_lines}) > 1
    assert any(line["message"].endswith(" ready.") for line in worker_lines)

    assert any("sweeping every" in line["message"] for line in json_lines(fleet.log_of(beat)))

    gateway_lines = json_lines(gateway.stderr)
    for turn in (listed, failed):
        about = assert_named(gateway_lines, turn)
        submission = f"POST /v1/sessions/{turn['session_id']}/turns 202"
        # The submission's line names the turn it made, though its path cannot.
        assert any(line["message"].startswith(submission) for line in about), about
        assert any(f"/v1/turns/{turn['turn_id']}/result 200" in line["message"] for line in about)


def test_an_embedded_gateway_in_json_names_the_turns_it_runs(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")},
        **JSON,
        "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'parley.db'}",
        "PARLEY_HOST": "tests.support.hosts:workspace_host",
        "PYTHONPATH": str(REPO),
    }
    gateway = start_gateway(env, tmp_path / "gw", tokens=make_tokens(["acme"]))
    try:
        tenant = gateway.tenant("acme")
        tenant.control.script(TOOL_THEN_TEXT)
        turn = gateway_turn(tenant, "list the files")
        assert turn["reply"] == "listed"
        missing = tenant.http.get("/v1/turns/00000000-0000-0000-0000-000000000000")
        assert missing.status_code == 404
    finally:
        gateway.stop()
    lines = json_lines(gateway.stderr)
    messages = [line["message"] for line in assert_named(lines, turn)]
    # This process ran the turn: its driver's lines are here, beside the requests'.
    assert f"turn {turn['turn_id']} ended: finished" in messages
    assert any(line["logger"] == "uvicorn.error" for line in lines)
    [unknown] = [line for line in lines if "/v1/turns/00000000" in line["message"]]
    assert "turn_id" not in unknown  # a turn nobody found is named by no id


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_path_cannot_forge_a_gateway_line_or_reach_the_terminal(
    tmp_path: Path, log_format: str
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")},
        "PARLEY_LOG_FORMAT": log_format,
        "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'parley.db'}",
        "PARLEY_HOST": "tests.support.hosts:workspace_host",
        "PYTHONPATH": str(REPO),
    }
    gateway = start_gateway(env, tmp_path / "gw", tokens=make_tokens(["acme"]))
    try:
        # No token: anyone who can reach the gateway can send this.
        forged = "/v1/x%0a2026-01-01 00:00:00,000 parley.gateway.access GET /v1/admin 200%0d%1b[2J"
        answer = httpx.get(gateway.url + forged.replace(" ", "%20"), timeout=30)
        assert answer.status_code == 401  # (the token is asked for before the route)
    finally:
        gateway.stop()
    log = gateway.stderr.read_text()
    assert "\x1b" not in log and "\r" not in log
    escaped = "/v1/x\\n2026-01-01 00:00:00,000 parley.gateway.access GET /v1/admin 200\\r\\x1b[2J"
    if log_format == "json":
        lines = [line["message"] for line in json_lines(gateway.stderr)]
    else:
        lines = log.splitlines()
    [access] = [line for line in lines if "/v1/x" in line]
    assert f"GET {escaped} 401" in access
    assert not any("/v1/admin" in line and line is not access for line in lines)


def test_a_command_in_json_logs_its_warnings_as_json_naming_the_turn(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    Control(workspace).fail_model("the provider is down")
    env = {
        **os.environ,
        **JSON,
        "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}",
        "PARLEY_HOST": "tests.support.hosts:workspace_host",
        "PYTHONPATH": str(REPO),
    }
    session_id = parley_command(["new", str(workspace)], env).stdout.strip()
    run = parley_command(["submit", session_id, "hello"], env)
    assert run.returncode == 1  # the turn failed; what it printed is text, as ever
    assert "failed" in run.stdout and "model failed: RuntimeError" in run.stdout
    turn_id = run.stdout.strip().splitlines()[-1].split()[-1]
    (tmp_path / "stderr.log").write_text(run.stderr)
    [line] = json_lines(tmp_path / "stderr.log")
    assert line["level"] == "WARNING" and line["message"].startswith("model failed on turn")
    assert (line["session_id"], line["turn_id"]) == (session_id, turn_id)
    assert line["run_id"] and "RuntimeError: the provider is down" in line["exception"]


def test_an_unknown_log_format_stops_every_process_before_it_starts(tmp_path: Path) -> None:
    database = tmp_path / "never.db"
    env = {
        **os.environ,
        "PARLEY_LOG_FORMAT": "yaml",
        "PARLEY_DATABASE_URL": f"sqlite:///{database}",
    }
    refusal = "InvalidRequest: PARLEY_LOG_FORMAT must be text or json, not 'yaml'\n"
    for argv in (["worker"], ["beat"], ["gateway", "--bind", "127.0.0.1:0"], ["demo"]):
        run = parley_command(argv, env)
        assert (run.returncode, run.stdout, run.stderr) == (2, "", refusal), argv
    assert not database.exists()


def parley_command(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parley", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
        check=False,
    )
