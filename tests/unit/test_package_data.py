"""The Lua scripts the Redis coordinator reads at import are package data: found through
importlib.resources, and declared in pyproject.toml so a built (non-editable) wheel
carries them."""

from __future__ import annotations

import fnmatch
import tomllib
from importlib import resources
from pathlib import Path

from workers.coordination import redis_scripts

ROOT = Path(__file__).resolve().parents[2]


def _lua_files() -> set[str]:
    folder = resources.files("workers.coordination").joinpath("lua")
    return {entry.name for entry in folder.iterdir() if entry.name.endswith(".lua")}


def test_every_script_the_coordinator_reads_is_a_file_in_its_lua_folder() -> None:
    assert _lua_files() == {f"{name}.lua" for name in redis_scripts.LUA_SCRIPTS}
    for name in redis_scripts.LUA_SCRIPTS:
        source = (
            resources.files("workers.coordination")
            .joinpath("lua", f"{name}.lua")
            .read_text("utf-8")
        )
        assert "redis.call(" in source
        assert "-- KEYS:" in source  # each file says what its keys and arguments are
    assert "redis.call('XADD'" in redis_scripts.APPEND_AND_PUBLISH


def test_pyproject_declares_the_lua_files_as_package_data_of_coordination() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    setuptools = config["tool"]["setuptools"]
    assert any(fnmatch.fnmatch("workers", p) for p in setuptools["packages"]["find"]["include"])
    patterns = setuptools["package-data"]["workers.coordination"]
    for name in _lua_files():
        assert any(fnmatch.fnmatch(f"lua/{name}", p) for p in patterns), name


def test_every_file_the_web_page_serves_is_package_data_of_parley() -> None:
    """The page's scripts, styles and vendored libraries (and their licences) reach an
    installed parley: each file under parley/gateway/static matches a declared pattern."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["parley"]
    static = ROOT / "parley" / "gateway" / "static"
    served = [path.relative_to(ROOT / "parley").as_posix() for path in static.rglob("*")]
    files = [name for name in served if (ROOT / "parley" / name).is_file()]
    assert "gateway/static/vendor/marked.esm.js" in files
    assert "gateway/static/vendor/purify.min.js" in files
    for name in files:
        # setuptools' globs do not cross a directory: "static/*" is not "static/vendor/x".
        assert any(
            fnmatch.fnmatch(name, p) and name.count("/") == p.count("/") for p in patterns
        ), name
