"""``McpServer``: the description of one MCP server to connect to, stored as JSON."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from parley.errors import InvalidRequest

SERVER_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
TOOL_PREFIX = re.compile(r"[a-zA-Z0-9_-]{0,32}")
DEFAULT_TIMEOUT = 30.0

_STDIO_KEYS = frozenset({"command", "env", "cwd"})
_HTTP_KEYS = frozenset({"url", "headers"})
_COMMON_KEYS = frozenset({"name", "timeout", "call_timeout", "tool_prefix"})


@dataclass(frozen=True, kw_only=True)
class McpServer:
    """One MCP server: a command to run over stdio, or a streamable-HTTP URL.

    - ``name`` identifies the server in errors and in policy paths: each of its tools is
      checked as the access ``mcp`` of ``<name>/<tool>`` (see :mod:`parley.mcp`).
    - ``command`` (argv), ``env`` (added to the small inherited environment the ``mcp``
      SDK passes on: ``HOME``, ``PATH``, ``SHELL``, ``TERM``, ``USER``, ``LOGNAME``) and
      ``cwd`` describe a stdio server; ``url`` and ``headers`` a streamable-HTTP one.
      Exactly one of ``command`` and ``url`` is given.
    - ``timeout`` bounds the start (spawn or connect, ``initialize`` and listing the tools);
      ``call_timeout`` (default: ``timeout``) bounds each tool call.
    - ``tool_prefix`` is put in front of every tool name the server lists, to tell apart
      servers whose tool names would collide (collisions are an error, never a silent
      shadowing).

    Invalid fields raise :class:`~parley.errors.InvalidRequest`.  The spec is immutable,
    hashable (a host may key open connections by it) and round-trips through
    :meth:`to_json` / :meth:`from_json`.  Note that ``headers`` and ``env`` are stored as
    given: a secret placed there lands in whatever stores the spec.
    """

    name: str
    command: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    timeout: float = DEFAULT_TIMEOUT
    call_timeout: float | None = None
    tool_prefix: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not SERVER_NAME.fullmatch(self.name):
            raise InvalidRequest(f"MCP server name {self.name!r} must match {SERVER_NAME.pattern}")
        where = f"MCP server {self.name!r}"
        command = _checked_command(self.command, where)
        object.__setattr__(self, "command", command)
        if bool(command) == (self.url is not None):
            raise InvalidRequest(f"{where}: give exactly one of command (stdio) and url (http)")
        if command:
            self._check_stdio(where)
        else:
            self._check_http(where)
        _check_seconds(self.timeout, f"{where}: timeout")
        if self.call_timeout is not None:
            _check_seconds(self.call_timeout, f"{where}: call_timeout")
        if not isinstance(self.tool_prefix, str) or not TOOL_PREFIX.fullmatch(self.tool_prefix):
            raise InvalidRequest(f"{where}: tool_prefix must match {TOOL_PREFIX.pattern}")

    def _check_stdio(self, where: str) -> None:
        if self.headers is not None:
            raise InvalidRequest(f"{where}: headers are for an http server, not a command")
        if self.cwd is not None and (not isinstance(self.cwd, str) or not self.cwd):
            raise InvalidRequest(f"{where}: cwd must be a non-empty string")
        object.__setattr__(self, "env", _string_map(self.env, f"{where}: env"))

    def _check_http(self, where: str) -> None:
        if self.env is not None or self.cwd is not None:
            raise InvalidRequest(f"{where}: env and cwd are for a command, not a url")
        _check_url(self.url, where)
        object.__setattr__(self, "headers", _string_map(self.headers, f"{where}: headers"))

    # env and headers are dicts, which do not hash: equality and hashing go through one
    # canonical text instead, so that a host may key its open connections by spec.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, McpServer) and self._canonical() == other._canonical()

    def __hash__(self) -> int:
        return hash(self._canonical())

    def _canonical(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def stdio(
        cls,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        call_timeout: float | None = None,
        tool_prefix: str = "",
    ) -> McpServer:
        """A server run as ``command`` (argv), spoken to over its stdin and stdout."""
        return cls(
            name=name,
            command=command,
            env=env,
            cwd=cwd,
            timeout=timeout,
            call_timeout=call_timeout,
            tool_prefix=tool_prefix,
        )

    @classmethod
    def http(
        cls,
        name: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        call_timeout: float | None = None,
        tool_prefix: str = "",
    ) -> McpServer:
        """A server reached over streamable HTTP at ``url`` (e.g. ``http://host:8000/mcp``)."""
        return cls(
            name=name,
            url=url,
            headers=headers,
            timeout=timeout,
            call_timeout=call_timeout,
            tool_prefix=tool_prefix,
        )

    @property
    def transport(self) -> Literal["stdio", "http"]:
        """How parley talks to the server."""
        return "stdio" if self.command else "http"

    @property
    def per_call_timeout(self) -> float:
        """The seconds one tool call may take."""
        return self.timeout if self.call_timeout is None else self.call_timeout

    def to_json(self) -> dict[str, Any]:
        """The stored form: only the fields that are set."""
        data: dict[str, Any] = {"name": self.name}
        if self.command:
            data["command"] = list(self.command)
            if self.env:
                data["env"] = dict(self.env)
            if self.cwd is not None:
                data["cwd"] = self.cwd
        else:
            data["url"] = self.url
            if self.headers:
                data["headers"] = dict(self.headers)
        data["timeout"] = self.timeout
        if self.call_timeout is not None:
            data["call_timeout"] = self.call_timeout
        if self.tool_prefix:
            data["tool_prefix"] = self.tool_prefix
        return data

    @classmethod
    def from_json(cls, data: Any) -> McpServer:
        """Load the stored form; a malformed one raises ``InvalidRequest``."""
        if not isinstance(data, dict):
            raise InvalidRequest(f"an MCP server spec must be a JSON object, not {data!r}")
        unknown = set(data) - _STDIO_KEYS - _HTTP_KEYS - _COMMON_KEYS
        if unknown:
            # A misspelt key would otherwise be dropped silently.
            raise InvalidRequest(f"MCP server spec: unknown key(s) {sorted(unknown)}")
        if "name" not in data:
            raise InvalidRequest("MCP server spec: missing 'name'")
        command = data.get("command", ())
        if not isinstance(command, list | tuple):
            raise InvalidRequest(f"MCP server {data['name']!r}: command must be a list of strings")
        return cls(
            name=data["name"],
            command=tuple(command),
            env=data.get("env"),
            cwd=data.get("cwd"),
            url=data.get("url"),
            headers=data.get("headers"),
            timeout=data.get("timeout", DEFAULT_TIMEOUT),
            call_timeout=data.get("call_timeout"),
            tool_prefix=data.get("tool_prefix", ""),
        )


def _checked_command(command: object, where: str) -> tuple[str, ...]:
    if isinstance(command, str) or not isinstance(command, Sequence):
        raise InvalidRequest(f"{where}: command must be a list of strings (argv)")
    argv = tuple(command)
    if not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise InvalidRequest(f"{where}: command must be a list of strings (argv)")
    if argv and not argv[0]:
        raise InvalidRequest(f"{where}: the command's program is empty")
    return argv


def _string_map(value: object, where: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidRequest(f"{where} must map strings to strings")
    return dict(value)


def _check_url(url: object, where: str) -> None:
    if not isinstance(url, str):
        raise InvalidRequest(f"{where}: url must be a string")
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a malformed port
    except ValueError as exc:
        raise InvalidRequest(f"{where}: url {url!r} is malformed ({exc})") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"{where}: url {url!r} must be http(s)://host[:port]/path")


def _check_seconds(value: object, where: str) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidRequest(f"{where} must be a positive number of seconds, not {value!r}")
