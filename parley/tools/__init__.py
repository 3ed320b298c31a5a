"""Tools the model may call: the built-in workspace tools and :class:`FunctionTool`."""

from parley.tools.base import FunctionTool
from parley.tools.workspace import WORKSPACE_TOOLS, list_files, read_file, write_file

__all__ = ["WORKSPACE_TOOLS", "FunctionTool", "list_files", "read_file", "write_file"]
