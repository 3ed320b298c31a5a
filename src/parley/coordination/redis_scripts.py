"""The Redis coordinator's and admission's Lua scripts: their sources, read once at import from
``src/parley/coordination/lua/`` (each file says what its KEYS and ARGV are), and their
registration with a client."""

from __future__ import annotations

from importlib import resources
from typing import Any


def lua_source(name: str) -> str:
    """The source of a script in ``src/parley/coordination/lua/``."""
    return resources.files("parley.coordination").joinpath("lua", f"{name}.lua").read_text("utf-8")


# Read once, at import; registered with each client by Scripts.
APPEND_AND_PUBLISH = lua_source("append_and_publish")
EXTEND_LOCK = lua_source("extend_lock")
ADOPT_TURN = lua_source("adopt_turn")
RELEASE_LOCK = lua_source("release_lock")
ADMISSION = lua_source("admission")
LUA_SCRIPTS = ("append_and_publish", "extend_lock", "adopt_turn", "release_lock", "admission")
"""The files in ``src/parley/coordination/lua/`` this module reads (the package data a wheel
must ship)."""


class Scripts:
    """The scripts as registered with one client."""

    def __init__(self, client: Any) -> None:
        self.append = client.register_script(APPEND_AND_PUBLISH)
        self.adopt = client.register_script(ADOPT_TURN)
        self.extend = client.register_script(EXTEND_LOCK)
        self.release = client.register_script(RELEASE_LOCK)
        self._client = client

    @staticmethod
    def queue(pipe: Any, script: Any, keys: list[Any], args: list[Any]) -> None:
        """Queue a script call on ``pipe`` by its sha.  (Called as ``script(...,
        client=pipe)``, redis-py would ask ``SCRIPT EXISTS`` before every execute: a
        second round trip per pipeline.)"""
        pipe.evalsha(script.sha, len(keys), *keys, *args)

    def load(self) -> None:
        """Load every script into a server that lost them (a restart)."""
        for script in (self.append, self.adopt, self.extend, self.release):
            script.sha = self._client.script_load(script.script)
