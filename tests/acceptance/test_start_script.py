"""``scripts/setup.sh`` and ``scripts/start.sh`` as a newcomer runs them, in a copy of the
repo's scripts and ``pyproject.toml``: setup installs only when what it installs from
changed, and start prints the page's URL last and says in one line how to choose
another port when its own is in use.

The copy's ``.venv/bin/python`` records what it is asked to do instead of installing
(a real install takes a minute and the package index): what is checked is which
installs the scripts ask for.  Its ``.venv/bin/parley`` is the repo's, run for real."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.support.gateway import URL_LINE

REPO = Path(__file__).resolve().parents[2]
RECORDING_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../installs.log"
exit "${PARLEY_TEST_INSTALL_STATUS:-0}"
"""


def clone(directory: Path) -> Path:
    """The scripts and ``pyproject.toml`` in ``directory``, with a ``.venv`` whose
    python records its installs and whose ``parley`` is the repo's."""
    (directory / "scripts").mkdir(parents=True)
    for name in ("setup.sh", "start.sh"):
        shutil.copy2(REPO / "scripts" / name, directory / "scripts" / name)
    shutil.copy2(REPO / "pyproject.toml", directory / "pyproject.toml")
    bin_directory = directory / ".venv" / "bin"
    bin_directory.mkdir(parents=True)
    python = bin_directory / "python"
    python.write_text(RECORDING_PYTHON)
    python.chmod(0o755)
    (bin_directory / "parley").symlink_to(REPO / ".venv" / "bin" / "parley")
    return directory


def environment(**extra: str) -> dict[str, str]:
    """This process's environment less parley's variables, as a newcomer's shell."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    return {**base, **extra}


def setup(directory: Path, *arguments: str, **extra: str) -> tuple[int, list[str]]:
    """Run the copy's setup.sh: its exit status and the installs it asked for."""
    log = directory / ".venv" / "installs.log"
    before = log.read_text().splitlines() if log.exists() else []
    done = subprocess.run(
        [str(directory / "scripts" / "setup.sh"), *arguments],
        env=environment(**extra),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    after = log.read_text().splitlines() if log.exists() else []
    return done.returncode, after[len(before) :]


def test_setup_installs_only_when_what_it_installs_from_changed(tmp_path: Path) -> None:
    directory = clone(tmp_path)
    status, installs = setup(directory)
    assert status == 0
    assert installs == ["-m pip install --quiet --upgrade pip", "-m pip install --quiet -e ."]
    assert setup(directory) == (0, [])  # the second start installs nothing
    # The dev tools are more than a runtime install has; a dev install holds the runtime.
    assert setup(directory, "dev")[1][-1] == "-m pip install --quiet -e .[dev]"
    assert setup(directory, "dev") == (0, [])
    assert setup(directory) == (0, [])
    # A change to what it installs from installs again.
    pyproject = directory / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"rich>=13",', '"rich>=13.1",'))
    assert setup(directory)[1][-1] == "-m pip install --quiet -e ."
    assert setup(directory) == (0, [])
    # An install that failed is tried again at the next start.
    pyproject.write_text(pyproject.read_text() + "\n")
    status, installs = setup(directory, PARLEY_TEST_INSTALL_STATUS="1")
    assert status != 0 and installs
    assert setup(directory)[1][-1] == "-m pip install --quiet -e ."


def started(start: str, out: Path, *arguments: str) -> tuple[subprocess.Popen[bytes], str]:
    """``start.sh ARGUMENTS`` running, and the URL it printed last."""
    with out.open("wb") as stdout:
        process = subprocess.Popen(
            [start, *arguments],
            env=environment(),
            stdout=stdout,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while not (lines := out.read_text().splitlines()) or not lines[-1].startswith(URL_LINE):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise AssertionError(out.read_text())
        time.sleep(0.05)
    return process, lines[-1].removeprefix(URL_LINE)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the gateway (start.sh execs it), then wait."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    process.wait(15)


def test_start_prints_the_url_last_and_a_port_in_use_in_one_line(tmp_path: Path) -> None:
    directory = clone(tmp_path)
    start = str(directory / "scripts" / "start.sh")
    first, url = started(start, directory / "start.out", "--bind", "127.0.0.1:0")
    try:
        assert url.startswith("http://127.0.0.1:") and "?token=" in url
        port = url.removeprefix("http://127.0.0.1:").split("/", 1)[0]
        # The port is held by the first gateway: a second start says how to choose another.
        for arguments, extra in (
            (["--bind", f"127.0.0.1:{port}"], {}),
            ([], {"PORT": port}),
        ):
            second = subprocess.run(
                [start, *arguments],
                env=environment(**extra),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert second.returncode == 2, second.stdout + second.stderr
            assert second.stdout == ""
            [line] = second.stderr.splitlines()
            assert f"127.0.0.1:{port} is in use" in line
            assert "--bind 127.0.0.1:" in line and "PORT=" in line
    finally:
        stop(first)

    # start.sh passes --new-token on: the page's token changes, and is kept from then on.
    renewed, renewed_url = started(
        start, directory / "start.out", "--new-token", "--bind", "127.0.0.1:0"
    )
    stop(renewed)
    token = url.split("?token=", 1)[1]
    new = renewed_url.split("?token=", 1)[1]
    assert new != token
    assert (directory / "workspaces" / ".local-token").read_text().strip() == new
    # Installed once, by the first start.
    installs = (directory / ".venv" / "installs.log").read_text().splitlines()
    assert installs == ["-m pip install --quiet --upgrade pip", "-m pip install --quiet -e ."]
