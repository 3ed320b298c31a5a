"""A tiny MCP server for parley's MCP tests, built on the official ``mcp`` server side.

Run it as ``python tests/support/mcp_server.py stdio`` (newline-delimited JSON-RPC on stdin/stdout)
or ``python tests/support/mcp_server.py http --port N`` (streamable HTTP on
``http://127.0.0.1:N/mcp``).  Its tools: ``add``, ``echo``, ``fail`` (always an error
result), ``slow`` (sleeps, to exercise call timeouts), ``picture`` (non-text content),
``pid`` (the server's process id), ``crash`` (the server exits mid-call) and
``append`` (a line added to a file under the server's working directory: a write,
checked on disk).
"""

from __future__ import annotations

import argparse
import os

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

server = MCPServer("parley-test", log_level="WARNING")

# A 1x1 transparent PNG, so that tests see how non-text content is summarised.
_PIXEL = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000005000157f2f0d00000000049454e44ae426082"
)


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def fail() -> str:
    """Always fail, with a message the client should pass on."""
    raise ToolError("fail was asked to fail")


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep for ``seconds``, then say so."""
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def picture() -> Image:
    """Return a one-pixel image (non-text content)."""
    return Image(data=_PIXEL, format="png")


@server.tool()
def pid() -> int:
    """The server's process id, so a test can check that the process is gone."""
    return os.getpid()


@server.tool()
def crash() -> str:
    """Exit the server process at once, without answering."""
    os._exit(3)


@server.tool()
def append(path: str, text: str) -> str:
    """Add ``text`` as a line to the file ``path`` (under the working directory)."""
    with open(os.path.join(os.getcwd(), path), "a", encoding="utf-8") as file:
        file.write(text + "\n")
    return f"appended to {path}"


def main() -> None:
    """Parse the transport from the command line and serve until stopped."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("transport", choices=("stdio", "http"))
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
