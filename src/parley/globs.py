"""Path globs for policies: ``*`` stays inside one directory, ``**`` crosses them."""

from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=512)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """Compile a glob over POSIX relative paths.

    ``**/`` matches zero or more whole directories, a trailing ``**`` matches everything
    below, ``*`` matches within one path segment, ``?`` one character of a segment."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def glob_match(pattern: str, path: str) -> bool:
    """Whether the relative POSIX ``path`` matches ``pattern``."""
    return compile_glob(pattern).match(path) is not None
