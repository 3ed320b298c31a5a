"""How a command gets its client: the database from ``--db`` or the environment, and a
host only when the command runs turns in this process (on a fleet the workers hold it),
and the tenant of what it makes when none is named.

A command that runs turns (``submit``, ``resume``, ``chat``, ``gateway``, ``batch
submit``) runs them, embedded, with the host named by ``--host``, ``--model`` or the
environment, else with the offline scripted agent, and says so once on stderr: a fresh
clone's every command works with nothing set up, and says how to name a real model.  The
decision is :func:`turn_host`'s alone."""

from __future__ import annotations

import argparse
from pathlib import Path

import parley
from parley.cli.output import notice
from parley.client import database_url_of
from parley.deployment import LOCAL_TENANT, is_fleet
from parley.host import host_from_settings
from parley.store.database import sqlite_file

CHAT_SCRIPT = Path(__file__).parent.parent / "demo" / "chat.json"
"""The offline scripted agent a command runs turns with when no host is named."""

OFFLINE_NOTICE = (
    "no model named: an offline scripted agent answers (name a real one with "
    "PARLEY_MODEL=openai:gpt-4o-mini, or a host with PARLEY_HOST or --host)"
)
"""The line a command that runs turns with the offline agent prints first, on stderr."""


def client_for(args: argparse.Namespace, *, runs_turns: bool = False) -> parley.Client:
    """The command's client; with ``runs_turns``, embedded, it has the host
    :func:`turn_host` decides."""
    url = database_url_of(args.db, args.settings)
    if args.names_stored or getattr(args, "session_id", None):
        refuse_missing_sqlite(url)
    host = turn_host(args, url) if runs_turns else None
    return parley.connect(url, host=host, settings=args.settings)


def default_tenant(client: parley.Client) -> str | None:
    """The tenant of the sessions and batches a command makes with none named: embedded,
    the tenant ``local``, the gateway's local token's, so that ``parley gateway`` on the
    same database shows them; on a fleet none, as from Python (its gateway's tenants are
    named by its tokens)."""
    return None if client.fleet else LOCAL_TENANT


def turn_host(args: argparse.Namespace, url: str) -> parley.Host | None:
    """The host a command that runs turns on ``url`` runs them with: none on a fleet (the
    workers hold it); else the one ``--host``, ``--model`` or the environment names;
    else the offline scripted agent, said on stderr."""
    if is_fleet(url, args.settings):
        return None
    if not names_a_host(args):
        notice(OFFLINE_NOTICE, "yellow")
        return parley.load_host(f"scripted:{CHAT_SCRIPT}")
    if args.host:
        return parley.load_host(args.host)
    model = getattr(args, "model", None)
    if model:
        return parley.Host(model=parley.models.model_from_spec(model, args.settings.credentials))
    return host_from_settings(args.settings)


def names_a_host(args: argparse.Namespace) -> bool:
    """Whether the command was given a host (``--host``, ``--model``) or its environment
    names one.  The commands that run turns only if so (``interrupt``, ``approve`` and
    ``batch results`` drive on what they answer or find undriven) never run them with
    the offline agent: they may meet work a real model was asked to do."""
    return bool(
        args.host or getattr(args, "model", None) or args.settings.host or args.settings.model
    )


def refuse_missing_sqlite(url: str) -> None:
    """A mistyped SQLite path must not leave a new, empty database behind."""
    path = sqlite_file(url)
    if path is not None and not path.exists():
        raise parley.errors.InvalidRequest(f"no database at {path}")
