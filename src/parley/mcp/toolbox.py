"""``open_toolbox``: connect to several MCP servers at once and offer their tools."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from types import TracebackType

from parley.errors import InvalidRequest, McpError
from parley.mcp.connection import McpConnection
from parley.mcp.spec import McpServer
from parley.mcp.tool import McpTool
from parley.tools.base import TOOL_NAME

_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


class McpToolbox:
    """Open connections to MCP servers and the parley tools they offer.

    Made by :func:`open_toolbox`.  ``tools`` are ready to hand to the engine alongside the
    host's own; ``close()`` (or leaving a ``with`` block) ends every session and stops
    every stdio server.  The toolbox may be shared between threads: each server's calls
    run concurrently on its own connection, and ``close`` may come from any thread (calls
    in flight then fail with :class:`McpError`, later ones too)."""

    def __init__(self, connections: Sequence[McpConnection], tools: Sequence[McpTool]) -> None:
        self._connections = tuple(connections)
        self.tools: tuple[McpTool, ...] = tuple(tools)

    def __repr__(self) -> str:
        return f"McpToolbox(servers={[c.name for c in self._connections]}, tools={len(self.tools)})"

    @property
    def servers(self) -> tuple[McpServer, ...]:
        """The specs of the connected servers, in the order given."""
        return tuple(connection.spec for connection in self._connections)

    @property
    def alive(self) -> bool:
        """False once closed, or once any server has gone away (a host that keeps a
        toolbox across turns reopens it then)."""
        return all(connection.alive for connection in self._connections)

    def tool(self, name: str) -> McpTool:
        """The tool offered under ``name``; ``KeyError`` if there is none."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        raise KeyError(name)

    def close(self) -> None:
        """Close every connection (stdio servers are stopped and reaped).  Idempotent."""
        for connection in self._connections:
            connection.close()

    def __enter__(self) -> McpToolbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def open_toolbox(
    servers: Sequence[McpServer],
    *,
    timeout: float | None = None,
    reserved: Collection[str] = (),
) -> McpToolbox:
    """Connect to every server at once, run ``initialize`` and list their tools.

    ``timeout`` (seconds) caps each server's own start ``timeout``.  ``reserved`` names
    tools already offered (the host's), which no MCP tool may shadow.

    Raises :class:`InvalidRequest` for malformed arguments (two servers with one name), and
    :class:`McpError` when a server cannot be started, reached or initialised in time,
    naming each failed server and its cause, or when two tools would share a name; in
    either case every server of the call is already stopped.  An empty ``servers`` gives
    an empty toolbox at no cost."""
    specs = _check_specs(servers)
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise InvalidRequest(f"open_toolbox: timeout must be a positive number, not {timeout!r}")
    connections = [McpConnection(spec) for spec in specs]
    try:
        for connection in connections:
            connection.begin(timeout)
        failures: list[str] = []
        for connection in connections:
            try:
                connection.wait_started()
            except McpError as exc:
                failures.append(str(exc))
        if failures:
            raise McpError("; ".join(failures))
        return McpToolbox(connections, _name_tools(connections, reserved))
    except BaseException:
        for connection in connections:
            connection.close()
        raise


def _check_specs(servers: Sequence[McpServer]) -> tuple[McpServer, ...]:
    if isinstance(servers, McpServer) or not isinstance(servers, Sequence):
        raise InvalidRequest("open_toolbox: servers must be a list of McpServer")
    seen: set[str] = set()
    for spec in servers:
        if not isinstance(spec, McpServer):
            raise InvalidRequest(f"open_toolbox: {spec!r} is not an McpServer")
        if spec.name in seen:
            raise InvalidRequest(f"open_toolbox: two MCP servers are named {spec.name!r}")
        seen.add(spec.name)
    return tuple(servers)


def _name_tools(connections: Sequence[McpConnection], reserved: Collection[str]) -> list[McpTool]:
    """Each remote tool under its exposed name; two tools on one name is an error, since
    the model could not tell them apart (a ``tool_prefix`` on a server resolves it)."""
    owners: dict[str, str] = {name: "a tool of the host" for name in reserved}
    tools: list[McpTool] = []
    for connection in connections:
        for remote in connection.tools:
            name = exposed_name(connection.spec.tool_prefix, remote.name)
            owner = f"tool {remote.name!r} of MCP server {connection.name!r}"
            if not TOOL_NAME.fullmatch(name):
                raise McpError(f"{owner} cannot be offered under the name {name!r}")
            if name in owners:
                raise McpError(
                    f"the tool name {name!r} is taken twice: by {owners[name]} and by {owner} "
                    "(give a server a tool_prefix)"
                )
            owners[name] = owner
            tools.append(McpTool(name=name, remote=remote, connection=connection))
    return tools


def exposed_name(prefix: str, remote: str) -> str:
    """The name a model sees for a server's tool: ``prefix + remote``, with characters
    providers refuse in tool names (``.``, ``/``, spaces …) replaced by ``_``, cut to 64."""
    return _UNSAFE.sub("_", prefix + remote)[:64]
