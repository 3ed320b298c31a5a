"""Where a tenant's sessions keep their files: ``<PARLEY_WORKSPACES>/<tenant>/<name>``,
made on first use, never a link or a path out of the tenant's directory."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from parley.errors import InvalidRequest
from parley.settings import Settings

# A tenant's name is a directory under PARLEY_WORKSPACES, and a workspace's a directory
# under that: one pattern for both, which no path trick gets through.  (The gateway's
# tokens are held to the same, in parley.gateway.settings.)
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
NAME = re.compile(NAME_PATTERN)


def check_tenant(tenant: Any) -> None:
    """:class:`InvalidRequest` unless ``tenant`` is a tenant's name (or None): what the
    gateway's tokens may name, so that it is one directory under ``PARLEY_WORKSPACES``
    (not ``../..``, nor an absolute path)."""
    if tenant is not None and (not isinstance(tenant, str) or not NAME.fullmatch(tenant)):
        raise InvalidRequest(f"tenant must be None or a name matching {NAME_PATTERN}")


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


def workspaces_dir(settings: Settings) -> Path:
    """``PARLEY_WORKSPACES`` (default ``./workspaces``), absolute: where the gateway and
    a batch submitted from Python make the workspaces of the sessions they open."""
    return Path(settings.workspaces or "workspaces").absolute()


class LineRoots:
    """The workspaces of the sessions a batch's lines open: ``<workspaces>/<tenant>/<id>``
    as the gateway makes them, or ``<workspaces>/<id>`` for a batch without a tenant.
    The tenant's directory is made and resolved once; each line's is named before its
    session is written, and made, with one ``mkdir``, once it is (a hundred thousand lines
    make as many directories)."""

    def __init__(self, workspaces: Path, tenant: str | None) -> None:
        base = workspaces / tenant if tenant is not None else workspaces
        base.mkdir(parents=True, exist_ok=True)
        self._base = os.path.realpath(base)

    def path(self, session_id: str) -> str:
        """The directory the session ``session_id`` (a fresh id) will have."""
        return os.path.join(self._base, session_id)

    def make(self, root: str) -> None:
        """Make ``root``, a :meth:`path` (a fresh id's: it cannot exist, nor be a link
        someone planted)."""
        os.mkdir(root)
