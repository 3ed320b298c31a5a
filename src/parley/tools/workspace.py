"""Built-in tools over the session root: ``read_file``, ``write_file``, ``list_files``.

Every path is confined to the root (:func:`parley.workspace.confine`) by the tool itself,
independently of the policy, so a permissive policy still cannot leave the root."""

from __future__ import annotations

import os
from typing import Any

from parley.ports.host import Access, ToolContext
from parley.tools.base import FunctionTool
from parley.workspace import confine, relative

READ_LIMIT = 200_000
LIST_LIMIT = 1000
SKIPPED_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "node_modules"}


def _read(arguments: dict[str, Any], context: ToolContext) -> str:
    path = confine(context.root, arguments["path"])
    if path.is_dir():
        raise IsADirectoryError(f"{arguments['path']} is a directory; use list_files")
    if path.exists() and not path.is_file():
        # A FIFO or a device would block the turn, or never end.
        raise OSError(f"{arguments['path']} is not a regular file")
    with path.open("rb") as handle:
        data = handle.read(READ_LIMIT + 1)  # never the whole of a huge file
    text = data[:READ_LIMIT].decode("utf-8", errors="replace")
    if len(data) > READ_LIMIT:
        text += f"\n[file truncated at {READ_LIMIT} bytes]"
    return text


def _write(arguments: dict[str, Any], context: ToolContext) -> str:
    path = confine(context.root, arguments["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    data = arguments["content"].encode("utf-8")
    path.write_bytes(data)
    return f"wrote {len(data)} bytes to {relative(context.root, arguments['path'])}"


def _list(arguments: dict[str, Any], context: ToolContext) -> str:
    start = confine(context.root, arguments.get("path") or ".")
    base = confine(context.root, ".")
    found: list[str] = []
    for directory, subdirs, files in os.walk(start):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            found.append(os.path.relpath(os.path.join(directory, name), base).replace(os.sep, "/"))
            if len(found) > LIST_LIMIT:
                return "\n".join(found[:LIST_LIMIT]) + f"\n[listing stopped at {LIST_LIMIT} files]"
    return "\n".join(found) if found else "(no files)"


read_file = FunctionTool(
    name="read_file",
    description="Read a UTF-8 text file, by path relative to the workspace root.",
    parameters={
        "type": "object",
        "properties": {"path": {"type": "string", "description": "relative path"}},
        "required": ["path"],
        "additionalProperties": False,
    },
    function=_read,
    access=lambda args: (Access(mode="read", path=args["path"]),),
)

write_file = FunctionTool(
    name="write_file",
    description="Create or replace a text file, by path relative to the workspace root.",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "relative path"},
            "content": {"type": "string", "description": "the whole new content"},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    function=_write,
    access=lambda args: (Access(mode="write", path=args["path"]),),
)

list_files = FunctionTool(
    name="list_files",
    description="List files below a directory of the workspace (default: the root).",
    parameters={
        "type": "object",
        "properties": {"path": {"type": "string", "description": "relative directory"}},
        "additionalProperties": False,
    },
    function=_list,
    access=lambda args: (Access(mode="read", path=args.get("path") or "."),),
)
