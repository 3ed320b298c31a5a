"""Every code block of the README, CONTRIBUTING.md and docs/ that is meant to be run is
run here, as written, as a new user would run it (the convention is CONTRIBUTING.md's
"The docs test"): ``python`` blocks in a fresh temporary directory with the repo's
``.venv``, ``sh`` blocks from the repo against a database of their own, which they
create, and the test Redis database.  A block preceded by ``<!-- not run: why -->`` is
not run; blocks in other languages (``text``) never are.  A block preceded by
``<!-- beside scripts/start.sh -->`` runs as a user runs it in a second terminal while
``scripts/start.sh`` serves: in the directory of a gateway started as that script starts
it (on 127.0.0.1:8000, its ``parley.db`` and ``workspaces/`` there, with the repo's
``.venv`` linked), without parley's variables."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.support.databases import PG_ADMIN_URL
from tests.support.fleet import REDIS_TEST_URL

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
DOCUMENTS = [
    REPO / "README.md",
    REPO / "CONTRIBUTING.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "examples").glob("*/README.md")),
]
PROCFILE_PAGE = REPO / "docs" / "operations.md"  # the Procfile and honcho
RUN = ("python", "sh")
NOT_RUN = re.compile(r"<!-- not run: (?P<why>\S.*?) -->")
BESIDE_START = "<!-- beside scripts/start.sh -->"
START_URL = "http://127.0.0.1:8000"  # where scripts/start.sh serves
FENCE = "```"


@dataclass(frozen=True)
class Block:
    """One fenced code block of a document."""

    path: Path
    line: int  # the opening fence's, from 1
    language: str
    text: str
    not_run: str | None  # the reason, if marked not to run
    beside_start: bool = False  # runs beside scripts/start.sh's gateway

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of ``path``, each with the not-run mark just above it, if any."""
    lines = path.read_text().splitlines()
    found = []
    index = 0
    while index < len(lines):
        if not lines[index].startswith(FENCE):
            index += 1
            continue
        end = next((j for j in range(index + 1, len(lines)) if lines[j] == FENCE), None)
        assert end is not None, f"{path.name}:{index + 1}: a fence that is never closed"
        above = next((lines[k] for k in range(index - 1, -1, -1) if lines[k].strip()), "")
        mark = NOT_RUN.fullmatch(above)
        found.append(
            Block(
                path=path,
                line=index + 1,
                language=lines[index][len(FENCE) :].strip(),
                text="\n".join(lines[index + 1 : end]) + "\n",
                not_run=mark["why"] if mark else None,
                beside_start=above == BESIDE_START,
            )
        )
        index = end + 1
    return found


BLOCKS = [block for path in DOCUMENTS for block in blocks_of(path)]
RUNNABLE = [b for b in BLOCKS if b.language in RUN and b.not_run is None]

EXPECTED = [
    # (document, a line of the block, what its output must contain)
    ("README.md", "session = client.open_session(root=str(root))", "finished It retries 502"),
    ("README.md", "session = client.open_session(root=str(root))", "finished Heard: "),
    ("README.md", ".venv/bin/parley beat &", "heard: hello"),
    ("README.md", "parley gateway --bind 127.0.0.1:8321", "event: end"),
    ("transcript.md", "def to_host", "['user', 'agent', 'tool_result', 'agent']"),
    ("README.md", "from examples.audited_host.host import build_host", "That is who you are."),
    ("README.md", "parley gateway --bind 127.0.0.1:8321", "You said: hello\n"),
    ("README.md", "from examples.plan_then_act.host import host", "reply: retry.py backs off"),
    ("operations.md", "PARLEY_LOG_FORMAT=json", '"message":"running turn '),
    (
        "batches.md",
        "api.batches.create(",
        "completed BatchRequestCounts(completed=2, failed=1, total=3)",
    ),
    (
        "README.md",
        "parley batch submit lines.jsonl",
        '"custom_id":"b","response":{"status_code":200',
    ),
    ("batches.md", "api.batches.create(", '"custom_id":"ticket-1","response":{"status_code":200'),
    ("batches.md", "api.batches.create(", '"custom_id":"ticket-3","response":null,"error":{"code"'),
    (
        "batches.md",
        "parley batch submit tickets.jsonl",
        '"custom_id":"t1","response":{"status_code":200',
    ),
    (
        "batches.md",
        "parley batch submit tickets.jsonl",
        '"custom_id":"t2","response":null,"error":{"code"',
    ),
    ("batches.md", "parley batch submit tickets.jsonl", "1 completed, 1 failed, of 2"),
    ("operations.md", "--prompt-file", "(attempt 1)\n"),
    ("operations.md", "--prompt-file", "You said: Review the Procfile:\n"),
    ("operations.md", "--prompt-file", "TurnEnded: the turn has ended (finished)"),
    ("operations.md", "--prompt-file", "exit status 2"),
    ("operations.md", "PARLEY_METRICS_PORT=127.0.0.1:9101", 'ended_total{outcome="finished"} 1.0'),
    ("operations.md", "PARLEY_METRICS_PORT=127.0.0.1:9101", "turns: 0 queued, 0 running, 0 wait"),
    ("operations.md", "PARLEY_METRICS_PORT=127.0.0.1:9101", "workers: 1 live: "),
]


def expected_output(block: Block) -> list[str]:
    return [out for name, line, out in EXPECTED if block.path.name == name and line in block.text]


def test_every_block_names_its_language_and_each_mark_a_block_to_skip() -> None:
    for block in BLOCKS:
        assert block.language, f"{block.where}: name the block's language (text if not code)"
        if block.not_run is not None:
            assert block.language in RUN, f"{block.where}: a {block.language} block never runs"
    marks = [
        f"{path.name}:{number}"
        for path in DOCUMENTS
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.startswith("<!-- not run")
    ]
    skipped = [b for b in BLOCKS if b.not_run is not None]
    assert len(marks) == len(skipped), f"a mark with no python or sh block below it: {marks}"
    # What the README promises runs: its taste and its fleet.
    assert {b.language for b in RUNNABLE if b.path.name == "README.md"} == set(RUN)
    for name, line, out in EXPECTED:
        assert any(out in expected_output(b) for b in RUNNABLE), (name, line)


def clean_environment() -> dict[str, str]:
    """This process's environment less parley's variables (the tests' own kept)."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PARLEY_") or key.startswith("PARLEY_TEST_")
    }


@pytest.mark.parametrize(
    "block",
    [b for b in RUNNABLE if b.language == "python" and not b.beside_start],
    ids=lambda b: b.where,
)
def test_python_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    assert VENV_PYTHON.exists(), "scripts/setup.sh dev makes .venv"
    (tmp_path / "block.py").write_text(block.text)
    run = subprocess.run(
        [str(VENV_PYTHON), "block.py"],
        cwd=tmp_path,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert run.returncode == 0, f"{block.where}\n{run.stdout}\n{run.stderr}"
    for out in expected_output(block):
        assert out in run.stdout, f"{block.where}: {out!r} not in\n{run.stdout}"


@contextmanager
def database_to_create() -> Iterator[str]:
    """The URL of a database that does not exist yet, dropped after if it came to."""
    name = f"parley_docs_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    base = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def live_members(group: int) -> list[int]:
    """The processes of process group ``group`` that have not exited (Linux's /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError):
            # pid (comm) state ppid pgrp …; comm may hold spaces and parentheses.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == group and fields[0] != "Z":
                members.append(int(stat.parent.name))
    return members


def stop_group(group: int) -> None:
    """SIGTERM to every process left in ``group``, then SIGKILL to what remains."""
    for sig, patience in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        with suppress(ProcessLookupError):
            os.killpg(group, sig)
        deadline = time.monotonic() + patience
        while live_members(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not live_members(group):
            return


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize(
    "block",
    [b for b in RUNNABLE if b.language == "sh" and not b.beside_start],
    ids=lambda b: b.where,
)
def test_sh_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    with database_to_create() as database_url, log.open("wb") as out:
        env = {
            **clean_environment(),
            "PARLEY_DATABASE_URL": database_url,
            "PARLEY_REDIS_URL": REDIS_TEST_URL,
            "PARLEY_QUEUE": f"parley.docs.{uuid.uuid4().hex[:8]}",
        }
        # The block's background processes keep its output open: it goes to a file.
        shell = subprocess.Popen(
            ["bash", "-e", "-c", block.text],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode = shell.wait(timeout=90)
        finally:
            stop_group(shell.pid)  # what the block left running, in the shell's group
            shell.wait(5)
    output = log.read_text(errors="replace")
    assert returncode == 0, f"{block.where}\n{output}"
    for expected in expected_output(block):
        assert expected in output, f"{block.where}: {expected!r} not in\n{output}"


@pytest.fixture(scope="module")
def start_sh_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A gateway started as ``scripts/start.sh`` starts it (``parley gateway``: embedded,
    the offline agent, a local token kept in ``workspaces/.local-token``, port 8000), in
    a directory of its own with the repo's ``.venv`` linked: that directory."""
    home = tmp_path_factory.mktemp("start-sh")
    (home / ".venv").symlink_to(REPO / ".venv")
    with suppress(OSError), socket.create_connection(("127.0.0.1", 8000), timeout=1):
        pytest.fail("port 8000, scripts/start.sh's, is taken: the docs' snippets need it")
    log = home / "gateway.log"
    with log.open("wb") as out:
        gateway = subprocess.Popen(
            [str(REPO / ".venv" / "bin" / "parley"), "gateway"],
            cwd=home,
            env=clean_environment(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{START_URL}/healthz", timeout=1):
                    break
            except OSError:
                assert gateway.poll() is None, log.read_text()
                assert time.monotonic() < deadline, f"no gateway on 8000:\n{log.read_text()}"
                time.sleep(0.2)
        yield home
    finally:
        stop_group(gateway.pid)
        gateway.wait(5)


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.beside_start], ids=lambda b: b.where)
def test_block_beside_start_sh_runs_as_written(block: Block, start_sh_gateway: Path) -> None:
    """As a user runs it from the repo in a second terminal while scripts/start.sh serves."""
    command = [str(VENV_PYTHON), "-c", block.text] if block.language == "python" else [
        "bash", "-e", "-c", block.text,
    ]  # fmt: skip
    run = subprocess.run(
        command,
        cwd=start_sh_gateway,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert run.returncode == 0, f"{block.where}\n{run.stdout}\n{run.stderr}"
    for out in expected_output(block):
        assert out in run.stdout, f"{block.where}: {out!r} not in\n{run.stdout}"


def procfile_processes() -> dict[str, str]:
    return dict(
        line.split(": ", 1)
        for line in (REPO / "Procfile").read_text().splitlines()
        if line and not line.startswith("#")
    )


def test_the_operations_page_shows_the_procfile_as_it_is() -> None:
    shown = [
        b
        for b in BLOCKS
        if b.path == PROCFILE_PAGE and b.text.startswith("release: ") and b.language == "text"
    ]
    assert len(shown) == 1
    assert dict(line.split(": ", 1) for line in shown[0].text.splitlines()) == procfile_processes()


def installed_path() -> str:
    """A ``PATH`` as a platform that installed parley gives its processes: parley's
    commands on it (here the repo's ``.venv/bin``), no activated environment."""
    return f"{VENV_PYTHON.parent}:/usr/bin:/bin"


@pytest.mark.postgres
def test_each_procfile_command_runs_parley_from_path(tmp_path: Path) -> None:
    """A platform (Heroku, Dokku) or a runner (honcho, foreman) runs each line with
    ``sh -c``, with the commands of the environment it installed parley into on ``PATH``,
    not in a clone: every line runs ``parley`` by name, and ``release`` runs to the end
    from a directory that is not the repo."""
    processes = procfile_processes()
    assert set(processes) == {"release", "worker", "beat", "gateway"}
    for command in processes.values():
        assert command.split()[0] == "parley", command
    with database_to_create() as database_url:
        admin = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database_url.rsplit("/", 1)[1]}"')
        run = subprocess.run(
            ["/bin/sh", "-c", processes["release"]],
            cwd=tmp_path,
            env={
                **clean_environment(),
                "PATH": installed_path(),
                "PARLEY_DATABASE_URL": database_url,
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "schema at revision" in run.stdout + run.stderr


def test_the_operations_page_runs_the_procfile_from_a_clone_with_the_venv_on_path() -> None:
    """From a clone the Procfile's ``parley`` is the repo's ``.venv/bin/parley``: the
    operations page says to put it on ``PATH`` for honcho."""
    page = PROCFILE_PAGE.read_text()
    assert "PATH=.venv/bin:$PATH honcho start worker beat gateway" in page


def test_every_relative_link_names_a_file_of_the_repository() -> None:
    for path in DOCUMENTS:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if "://" in target:
                continue
            file = (path.parent / target.split("#", 1)[0]).resolve()
            assert file.is_relative_to(REPO) and file.exists(), f"{path.name}: {target}"


def test_the_procfile_gateway_listens_on_port(tmp_path: Path) -> None:
    """The ``gateway`` line as honcho runs it (``sh -c``, parley's commands on PATH, no
    activated environment), on ``$PORT``, with tokens (it binds beyond loopback): it
    answers, and refuses a request without one."""
    import socket

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        gateway = subprocess.Popen(
            ["/bin/sh", "-c", procfile_processes()["gateway"]],
            cwd=tmp_path,
            env={
                **clean_environment(),
                "PATH": installed_path(),
                "PORT": str(port),
                "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'p.db'}",
                "PARLEY_WORKSPACES": str(tmp_path / "workspaces"),
                "PARLEY_GATEWAY_TOKENS": "tok-0123456789abcdef=acme",
            },
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert gateway.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the gateway never answered"
                time.sleep(0.2)
        assert health.status_code == 200
        refused = httpx.get(f"http://127.0.0.1:{port}/v1/sessions", timeout=5)
        assert refused.status_code == 401
    finally:
        stop_group(gateway.pid)
        gateway.wait(5)
