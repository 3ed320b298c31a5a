"""Confinement of paths to a session's root (used by the built-in tools and the policy)."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from parley.errors import InvalidRequest


def confine(root: str, path: str) -> Path:
    """The real path of ``path`` inside ``root``.

    Refused: absolute paths, any path whose normalised form leaves the root (``..``), and
    paths that leave it through a symlink (checked on the resolved path, so a link to
    ``/etc`` inside the root is refused too).  Missing files are allowed (for writes)."""
    if not isinstance(path, str) or not path.strip():
        raise InvalidRequest("a path is required")
    if "\x00" in path:
        raise InvalidRequest("a path may not contain NUL")
    if PurePosixPath(path).is_absolute() or os.path.isabs(path):
        raise InvalidRequest(
            f"absolute path {path!r} refused: paths are relative to the session root"
        )
    base = Path(root).resolve()
    lexical = os.path.normpath(os.path.join(base, path))
    if not _within(base, Path(lexical)):
        raise InvalidRequest(f"path {path!r} leaves the session root")
    resolved = Path(lexical).resolve()
    if not _within(base, resolved):
        raise InvalidRequest(f"path {path!r} leaves the session root through a symlink")
    return resolved


def relative(root: str, path: str) -> str:
    """The confined path, relative to the root, in POSIX form (what policies match)."""
    base = Path(root).resolve()
    rel = confine(root, path).relative_to(base).as_posix()
    return "." if rel == "" else rel


def _within(base: Path, candidate: Path) -> bool:
    return candidate == base or base in candidate.parents
