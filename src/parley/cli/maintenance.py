"""Commands that look after a deployment rather than a conversation: ``demo``,
``migrate``, ``prune`` and ``status``."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.text import Text

import parley
from parley.cli.connecting import client_for, refuse_missing_sqlite
from parley.client import database_url_of
from parley.store import database


def demo(args: argparse.Namespace, console: Console) -> int:
    from parley.demo import run_demo

    return run_demo(console, args.dir)


def migrate(args: argparse.Namespace, console: Console) -> int:
    # Past a pooler, to PostgreSQL itself when the operator names it: a migration's DDL
    # and the locks it takes are a session's work, not a transaction pooler's.
    settings = args.settings
    engine = database.create_database_engine(
        args.db or settings.database_direct_url or database_url_of(None, settings),
        pooler=settings.database_pooler,
    )
    revision = database.migrate(engine)
    engine.dispose()
    console.print(f"schema at revision {revision}")
    return 0


def prune(args: argparse.Namespace, console: Console) -> int:
    from parley.retention import days, report_lines

    older_than = days(args.older_than)  # refused before anything is opened
    with client_for(args) as client:
        report = client.prune(older_than, workspaces=args.workspaces, dry_run=args.dry_run)
    for line in report_lines(report):
        console.print(Text(line), soft_wrap=True)
    return 0


def status(args: argparse.Namespace, console: Console) -> int:
    from parley.status import fleet_status

    if not 0 < args.timeout <= 60:
        raise parley.errors.InvalidRequest("--timeout takes a number of seconds from 0 to 60")
    url = database_url_of(args.db, args.settings)
    refuse_missing_sqlite(url)
    report = fleet_status(url, args.settings, ping_seconds=args.timeout)
    if args.json:
        # One line, as written: no markup, no wrapping.
        console.print(json.dumps(report.to_json()), markup=False, highlight=False, soft_wrap=True)
    else:
        for line in report.lines():
            console.print(Text(line), soft_wrap=True)
    return 0
