"""How a command gets its client: the database from ``--db`` or the environment, and a
host only when the command runs turns in this process (on a fleet the workers hold it)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import parley
from parley.client import database_url_of
from parley.deployment import is_fleet
from parley.host import host_from_environment
from workers.store.database import sqlite_file

CHAT_SCRIPT = Path(__file__).parent.parent / "demo" / "chat.json"
"""The offline scripted agent of ``parley chat`` and the gateway when no host is named."""


def client_for(args: argparse.Namespace, *, runs_turns: bool = False) -> parley.Client:
    """The command's client; with ``runs_turns``, embedded, it has the host named by
    ``--host``, ``--model`` or the environment (an error if none is)."""
    url = database_url_of(args.db)
    if args.names_stored or getattr(args, "session_id", None):
        refuse_missing_sqlite(url)
    # On a fleet the workers hold the host: its producer needs none.
    needs_host = runs_turns and not is_fleet(url)
    host: parley.Host | None
    if not needs_host:
        host = None  # reading needs no model: a misconfigured PARLEY_MODEL must not matter
    elif args.host:
        host = parley.load_host(args.host)
    elif getattr(args, "model", None):
        host = parley.Host(model=parley.models.model_from_spec(args.model))
    else:
        host = host_from_environment()
    if needs_host and host is None:
        raise parley.errors.InvalidRequest(
            "no host: pass --host, set PARLEY_HOST, or name a model in PARLEY_MODEL"
        )
    return parley.connect(url, host=host)


def refuse_missing_sqlite(url: str) -> None:
    """A mistyped SQLite path must not leave a new, empty database behind."""
    path = sqlite_file(url)
    if path is not None and not path.exists():
        raise parley.errors.InvalidRequest(f"no database at {path}")


def environment_names_a_host() -> bool:
    return bool(os.environ.get("PARLEY_HOST") or os.environ.get("PARLEY_MODEL"))
