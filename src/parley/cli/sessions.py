"""The commands about a session: ``new``, ``history``, ``tree`` and ``chat``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

import parley
from parley.cli.connecting import client_for, default_tenant
from parley.render import compaction_line, tree_of, turn_line
from parley.schemas.compactions import applicable


def new(args: argparse.Namespace, console: Console) -> int:
    if not args.root.strip():
        raise parley.errors.InvalidRequest("new needs a workspace directory")
    with client_for(args) as client:
        console.print(client.open_session(Path(args.root), tenant=default_tenant(client)).id)
    return 0


def history(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        session = client.session(args.session_id)
        turns = session.history()
        ids = [t.turn_id for t in turns]
        # A compaction is marked after the newest turn it covers; the next turn is sent
        # the one that applies instead of the turns above it (docs/compaction.md).
        marks = [c for c in session.compactions() if not c.dropped and c.through_turn_id in ids]
        applies = applicable(marks, ids)
        for turn in turns:
            console.print(turn_line(turn, full_id=True))
            for mark in (c for c in marks if c.through_turn_id == turn.turn_id):
                console.print(compaction_line(mark, applies=mark == applies))
    return 0


def tree(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        session = client.session(args.session_id)
        shown = tree_of(
            session.tree(), head=session.head, label=f"session {session.id}", full_ids=True
        )
        console.print(shown)
    return 0


def chat(args: argparse.Namespace, console: Console) -> int:
    from parley.chat import Chat

    if args.host and args.model:
        raise parley.errors.InvalidRequest("chat takes --host or --model, not both")
    with client_for(args, runs_turns=True) as client:
        if args.session_id:
            session = client.session(args.session_id)
        else:
            session = client.open_session(args.root, tenant=default_tenant(client))
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            return Chat(client, session, console).run()  # lines from a pipe, say
        from parley.chat_terminal import ChatTerminal

        with ChatTerminal() as terminal:
            chat = Chat(
                client,
                session,
                terminal.console,
                terminal.read_line,
                notices=terminal.notices,
                prints_prompt=False,
            )
            return chat.run()
