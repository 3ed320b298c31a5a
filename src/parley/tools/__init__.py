"""Tools the model may call: the built-in workspace tools, ``run_command`` (opt-in),
:class:`FunctionTool`, and the ``@tool`` decorator."""

from parley.tools.base import FunctionTool
from parley.tools.commands import command_tool, run_command
from parley.tools.decorator import DecoratedTool, tool
from parley.tools.search import search_files
from parley.tools.workspace import list_files, read_file, write_file

WORKSPACE_TOOLS = (read_file, write_file, list_files, search_files)
"""The default toolbox of a :class:`parley.Host`: reading, writing, listing and searching
files inside the session root.  ``run_command`` is not in it: executing is opt-in."""

__all__ = [
    "WORKSPACE_TOOLS",
    "DecoratedTool",
    "FunctionTool",
    "command_tool",
    "list_files",
    "read_file",
    "run_command",
    "search_files",
    "tool",
    "write_file",
]
