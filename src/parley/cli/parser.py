"""The command line's grammar: the global options and every command's arguments, each
command bound to the function that runs it.  The global options (``--db``, ``--host``)
go before the command or after it: ``parley batch submit in.jsonl --db sqlite:///x.db``
is ``parley --db sqlite:///x.db batch submit in.jsonl``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parley.cli import batches, fleet, maintenance, schedules, sessions, turns, worker_processes
from parley.cli.gateway import gateway
from parley.client import DEFAULT_DATABASE_URL

Commands = Any  # argparse's subparsers action (its class is private)


def command_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parley", description="Durable, steerable LLM-agent conversations."
    )
    _global_options(parser, default=None)
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
        _signal,
        _batch,
        _schedule,
        _replay,
        _gateway,
        _prune,
        _tree,
        _status,
    ):
        add(commands)
    return parser


def _global_options(parser: argparse.ArgumentParser, *, default: Any) -> None:
    """``--db`` and ``--host``: ``parley``'s own, and each command's too with ``default``
    ``SUPPRESS`` (a command's parser writes only what it was given over the value
    ``parley``'s parsed, so either place works)."""
    parser.add_argument(
        "--db",
        default=default,
        help=f"database URL (env PARLEY_DATABASE_URL; default {DEFAULT_DATABASE_URL})",
    )
    parser.add_argument(
        "--host",
        default=default,
        help="host that runs turns: package.module:attribute or scripted:path.json "
        "(env PARLEY_HOST; with no host named, embedded, an offline scripted agent)",
    )


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
    _global_options(command, default=argparse.SUPPRESS)
    command.set_defaults(
        command=run, names_stored=names_stored, daemon=daemon, takes_celery_args=False
    )
    return command


def _demo(commands: Commands) -> None:
    demo = _command(
        commands, "demo", maintenance.demo, "the whole story offline, in about ten seconds"
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
    worker.add_argument(
        "--processes",
        type=worker_processes.processes_option,
        help="worker processes, supervised as one worker, each with the Celery options "
        "given (env PARLEY_WORKER_PROCESSES; default: one per core; 1 on the prefork pool)",
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
    when = submit.add_mutually_exclusive_group()
    when.add_argument(
        "--at",
        metavar="TIME",
        help="start no earlier than this ISO 8601 time, with its offset (docs/time.md)",
    )
    when.add_argument(
        "--after", metavar="SECONDS", type=float, help="start no earlier than this from now"
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


def _signal(commands: Commands) -> None:
    signal = _command(
        commands,
        "signal",
        turns.signal,
        "send an event to a turn: the call waiting for it wakes with the payload",
        names_stored=True,
    )
    signal.add_argument("turn_id")
    signal.add_argument("name", help="the event's name")
    signal.add_argument(
        "payload", nargs="?", help="a JSON value, the waiting call's result (default: null)"
    )


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


def _replay(commands: Commands) -> None:
    from parley.cli import replays

    command = _command(
        commands,
        "replay",
        replays.replay,
        "replay recorded sessions against a model; write the report page and its JSON",
        names_stored=True,
    )
    source = command.add_mutually_exclusive_group(required=True)
    source.add_argument("--sessions", metavar="FILE", help="one session id a line")
    source.add_argument(
        "--batch", metavar="ID", help="report on the replay batch ID made before (its first line)"
    )
    command.add_argument(
        "--model", help="the model, as PARLEY_MODEL names one (default: the host's)"
    )
    command.add_argument("--system-prompt", help="instead of the host's")
    command.add_argument("--tools", choices=("recorded", "live"), default="recorded")
    command.add_argument("--report", required=True, metavar="OUT.html", help="the page to write")
    command.add_argument(
        "--timeout", type=float, default=None, help="seconds to wait for every turn"
    )


def _batch(commands: Commands) -> None:
    batch: argparse.ArgumentParser = commands.add_parser(
        "batch", help="submit a JSONL file of lines as a batch, follow it, collect it"
    )
    _global_options(batch, default=argparse.SUPPRESS)
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
    listed = _command(
        actions,
        "list",
        batches.list_batches,
        "the batches, newest first: status and counts",
        names_stored=True,
    )
    listed.add_argument("--json", action="store_true", help="OpenAI's list of Batch objects")
    listed.add_argument("--tenant", help="only this tenant's (default: every tenant's)")
    listed.add_argument(
        "--limit", type=int, default=20, metavar="N", help="at most N (1 to 100; default 20)"
    )
    listed.add_argument("--after", metavar="ID", help="those made before the batch ID")
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


def _schedule(commands: Commands) -> None:
    schedule: argparse.ArgumentParser = commands.add_parser(
        "schedule", help="submit a prompt on a cron in a time zone, each slot once"
    )
    _global_options(schedule, default=argparse.SUPPRESS)
    actions = schedule.add_subparsers(required=True, metavar="ACTION")
    add = _command(
        actions, "add", schedules.add, "add a schedule: CRON (five fields) PROMPT; prints its id"
    )
    add.add_argument("cron", metavar="CRON")
    add.add_argument("prompt", metavar="PROMPT")
    add.add_argument("--timezone", default="UTC", metavar="TZ", help="an IANA zone (default UTC)")
    add.add_argument("--session", metavar="ID", help="each firing is a turn of this session")
    add.add_argument(
        "--overlap",
        default="skip",
        metavar="MODE",
        help="while the previous firing's turn runs: skip (default), enqueue or interrupt",
    )
    add.add_argument("--root", help="without --session: each firing's session's workspace")
    add.add_argument("--tenant", help="the tenant that owns it and the sessions it opens")
    add.add_argument(
        "--priority", default="batch", help="the turns' lane: batch (default) or interactive"
    )
    add.add_argument("--name", help="what lists show, and its sessions' title")
    listed = _command(
        actions,
        "list",
        schedules.list_schedules,
        "the schedules: cron, zone, next slot",
        names_stored=True,
    )
    listed.add_argument("--tenant", help="only this tenant's (default: every tenant's)")
    listed.add_argument("--json", action="store_true", help="each schedule as JSON")
    for name, run, summary in (
        ("pause", schedules.pause, "fire nothing until resumed"),
        ("resume", schedules.resume, "fire again, from the next slot"),
        ("delete", schedules.delete, "delete a schedule and the record of its slots"),
    ):
        action = _command(actions, name, run, summary, names_stored=True)
        action.add_argument("schedule_id", metavar="ID")


def _prune(commands: Commands) -> None:
    prune = _command(
        commands,
        "prune",
        maintenance.prune,
        "delete ended sessions idle for more than DAYS days (or past their own "
        "retention), each whole; never one with a turn in flight",
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
