"""The local token: the one the gateway makes for the tenant ``local`` when no
``PARLEY_GATEWAY_TOKENS`` is set, kept across restarts.

A page holds the token it was opened with, so a token made anew at every start would
lock every open tab at every restart.  The token is kept in ``.local-token`` in the
gateway's data directory, ``PARLEY_WORKSPACES`` (a tenant's directory never starts with a
dot, so it is no tenant's), in a file only its owner may read; ``parley gateway
--new-token`` replaces it, and the pages opened with the old one lock.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import tempfile
from pathlib import Path

from parley.errors import InvalidRequest

TOKEN_FILE = ".local-token"
# What local_token makes (secrets.token_urlsafe of 24 bytes): a file that holds anything
# else was not written here.
_KEPT = re.compile(r"[A-Za-z0-9_-]{32}")


def local_token(data_directory: Path, *, new: bool = False) -> str:
    """The token kept in ``data_directory`` (made and kept if there is none); with
    ``new``, a fresh one that replaces it.  :class:`InvalidRequest` for a token file that
    others may read or that holds no token: neither is used."""
    path = data_directory / TOKEN_FILE
    if not new:
        kept = _read(path)
        if kept is not None:
            return kept
    try:
        _write(path, secrets.token_urlsafe(24), replace=new)
    except OSError as exc:
        raise InvalidRequest(
            f"cannot keep the local token in {data_directory}: {exc.strerror or exc}"
        ) from None
    # Two gateways starting at once each write a token: the file holds the one that
    # landed first, and both serve it.
    token = _read(path)
    assert token is not None  # (just written, and only ever replaced whole)
    return token


def _read(path: Path) -> str | None:
    try:
        # Not through a symbolic link: the file must be the owner's own, not one it names.
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InvalidRequest(
            f"the local token's file {path} cannot be read: {exc.strerror}"
        ) from None
    with os.fdopen(descriptor, encoding="ascii", errors="replace") as file:
        status = os.fstat(file.fileno())
        if status.st_uid != os.getuid() or status.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise InvalidRequest(
                f"the local token's file {path} may be read by other users (mode "
                f"{stat.S_IMODE(status.st_mode):o}): its token is not used; start with "
                "--new-token for a new one, readable by you only"
            )
        token = file.read().strip()
    if not _KEPT.fullmatch(token):
        raise InvalidRequest(
            f"the local token's file {path} holds no token: start with --new-token for a new one"
        )
    return token


def _write(path: Path, token: str, *, replace: bool) -> None:
    """Write ``token`` to ``path`` whole, mode 0600: a reader sees the old file or the new
    one, never a part.  Without ``replace``, a file that appeared meanwhile is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f"{TOKEN_FILE}.")
    try:
        with os.fdopen(descriptor, "w", encoding="ascii") as file:  # (mkstemp: mode 0600)
            file.write(token + "\n")
            file.flush()
            os.fsync(file.fileno())
        if replace:
            os.replace(temporary, path)
        else:
            # A link is made whole or not at all, and not over a file that exists: the
            # first token to land stays.
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)
