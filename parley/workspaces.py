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


def line_root(workspaces: Path, tenant: str | None, session_id: str) -> Path:
    """The workspace of a session a batch's line opens: ``<workspaces>/<tenant>/<id>``
    as the gateway makes them, or ``<workspaces>/<id>`` for a batch without a tenant."""
    if tenant is not None:
        return workspace_root(workspaces, tenant, session_id)
    workspaces.mkdir(parents=True, exist_ok=True)
    root = workspaces / session_id
    root.mkdir(exist_ok=True)
    return root
