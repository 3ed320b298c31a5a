"""The commands about a session: ``new``, ``history``, ``tree`` and ``chat``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

import parley
from parley.cli.connecting import CHAT_SCRIPT, client_for, environment_names_a_host
from parley.render import tree_of, turn_line


def new(args: argparse.Namespace, console: Console) -> int:
    if not args.root.strip():
        raise parley.errors.InvalidRequest("new needs a workspace directory")
    with client_for(args) as client:
        console.print(client.open_session(Path(args.root)).id)
    return 0


def history(args: argparse.Namespace, console: Console) -> int:
    with client_for(args) as client:
        session = client.session(args.session_id)
        for turn in session.history():
            console.print(turn_line(turn, full_id=True))
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
    if not (args.host or args.model or environment_names_a_host()):
        # Offline by default: a scripted agent, so the command works with nothing set up.
        args.host = f"scripted:{CHAT_SCRIPT}"
    with client_for(args, runs_turns=True) as client:
        if args.session_id:
            session = client.session(args.session_id)
        else:
            session = client.open_session(args.root)
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
