"""parley installs like a library: its wheel ships one top-level name, carries every file
it reads besides its modules, and works beside a project whose own packages are called
``workers``, ``schemas`` and ``broker_config``, from a directory that holds a clone named
``parley/``.

The wheel is built from this checkout and installed, without its dependencies, into a
fresh virtual environment; the dependencies come from the test environment's own
site-packages, added after the new environment's (a ``.pth`` line: its ``.pth`` files,
the editable install's among them, are not read), so the test needs no network and
imports parley from the wheel alone."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

SNIPPET = """
import tempfile
from pathlib import Path

import parley

script = {"rules": [{"when": ".*", "steps": [{"text": "heard: {last_message}"}]}]}
root = Path(tempfile.mkdtemp())
host = parley.Host(model=parley.models.ScriptedModel(script))
with parley.connect(f"sqlite:///{root / 'runs.db'}", host=host) as client:
    session = client.open_session(root=str(root))
    print(session.turn("hello").reply)
print(parley.__file__)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(REPO)],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("parley-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtual environment with the wheel installed; its ``bin``."""
    env = tmp_path_factory.mktemp("venv")
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--quiet",
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield env / "bin"


@pytest.fixture
def user_project(tmp_path: Path) -> Path:
    """A project of a user's: packages named as parley's layers once were, each failing
    loudly if parley imported it, and a clone of parley beside them."""
    project = tmp_path / "project"
    for name in ("workers", "schemas", "broker_config"):
        package = project / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(
            f"raise ImportError('the project\\'s own {name} package was imported')\n"
        )
    clone = project / "parley"  # a checkout of parley's repository, as `git clone` makes it
    (clone / "src" / "parley").mkdir(parents=True)
    (clone / "README.md").write_text("# parley\n")
    (clone / "src" / "parley" / "__init__.py").write_text("raise ImportError('the clone')\n")
    return project


def _clean_environment(home: Path) -> dict[str, str]:
    keep = {"PATH", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT"}
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["HOME"] = str(home)
    return env


def test_the_wheel_ships_parley_alone_with_its_package_data(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["parley"]
    tops = {name.split("/", 1)[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"parley"}
    for data in (
        "parley/schemas/migrations/versions/0001_initial.py",
        "parley/schemas/migrations/script.py.mako",
        "parley/coordination/lua/admission.lua",
        "parley/gateway/static/index.html",
        "parley/demo/chat.json",
        "parley/py.typed",
    ):
        assert data in names, data


def test_a_turn_runs_from_the_wheel_beside_a_project_with_its_own_workers_and_schemas(
    installed: Path, user_project: Path
) -> None:
    ran = subprocess.run(
        [str(installed / "python"), "-c", textwrap.dedent(SNIPPET)],
        cwd=user_project,
        env=_clean_environment(user_project),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    reply, location = ran.stdout.strip().splitlines()
    assert reply == "heard: hello"
    assert Path(location).is_relative_to(installed.parent)  # the wheel's, not the clone's


def test_parley_demo_runs_from_the_wheel(installed: Path, user_project: Path) -> None:
    ran = subprocess.run(
        [str(installed / "parley"), "demo", "--dir", str(user_project / "demo")],
        cwd=user_project,
        env=_clean_environment(user_project),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert "demo complete: every turn above is durable" in ran.stdout, ran.stdout
    assert "A second process reopens the session" in ran.stdout


def test_the_checkout_does_not_shadow_parley_from_a_directory_holding_a_clone(
    user_project: Path,
) -> None:
    """The editable install of the test environment, run where a clone named parley/
    sits in the working directory: parley is still the checkout's package."""
    ran = subprocess.run(
        [sys.executable, "-c", "import parley; print(parley.Host.__name__, parley.__file__)"],
        cwd=user_project,
        env=_clean_environment(user_project),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    name, location = ran.stdout.split()
    assert name == "Host"
    assert Path(location).is_relative_to(REPO / "src")
