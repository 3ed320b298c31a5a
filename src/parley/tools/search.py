"""The built-in ``search_files`` tool: a regex over the text files below the session root.

How the policy sees it.  The Tool protocol asks for a call's accesses before it runs and
without the root, so the tool cannot list the files it will read.  It declares instead a
read of ``path`` itself and a read of a glob naming every file the search may open
(``src/**/*.py`` for ``path="src", glob="*.py"``, ``**`` for the whole root); the
:class:`parley.Policy` judges a glob read as a read of each matching file that exists
(see its docstring).  So ``deny_read: ["secrets/**"]`` refuses a search of ``.`` that
would open ``secrets/token`` (naming the file), and ``glob`` or ``path`` narrows the
search to what the policy allows.  Nothing is skipped silently: a tool never sees the
policy, and a search that quietly left files out would read as "no match".

Every piece of work is bounded: the files walked, the bytes read per file and in all, the
matches reported and the characters shown per line; the result says what was cut.
Files reachable only through a symlink out of the root, binary files (a NUL byte in the
first 8 KiB), and the usual tool directories (``.git``, ``.venv``, ``node_modules``, …)
are not searched.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from parley.errors import InvalidRequest
from parley.globs import glob_match
from parley.ports.host import Access, ToolContext
from parley.tools.base import FunctionTool
from parley.tools.workspace import SKIPPED_DIRS
from parley.workspace import confine

DEFAULT_MAX_RESULTS = 100
MAX_RESULTS = 1000
MAX_LINE_CHARS = 240
MAX_FILES = 5000
MAX_FILE_BYTES = 1_000_000
MAX_SCAN_BYTES = 64_000_000
BINARY_SNIFF_BYTES = 8192


def _where(arguments: dict[str, Any]) -> tuple[str, str | None]:
    """The normalised ``path`` ("" for the root) and ``glob``, refused if they are not
    plain relative names (globs belong in ``glob``, and neither may climb out)."""
    path = arguments.get("path") or "."
    glob = arguments.get("glob") or None
    if any(c in path for c in "*?"):
        raise InvalidRequest("search_files: path is a file or directory; put wildcards in glob")
    normal = posixpath.normpath(path.replace(os.sep, "/"))
    if normal.startswith("/") or normal == ".." or normal.startswith("../"):
        raise InvalidRequest(f"search_files: path {path!r} leaves the session root")
    if glob is not None and (glob.startswith("/") or ".." in glob.split("/")):
        raise InvalidRequest(f"search_files: glob {glob!r} must stay below path")
    return ("" if normal == "." else normal), glob


def _access_glob(path: str, glob: str | None) -> str:
    """The glob, relative to the root, naming every file the search may open."""
    tail = "**" if glob is None else (glob if "/" in glob else f"**/{glob}")
    return f"{path}/{tail}" if path else tail


def _accesses(arguments: dict[str, Any]) -> tuple[Access, ...]:
    path, glob = _where(arguments)
    _pattern(arguments)  # a bad regex is the model's error before the policy's question
    return (
        Access(mode="read", path=path or "."),
        Access(mode="read", path=_access_glob(path, glob)),
    )


def _pattern(arguments: dict[str, Any]) -> re.Pattern[str]:
    flags = re.IGNORECASE if arguments.get("ignore_case") else 0
    try:
        return re.compile(arguments["pattern"], flags)
    except re.error as exc:
        raise InvalidRequest(
            f"search_files: invalid regex {arguments['pattern']!r}: {exc}"
        ) from exc


def _files(root: str, path: str, glob: str | None) -> Iterator[tuple[str, Path]]:
    """``(name, real path)`` of each file to search, in a stable order; ``name`` is
    relative to the root through ``path`` as given (what the policy judged)."""
    start = confine(root, path or ".")
    if not start.exists():
        raise FileNotFoundError(f"{path or '.'} does not exist")
    if start.is_file():
        yield path, start
        return
    pattern = None if glob is None else _access_glob("", glob)
    for directory, subdirs, files in os.walk(start):
        # os.walk does not follow symlinked directories, so the walk stays in the root.
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS)
        below = os.path.relpath(directory, start).replace(os.sep, "/")
        for name in sorted(files):
            inner = name if below == "." else f"{below}/{name}"
            if pattern is not None and not glob_match(pattern, inner):
                continue
            full = f"{path}/{inner}" if path else inner
            try:
                real = confine(root, full)
            except InvalidRequest:
                continue  # a symlink out of the root: never read
            if real.is_file():  # not a FIFO (it would block), nor a dangling link
                yield full, real


def _show(line: str, match: re.Match[str]) -> str:
    """The line, or a window of it around the match when it is too long to show."""
    line = line.rstrip()
    if len(line) <= MAX_LINE_CHARS:
        return line
    start = max(0, min(match.start() - MAX_LINE_CHARS // 3, len(line) - MAX_LINE_CHARS))
    before = "…" if start > 0 else ""
    after = "…" if start + MAX_LINE_CHARS < len(line) else ""
    window = line[start : start + MAX_LINE_CHARS]
    return f"{before}{window}{after} [line of {len(line)} characters]"


def _search(arguments: dict[str, Any], context: ToolContext) -> str:
    pattern = _pattern(arguments)
    path, glob = _where(arguments)
    limit = min(arguments.get("max_results") or DEFAULT_MAX_RESULTS, MAX_RESULTS)
    results: list[str] = []
    notes: list[str] = []
    too_large: list[str] = []
    scanned = 0
    for count, (name, real) in enumerate(_files(context.root, path, glob)):
        if count == MAX_FILES:
            notes.append(f"[stopped after searching {MAX_FILES} files; narrow path or glob]")
            break
        if scanned >= MAX_SCAN_BYTES:
            notes.append(f"[stopped after reading {MAX_SCAN_BYTES} bytes; narrow path or glob]")
            break
        with real.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            too_large.append(name)
            continue
        scanned += len(data)
        if b"\x00" in data[:BINARY_SNIFF_BYTES]:
            continue  # binary, as git and grep judge it
        lines = data.decode("utf-8", errors="replace").splitlines()
        for number, line in enumerate(lines, start=1):
            match = pattern.search(line)
            if match is None:
                continue
            if len(results) == limit:
                break
            results.append(f"{name}:{number}: {_show(line, match)}")
        else:
            continue
        notes.append(
            f"[stopped at {limit} matches; narrow the pattern, path or glob"
            + (f", or raise max_results (up to {MAX_RESULTS})]" if limit < MAX_RESULTS else "]")
        )
        break
    if too_large:
        shown = ", ".join(too_large[:5]) + (", …" if len(too_large) > 5 else "")
        notes.append(
            f"[skipped {len(too_large)} file(s) over {MAX_FILE_BYTES} bytes: {shown}; "
            "read_file shows their start]"
        )
    return "\n".join((results or ["(no matches)"]) + notes)


search_files = FunctionTool(
    name="search_files",
    description=(
        "Search the text files of the workspace for a regular expression (Python syntax), "
        "line by line. Prints one 'path:line: text' per matching line, in path order."
    ),
    parameters={
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "a Python regular expression"},
            "path": {
                "type": "string",
                "description": "a file or directory to search, relative to the root "
                "(default: the whole workspace)",
            },
            "glob": {
                "type": "string",
                "description": "only files matching this glob, relative to path: "
                "'*.py' at any depth, 'src/*.py' with a slash; '**' crosses directories",
            },
            "ignore_case": {"type": "boolean", "description": "match regardless of case"},
            "max_results": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_RESULTS,
                "description": f"stop after this many matching lines (default "
                f"{DEFAULT_MAX_RESULTS})",
            },
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
    function=_search,
    access=_accesses,
)
