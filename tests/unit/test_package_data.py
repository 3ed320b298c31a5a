"""What parley reads from its own package besides its modules is package data: found
through importlib.resources, and declared in pyproject.toml so that a built (non-editable)
wheel carries it (tests/acceptance/test_wheel.py installs one and uses it)."""

from __future__ import annotations

import fnmatch
import tomllib
from importlib import resources
from pathlib import Path

from parley.coordination import redis_scripts

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "parley"


def _lua_files() -> set[str]:
    folder = resources.files("parley.coordination").joinpath("lua")
    return {entry.name for entry in folder.iterdir() if entry.name.endswith(".lua")}


def test_every_script_the_coordinator_reads_is_a_file_in_its_lua_folder() -> None:
    assert _lua_files() == {f"{name}.lua" for name in redis_scripts.LUA_SCRIPTS}
    for name in redis_scripts.LUA_SCRIPTS:
        source = (
            resources.files("parley.coordination").joinpath("lua", f"{name}.lua").read_text("utf-8")
        )
        assert "redis.call(" in source
        assert "-- KEYS:" in source  # each file says what its keys and arguments are
    assert "redis.call('XADD'" in redis_scripts.APPEND_AND_PUBLISH


def test_every_file_of_the_package_that_is_not_a_module_is_declared_package_data() -> None:
    """The page's scripts, styles and vendored libraries (and their licences), the Lua
    scripts, the demo's scripts, Alembic's template and revisions: each file under
    src/parley that is not in a Python package matches a declared pattern."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    setuptools = config["tool"]["setuptools"]
    assert setuptools["packages"]["find"] == {"where": ["src"], "include": ["parley*"]}
    patterns = setuptools["package-data"]["parley"]
    files = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    ]
    data = [
        name
        for name in files
        if not (name.endswith(".py") and (PACKAGE / name).parent.joinpath("__init__.py").exists())
    ]
    assert "gateway/static/vendor/marked.esm.js" in data
    assert "coordination/lua/admission.lua" in data
    assert "schemas/migrations/versions/0001_initial.py" in data
    assert "demo/chat.json" in data
    for name in data:
        # setuptools' globs do not cross a directory: "static/*" is not "static/vendor/x".
        assert any(
            fnmatch.fnmatch(name, p) and name.count("/") == p.count("/") for p in patterns
        ), name
