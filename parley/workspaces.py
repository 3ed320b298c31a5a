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


def workspaces_dir() -> Path:
    """``PARLEY_WORKSPACES`` (default ``./workspaces``), absolute: where the gateway and
    a batch submitted from Python make the workspaces of the sessions they open."""
    return Path(os.environ.get("PARLEY_WORKSPACES") or "workspaces").absolute()


class LineRoots:
    """The workspaces of the sessions a batch's lines open: ``<workspaces>/<tenant>/<id>``
    as the gateway makes them, or ``<workspaces>/<id>`` for a batch without a tenant.
    The tenant's directory is made and resolved once; each line's is a fresh id's, made
    with one ``mkdir`` (a hundred thousand lines make as many directories)."""

    def __init__(self, workspaces: Path, tenant: str | None) -> None:
        base = workspaces / tenant if tenant is not None else workspaces
        base.mkdir(parents=True, exist_ok=True)
        self._base = os.path.realpath(base)

    def make(self, session_id: str) -> str:
        """The new directory of the session ``session_id`` (a fresh id: it cannot exist,
        nor be a link someone planted)."""
        root = os.path.join(self._base, session_id)
        os.mkdir(root)
        return root
