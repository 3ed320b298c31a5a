"""A malformed variable stops each process as it starts, on one line naming it, before
anything runs: the command line, the gateway, the worker and the sweeper, and
``parley.connect()`` (docs/reference.md#configuration)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import parley
from parley.errors import InvalidRequest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parley", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["gateway", "--bind", "127.0.0.1:{port}"],
        ["worker"],
        ["beat"],
        ["status"],
        ["new", "."],
        ["migrate"],
    ],
    ids=["gateway", "worker", "beat", "status", "new", "migrate"],
)
def test_a_bad_value_stops_the_command_on_one_line_naming_it(
    argv: list[str], tmp_path: Path
) -> None:
    port = free_port()
    database = tmp_path / "never.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    env.update(
        PARLEY_DATABASE_URL=f"sqlite:///{database}",
        PARLEY_REDIS_URL="redis://127.0.0.1:9/0",
        PARLEY_WORKSPACES=str(tmp_path / "workspaces"),
        PARLEY_SWEEP_SECONDS="abc",
    )
    ran = run([a.format(port=port) for a in argv], env, tmp_path)
    assert ran.returncode == 2, (ran.stdout, ran.stderr)
    assert ran.stderr.splitlines() == [
        "InvalidRequest: PARLEY_SWEEP_SECONDS must be a positive number of seconds, not 'abc'"
    ]
    assert ran.stdout == ""
    # Nothing ran: no database made, no workspace, no local token, nothing listening.
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_connect_refuses_a_bad_value_before_it_opens_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARLEY_BATCH_WINDOW", "lots")
    database = tmp_path / "never.db"
    with pytest.raises(InvalidRequest, match=r"^PARLEY_BATCH_WINDOW must be"):
        parley.connect(f"sqlite:///{database}")
    assert not database.exists()


def test_a_variable_set_before_a_client_is_made_is_the_one_it_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read as each client is made: one made after a change sees it."""
    first = parley.connect(f"sqlite:///{tmp_path / 'a.db'}")
    monkeypatch.setenv("PARLEY_BATCH_WINDOW", "3")
    second = parley.connect(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        assert (first.runtime.settings.batch_window, second.runtime.settings.batch_window) == (
            64,
            3,
        )
    finally:
        first.close()
        second.close()
