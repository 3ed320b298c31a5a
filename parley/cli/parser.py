"""The command line's grammar: the global options and every command's arguments, each
command bound to the function that runs it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parley.cli import batches, fleet, maintenance, sessions, turns
from parley.cli.gateway import gateway
from parley.client import DEFAULT_DATABASE_URL

Commands = Any  # argparse's subparsers action (its class is private)


def command_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parley", description="Durable, steerable LLM-agent conversations."
    )
    parser.add_argument(
        "--db",
        help=f"database URL (env PARLEY_DATABASE_URL; default {DEFAULT_DATABASE_URL})",
    )
    parser.add_argument(
        "--host",
        help="host that runs turns: package.module:attribute or scripted:path.json "
        "(env PARLEY_HOST)",
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    # In the order `parley --help` lists them.
    for add in (
        _demo,
        _migrate,
        _worker,
        _beat,
        _new,
        _submit,
        _resume,
        _follow,
        _say,
        _interrupt,
        _history,
        _chat,
        _approve,
        _batch,
        _gateway,
        _prune,
        _tree,
        _status,
    ):
        add(commands)
    return parser


def _command(
    commands: Commands,
    name: str,
    run: Callable[..., int],
    summary: str,
    *,
    names_stored: bool = False,
    daemon: bool = False,
) -> argparse.ArgumentParser:
    """A command run by ``run``, ``summary`` its line in ``parley --help``.
    ``names_stored``: it is about a session or turn already stored, so it refuses a
    SQLite database that is not there (as does ``chat SESSION``).  ``daemon``: one of
    the fleet's long-running processes, which log what they do (INFO and above)."""
    command: argparse.ArgumentParser = commands.add_parser(name, help=summary)
    command.set_defaults(
        command=run, names_stored=names_stored, daemon=daemon, takes_celery_args=False
    )
    return command


def _demo(commands: Commands) -> None:
    demo = _command(
        commands, "demo", maintenance.demo, "the whole story offline, in under a minute"
    )
    demo.add_argument("--dir", type=Path, help="keep the demo's database and workspace here")


def _migrate(commands: Commands) -> None:
    _command(commands, "migrate", maintenance.migrate, "bring the database schema up to date")


def _worker(commands: Commands) -> None:
    worker = _command(
        commands,
        "worker",
        fleet.worker,
        "a fleet worker (Celery); extra arguments go to `celery worker`",
        daemon=True,
    )
    worker.set_defaults(takes_celery_args=True)


def _beat(commands: Commands) -> None:
    _command(
        commands,
        "beat",
        fleet.beat,
        "the fleet's sweeper: re-kicks sessions whose work has no live driver",
        daemon=True,
    )


def _new(commands: Commands) -> None:
    new = _command(commands, "new", sessions.new, "open a session about a workspace; prints its id")
    new.add_argument("root")


def _submit(commands: Commands) -> None:
    submit = _command(
        commands, "submit", turns.submit, "run a turn and print it live", names_stored=True
    )
    submit.add_argument("session_id")
    submit.add_argument("prompt", nargs="?", help="the prompt (-: read it from stdin)")
    submit.add_argument(
        "--prompt-file", metavar="PATH", help="read the prompt from this file (-: from stdin)"
    )
    submit.add_argument("--request-id")
    submit.add_argument(
        "--priority",
        choices=("interactive", "batch"),
        default="interactive",
        help="the turn's lane: its kick and its model calls go first when interactive",
    )
    submit.add_argument("--max-steps", type=int)
    submit.add_argument("--max-tokens", type=int)
    submit.add_argument(
        "--check", help="a shell command that must pass (needs --max-steps or --max-tokens)"
    )


def _resume(commands: Commands) -> None:
    resume = _command(
        commands,
        "resume",
        turns.resume,
        "continue a cancelled, failed or stranded turn here and print it live",
        names_stored=True,
    )
    resume.add_argument("turn_id")


def _follow(commands: Commands) -> None:
    follow = _command(
        commands,
        "follow",
        turns.follow,
        "print a turn's events until it ends (a stranded turn waits for a driver)",
        names_stored=True,
    )
    follow.add_argument("turn_id")
    follow.add_argument(
        "--after", type=int, default=0, help="only the events after this seq (default: all)"
    )


def _say(commands: Commands) -> None:
    say = _command(
        commands,
        "say",
        turns.say,
        "steer a turn: a message the model reads at its next step boundary",
        names_stored=True,
    )
    say.add_argument("turn_id")
    say.add_argument("text", nargs="?", help="the message (-: read it from stdin)")
    say.add_argument(
        "--text-file", metavar="PATH", help="read the message from this file (-: from stdin)"
    )


def _interrupt(commands: Commands) -> None:
    interrupt = _command(
        commands,
        "interrupt",
        turns.interrupt,
        "stop a turn at its next step boundary (it stays resumable)",
        names_stored=True,
    )
    interrupt.add_argument("turn_id")


def _history(commands: Commands) -> None:
    history = _command(
        commands,
        "history",
        sessions.history,
        "the turns from the root to the head",
        names_stored=True,
    )
    history.add_argument("session_id")


def _chat(commands: Commands) -> None:
    chat = _command(
        commands,
        "chat",
        sessions.chat,
        "talk to an agent in this terminal: type to steer, Ctrl-C interrupts",
    )
    chat.add_argument("session_id", nargs="?", help="reopen this session (default: a new one)")
    chat.add_argument(
        "--root", type=Path, default=Path.cwd(), help="workspace of a new session (default: .)"
    )
    chat.add_argument(
        "--model",
        help="openai:<model>, anthropic:<model>, scripted:<path> or a comma-separated "
        "fallover list (default: PARLEY_MODEL, else an offline scripted agent); keys come "
        "from OPENAI_API_KEY / ANTHROPIC_API_KEY",
    )


def _approve(commands: Commands) -> None:
    approve = _command(
        commands,
        "approve",
        turns.approve,
        "answer a tool call that waits for a person (default: approve it)",
        names_stored=True,
    )
    approve.add_argument("turn_id")
    approve.add_argument(
        "approval_id", nargs="?", help="the call to answer (default: list the waiting ones)"
    )
    approve.add_argument("--deny", metavar="REASON", help="deny it, telling the model why")


def _gateway(commands: Commands) -> None:
    command = _command(
        commands,
        "gateway",
        gateway,
        "the HTTP gateway and web page (embedded on SQLite, a fleet producer on "
        "PostgreSQL with PARLEY_REDIS_URL)",
        daemon=True,
    )
    command.add_argument(
        "--bind",
        metavar="HOST:PORT",
        help="where to listen (default 127.0.0.1:$PORT, PORT default 8000); any address "
        "but loopback needs PARLEY_GATEWAY_TOKENS",
    )
    command.add_argument(
        "--new-token",
        action="store_true",
        help="without PARLEY_GATEWAY_TOKENS: replace the local token kept across restarts "
        "with a new one (pages opened with the old one lock)",
    )


def _batch(commands: Commands) -> None:
    batch: argparse.ArgumentParser = commands.add_parser(
        "batch", help="submit a JSONL file of lines as a batch, follow it, collect it"
    )
    actions = batch.add_subparsers(required=True, metavar="ACTION")
    submit = _command(
        actions,
        "submit",
        batches.submit,
        "submit FILE.jsonl; prints the batch's id first (a progress bar on a terminal)",
    )
    submit.add_argument("file", metavar="FILE.jsonl")
    submit.add_argument("--wait", action="store_true", help="wait until the batch ends")
    submit.add_argument("--root", help="the workspace of every session its lines open")
    submit.add_argument("--tenant", help="the tenant that owns the batch and its sessions")
    submit.add_argument("--request-id", help="the same id submits the batch once")
    status = _command(actions, "status", batches.status, "where a batch stands", names_stored=True)
    status.add_argument("batch_id")
    status.add_argument("--json", action="store_true", help="the Batch object, as JSON")
    results = _command(
        actions,
        "results",
        batches.results,
        "the output and error lines as JSONL, as the lines end",
        names_stored=True,
    )
    results.add_argument("batch_id")
    results.add_argument("-o", "--output", metavar="OUT.jsonl", help="write them here")
    cancel = _command(actions, "cancel", batches.cancel, "cancel a batch", names_stored=True)
    cancel.add_argument("batch_id")


def _prune(commands: Commands) -> None:
    prune = _command(
        commands,
        "prune",
        maintenance.prune,
        "delete ended sessions idle for more than DAYS days (or past their own "
        "retention), each in a transaction of its own; never one with a turn in flight",
        names_stored=True,
    )
    prune.add_argument("--older-than", metavar="DAYS", required=True, help="days (0 or more)")
    prune.add_argument(
        "--workspaces", action="store_true", help="also remove their workspace directories"
    )
    prune.add_argument("--dry-run", action="store_true", help="list them; delete nothing")


def _tree(commands: Commands) -> None:
    tree = _command(
        commands, "tree", sessions.tree, "every turn of every branch", names_stored=True
    )
    tree.add_argument("session_id")


def _status(commands: Commands) -> None:
    status = _command(
        commands,
        "status",
        maintenance.status,
        "the fleet's state: queued, running and waiting turns, live workers",
    )
    status.add_argument("--json", action="store_true", help="one JSON object, for machines")
    status.add_argument(
        "--timeout",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how long live workers have to answer (default 1)",
    )
