"""Where a tenant's sessions keep their files: ``<PARLEY_WORKSPACES>/<tenant>/<name>``,
made on first use, never a link or a path out of the tenant's directory."""

from __future__ import annotations

import os
from pathlib import Path

from parley.errors import InvalidRequest


def workspace_root(workspaces: Path, owner: str, name: str) -> Path:
    """The directory ``<workspaces>/<tenant>/<name>``, made if missing.  ``name`` has
    matched the workspace pattern already (no separator, no ``..``); a directory that is
    a symbolic link, or resolves outside the tenant's, is refused."""
    base = workspaces / owner
    base.mkdir(parents=True, exist_ok=True)
    root = base / name
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        raise InvalidRequest(f"workspace {name!r} is not a plain directory")
    root.mkdir(exist_ok=True)
    if Path(os.path.realpath(root)).parent != Path(os.path.realpath(base)):
        raise InvalidRequest(f"workspace {name!r} is not a plain directory")
    return root
