"""A host's long-lived MCP servers: opened on first use in each process, kept open across
turns, reopened when a server died, and never shared across a fork (a Celery worker's
children each open their own: threads and pipes do not survive ``fork``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Collection, Sequence

from parley.mcp.spec import McpServer
from parley.mcp.tool import McpTool
from parley.mcp.toolbox import McpToolbox, open_toolbox


class McpPool:
    """The open toolbox of a fixed list of servers, per process."""

    def __init__(self, servers: Sequence[McpServer]) -> None:
        self.servers = tuple(servers)
        self._toolbox: McpToolbox | None = None
        self._pid = 0
        self._guard = threading.Lock()

    def tools(self, reserved: Collection[str] = ()) -> tuple[McpTool, ...]:
        """The servers' tools, opening (or reopening) them if needed.  Raises
        :class:`~parley.errors.McpError` if a server cannot be started."""
        if not self.servers:
            return ()
        with self._guard:
            toolbox = self._toolbox
            if toolbox is None or self._pid != os.getpid() or not toolbox.alive:
                if toolbox is not None and self._pid == os.getpid():
                    toolbox.close()  # a server died: stop the rest before starting afresh
                self._toolbox = toolbox = open_toolbox(self.servers, reserved=reserved)
                self._pid = os.getpid()
            return toolbox.tools

    def close(self) -> None:
        """Stop this process's servers (a later :meth:`tools` opens them again)."""
        with self._guard:
            if self._toolbox is not None and self._pid == os.getpid():
                self._toolbox.close()
            self._toolbox = None
