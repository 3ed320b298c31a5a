"""Tools from MCP servers (the Model Context Protocol), through the official ``mcp`` SDK.

```python
from parley.mcp import McpServer, open_toolbox

servers = [
    McpServer.stdio("files", ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv"]),
    McpServer.http("search", "http://127.0.0.1:8000/mcp", headers={"Authorization": "…"}),
]
with open_toolbox(servers) as toolbox:
    tools = [*host_tools, *toolbox.tools]   # parley tools, run synchronously
```

- **Threads.** The SDK is asynchronous; each server's session lives on its own daemon
  thread with its own event loop, and ``McpTool.run`` submits the call there and blocks
  for at most the server's call timeout.  A toolbox may be used from several threads at
  once (calls run concurrently) and closed from any of them.
- **Timeouts.** ``McpServer.timeout`` bounds the start (spawn or connect, ``initialize``,
  listing tools); ``call_timeout`` (default: ``timeout``) each call.  Stopping a stdio
  server that ignores the end of its input takes up to a few more seconds (the SDK closes
  its stdin, then sends SIGTERM, then SIGKILL to its process group).
- **Names.** A tool keeps the server's name (with the server's ``tool_prefix``, and
  characters providers refuse replaced by ``_``); two tools on one name, or an MCP tool
  shadowing a ``reserved`` host tool, fail the open with :class:`McpError`.
- **Policy.** Each call is the access ``mcp`` of ``<server>/<tool>``: the default
  :class:`parley.Policy` calls no MCP tool (rule ``allow_mcp``) until ``allow_mcp``
  names them, e.g. ``["**"]`` or ``["github/*"]``; ``deny_tools`` denies one by the name
  the model sees.
- **Errors.** A server that cannot start raises :class:`~parley.errors.McpError` naming it
  and the cause (and the end of its stderr), with nothing left running; at call time an
  error result, a timeout or a lost connection raise ``McpError`` too, which the engine
  turns into an error result for the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parley.errors import McpError
from parley.lazy import lazy_exports
from parley.mcp.spec import McpServer

if TYPE_CHECKING:
    from parley.mcp.connection import McpConnection
    from parley.mcp.pool import McpPool
    from parley.mcp.tool import McpTool, render_result
    from parley.mcp.toolbox import McpToolbox, exposed_name, open_toolbox

# The SDK takes over a second to import: a host that names no server should not pay it.
_LAZY = {
    "McpConnection": "parley.mcp.connection",
    "McpPool": "parley.mcp.pool",
    "McpTool": "parley.mcp.tool",
    "McpToolbox": "parley.mcp.toolbox",
    "exposed_name": "parley.mcp.toolbox",
    "open_toolbox": "parley.mcp.toolbox",
    "render_result": "parley.mcp.tool",
}

__all__ = [
    "McpConnection",
    "McpError",
    "McpPool",
    "McpServer",
    "McpTool",
    "McpToolbox",
    "exposed_name",
    "open_toolbox",
    "render_result",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
