"""The ``parley`` command line (docs/reference.md, "Command line").

Configuration comes from the environment (``PARLEY_DATABASE_URL``, ``PARLEY_HOST``) or
the matching options.  Errors from :mod:`parley.errors` print one clear line and exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

import parley
from parley.client import (
    DEFAULT_DATABASE_URL,
    MAX_PROMPT_BYTES,
    MAX_STEER_BYTES,
    database_url_of,
)
from parley.errors import ParleyError
from parley.host import host_from_environment
from parley.logs import LogFormat, celery_worker_logging, configure_logging, log_format
from parley.render import EventPrinter, approval_line, error_line, tree_of, turn_line
from workers.store.database import create_database_engine, migrate, sqlite_file
from workers.telemetry.log_context import log_scope

CHAT_SCRIPT = Path(__file__).parent / "demo" / "chat.json"

UNCLAIMED_NOTICE_SECONDS = 5.0
"""How long a fleet turn that `submit` or `resume` watches may stay queued, with nothing
of its session running, before the command says that no worker has taken it."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status."""
    parser = _parser()
    # `parley worker` hands whatever it does not know to `celery worker`.
    args, extra = parser.parse_known_args(argv)
    if extra and args.command is not _worker:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.celery_args = extra
    console = Console(highlight=False)
    try:
        _configure_logging(args)
        # The lines a command logs name the session or turn it works on, once the client
        # has found it (a daemon's requests and turns set their own).
        with contextlib.nullcontext() if args.command in DAEMONS else log_scope():
            status: int = args.command(args, console)
    except ParleyError as exc:
        # On stderr and on one line, so that `S=$(parley new …)` never captures an error.
        Console(stderr=True, highlight=False).print(error_line(exc), soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        return 130
    return status


def _parser() -> argparse.ArgumentParser:
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

    demo = commands.add_parser("demo", help="the whole story offline, in under a minute")
    demo.add_argument("--dir", type=Path, help="keep the demo's database and workspace here")
    demo.set_defaults(command=_demo)

    commands.add_parser("migrate", help="bring the database schema up to date").set_defaults(
        command=_migrate
    )

    commands.add_parser(
        "worker", help="a fleet worker (Celery); extra arguments go to `celery worker`"
    ).set_defaults(command=_worker)

    commands.add_parser(
        "beat", help="the fleet's sweeper: re-kicks sessions whose work has no live driver"
    ).set_defaults(command=_beat)

    new = commands.add_parser("new", help="open a session about a workspace; prints its id")
    new.add_argument("root")
    new.set_defaults(command=_new)

    submit = commands.add_parser("submit", help="run a turn and print it live")
    submit.add_argument("session_id")
    submit.add_argument("prompt", nargs="?", help="the prompt (-: read it from stdin)")
    submit.add_argument(
        "--prompt-file", metavar="PATH", help="read the prompt from this file (-: from stdin)"
    )
    submit.add_argument("--request-id")
    submit.add_argument("--max-steps", type=int)
    submit.add_argument("--max-tokens", type=int)
    submit.add_argument(
        "--check", help="a shell command that must pass (needs --max-steps or --max-tokens)"
    )
    submit.set_defaults(command=_submit)

    resume = commands.add_parser(
        "resume", help="continue a cancelled, failed or stranded turn here and print it live"
    )
    resume.add_argument("turn_id")
    resume.set_defaults(command=_resume)

    follow = commands.add_parser(
        "follow", help="print a turn's events until it ends (a stranded turn waits for a driver)"
    )
    follow.add_argument("turn_id")
    follow.add_argument(
        "--after", type=int, default=0, help="only the events after this seq (default: all)"
    )
    follow.set_defaults(command=_follow)

    say = commands.add_parser(
        "say", help="steer a turn: a message the model reads at its next step boundary"
    )
    say.add_argument("turn_id")
    say.add_argument("text", nargs="?", help="the message (-: read it from stdin)")
    say.add_argument(
        "--text-file", metavar="PATH", help="read the message from this file (-: from stdin)"
    )
    say.set_defaults(command=_say)

    interrupt = commands.add_parser(
        "interrupt", help="stop a turn at its next step boundary (it stays resumable)"
    )
    interrupt.add_argument("turn_id")
    interrupt.set_defaults(command=_interrupt)

    history = commands.add_parser("history", help="the turns from the root to the head")
    history.add_argument("session_id")
    history.set_defaults(command=_history)

    chat = commands.add_parser(
        "chat",
        help="talk to an agent in this terminal: type to steer, Ctrl-C interrupts",
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
    chat.set_defaults(command=_chat)

    approve = commands.add_parser(
        "approve", help="answer a tool call that waits for a person (default: approve it)"
    )
    approve.add_argument("turn_id")
    approve.add_argument(
        "approval_id", nargs="?", help="the call to answer (default: list the waiting ones)"
    )
    approve.add_argument("--deny", metavar="REASON", help="deny it, telling the model why")
    approve.set_defaults(command=_approve)

    gateway = commands.add_parser(
        "gateway",
        help="the HTTP gateway and web page (embedded on SQLite, a fleet producer on "
        "PostgreSQL with PARLEY_REDIS_URL)",
    )
    gateway.add_argument(
        "--bind",
        metavar="HOST:PORT",
        help="where to listen (default 127.0.0.1:$PORT, PORT default 8000); any address "
        "but loopback needs PARLEY_GATEWAY_TOKENS",
    )
    gateway.add_argument(
        "--new-token",
        action="store_true",
        help="without PARLEY_GATEWAY_TOKENS: replace the local token kept across restarts "
        "with a new one (pages opened with the old one lock)",
    )
    gateway.set_defaults(command=_gateway)

    prune = commands.add_parser(
        "prune",
        help="delete ended sessions idle for more than DAYS days (or past their own "
        "retention), each in a transaction of its own; never one with a turn in flight",
    )
    prune.add_argument("--older-than", metavar="DAYS", required=True, help="days (0 or more)")
    prune.add_argument(
        "--workspaces", action="store_true", help="also remove their workspace directories"
    )
    prune.add_argument("--dry-run", action="store_true", help="list them; delete nothing")
    prune.set_defaults(command=_prune)

    tree = commands.add_parser("tree", help="every turn of every branch")
    tree.add_argument("session_id")
    tree.set_defaults(command=_tree)

    status = commands.add_parser(
        "status", help="the fleet's state: queued, running and waiting turns, live workers"
    )
    status.add_argument("--json", action="store_true", help="one JSON object, for machines")
    status.add_argument(
        "--timeout",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how long live workers have to answer (default 1)",
    )
    status.set_defaults(command=_status)
    return parser


def _client(args: argparse.Namespace, *, runs_turns: bool = False) -> parley.Client:
    url = database_url_of(args.db)
    if args.command in NAMES_STORED or getattr(args, "session_id", None):
        # A mistyped SQLite path must not leave a new, empty database behind.
        path = sqlite_file(url)
        if path is not None and not path.exists():
            raise parley.errors.InvalidRequest(f"no database at {path}")
    # On a fleet the workers hold the host: its producer needs none.
    needs_host = runs_turns and not _is_fleet(url)
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


def _is_fleet(url: str) -> bool:
    """Whether a client of ``url`` is a fleet producer, as ``parley.connect`` decides: not
    SQLite, and ``PARLEY_REDIS_URL`` set."""
    engine = create_database_engine(url)
    fleet = engine.dialect.name != "sqlite" and bool(os.environ.get("PARLEY_REDIS_URL"))
    engine.dispose()
    return fleet


def _demo(args: argparse.Namespace, console: Console) -> int:
    from parley.demo import run_demo

    return run_demo(console, args.dir)


def _migrate(args: argparse.Namespace, console: Console) -> int:
    engine = create_database_engine(database_url_of(args.db))
    revision = migrate(engine)
    engine.dispose()
    console.print(f"schema at revision {revision}")
    return 0


def _worker(args: argparse.Namespace, console: Console) -> int:
    _fleet_environment(args)
    import click
    from celery.bin.celery import celery

    from parley.celery_tasks import app, settings

    argv = [
        *("--app", "parley.celery_tasks:app", *celery_worker_logging(app, args.log_format)),
        *("worker", "--queues", settings.queue, "--loglevel", "INFO", *args.celery_args),
    ]
    if not any(a in ("-n", "--hostname") or a.startswith("--hostname=") for a in argv):
        # A node name of its own: Celery's default (celery@HOST) is the same for every
        # worker on a host, and on RabbitMQ two of them fight over one exclusive control
        # queue, the loser of a reconnect exiting.
        argv += ["--hostname", f"parley-{os.getpid()}@%h"]
    # Celery's own exit status (1 after an "Unrecoverable error"), which app.worker_main
    # drops: a worker that cannot go on must not look like one that was told to stop.
    try:
        status = celery.main(args=argv, standalone_mode=False)
    except click.ClickException as exc:  # a mistyped Celery option: its usage, no traceback
        exc.show()
        return exc.exit_code
    return int(status or 0)


def _beat(args: argparse.Namespace, console: Console) -> int:
    _fleet_environment(args)
    from parley.celery_tasks import run_sweeper

    run_sweeper()
    return 0


def _fleet_environment(args: argparse.Namespace) -> None:
    """A fleet process is configured by its environment alone: the options, when given,
    are that environment."""
    if args.db:
        os.environ["PARLEY_DATABASE_URL"] = args.db
    if args.host:
        os.environ["PARLEY_HOST"] = args.host


def _new(args: argparse.Namespace, console: Console) -> int:
    if not args.root.strip():
        raise parley.errors.InvalidRequest("new needs a workspace directory")
    with _client(args) as client:
        console.print(client.open_session(Path(args.root)).id)
    return 0


def _submit(args: argparse.Namespace, console: Console) -> int:
    # Read before anything is opened: a missing file or an empty stdin changes nothing.
    prompt, source = _text_argument(
        args.prompt, args.prompt_file, what="prompt", option="--prompt-file", limit=MAX_PROMPT_BYTES
    )
    contract = None
    if args.max_steps is not None or args.max_tokens is not None or args.check is not None:
        contract = parley.TaskContract(
            max_steps=args.max_steps, max_tokens=args.max_tokens, check=args.check
        )
    with _client(args, runs_turns=True) as client:
        session = client.session(args.session_id)
        handle = session.submit(prompt, contract=contract, request_id=args.request_id)
        console.print(_prompt_line(prompt, source), soft_wrap=True)
        with _unclaimed_notice(client, handle):
            return _watch(handle, console, workers=client.fleet)


def _resume(args: argparse.Namespace, console: Console) -> int:
    with _client(args, runs_turns=True) as client:
        turn = client.attach(args.turn_id)
        seen = turn.latest_seq()  # what came before is history: `follow` shows it
        handle = client.session(turn.session_id).resume(turn.turn_id)
        with _unclaimed_notice(client, handle):
            return _watch(handle, console, after=seen, workers=client.fleet)


@contextlib.contextmanager
def _unclaimed_notice(client: parley.Client, handle: parley.TurnHandle) -> Iterator[None]:
    """While the block runs: once, if the fleet turn is still queued after
    :data:`UNCLAIMED_NOTICE_SECONDS` and nothing of its session runs, say on stderr that
    no worker has taken it (otherwise the command would wait without a word for a worker
    that may not exist)."""
    if not client.fleet:
        yield  # this process drives the turn
        return

    def notice() -> None:
        try:
            statuses = {t.turn_id: t.status for t in client.session(handle.session_id).tree()}
        except parley.errors.ParleyError:
            return  # (the store is out of reach: the watch itself says so)
        if (
            statuses.get(handle.turn_id) is parley.TurnStatus.QUEUED
            and parley.TurnStatus.RUNNING not in statuses.values()
        ):
            line = (
                f"turn {handle.turn_id} is queued and no worker has taken it in "
                f"{UNCLAIMED_NOTICE_SECONDS:g} s: is `parley worker` running?"
            )
            Console(stderr=True, highlight=False).print(Text(line, "yellow"), soft_wrap=True)

    timer = threading.Timer(UNCLAIMED_NOTICE_SECONDS, notice)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _watch(
    handle: parley.TurnHandle, console: Console, after: int = 0, *, workers: bool = False
) -> int:
    """Print a turn's events (after ``after``) until it ends, then its id; the exit
    status is 0 for ``finished`` or ``succeeded``, else 1.  Ctrl-C interrupts the turn (it
    stops at its next step boundary and stays resumable); a second Ctrl-C leaves it to
    itself.  With ``workers``, say which worker takes the turn (on a fleet)."""
    printer = EventPrinter(console, workers=workers)
    seen = after
    try:
        for event in handle.events(after=after):
            printer(event)
            seen = event.seq
    except KeyboardInterrupt:
        console.print(Text("\ninterrupting: the turn stops at its next step boundary", "magenta"))
        with contextlib.suppress(parley.errors.TurnEnded):  # it ended as Ctrl-C was pressed
            handle.interrupt()
        for event in handle.events(after=seen):
            printer(event)
    result = handle.wait()
    console.print(Text(f"turn {result.turn_id}", style="dim"))
    if result.outcome is parley.TurnStatus.CANCELLED:
        console.print(Text(f"continue it with: parley resume {result.turn_id}", "dim"))
    return 0 if result.outcome in (parley.TurnStatus.FINISHED, parley.TurnStatus.SUCCEEDED) else 1


def _chat(args: argparse.Namespace, console: Console) -> int:
    from parley.chat import Chat

    if args.host and args.model:
        raise parley.errors.InvalidRequest("chat takes --host or --model, not both")
    if not (args.host or args.model or _environment_names_a_host()):
        # Offline by default: a scripted agent, so the command works with nothing set up.
        args.host = f"scripted:{CHAT_SCRIPT}"
    with _client(args, runs_turns=True) as client:
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


def _approve(args: argparse.Namespace, console: Console) -> int:
    # Embedded, the process that answers the last call drives the turn on, if it has the
    # host (--host, PARLEY_HOST, PARLEY_MODEL); on a fleet a worker does.
    runs_turns = bool(args.host or _environment_names_a_host())
    with _client(args, runs_turns=runs_turns) as client:
        handle = client.attach(args.turn_id)
        if args.approval_id is None:
            if args.deny is not None:
                raise parley.errors.InvalidRequest("--deny needs the APPROVAL_ID it answers")
            waiting = handle.approvals()
            for approval in waiting:
                console.print(approval_line(approval), soft_wrap=True)
            if not waiting:
                console.print(Text("no call of this turn waits for an answer", "dim"))
            return 0
        if args.deny is not None:
            answered = handle.deny(args.approval_id, reason=args.deny or None)
        else:
            answered = handle.approve(args.approval_id)
        console.print(approval_line(answered), soft_wrap=True)
        if handle.approvals() or client.fleet:
            return 0  # more answers to come, or a worker goes on with it
        if not runs_turns:
            console.print(
                Text(
                    f"every answer is in: `parley resume {handle.turn_id}` (with the host) "
                    "goes on with the turn",
                    "dim",
                ),
                soft_wrap=True,
            )
            return 0
        printer = EventPrinter(console)
        for event in handle.events(after=handle.latest_seq()):
            printer(event)
    return 0


def _gateway(args: argparse.Namespace, console: Console) -> int:
    from parley.gateway.server import Bind, admitted, serve
    from parley.gateway.settings import GatewaySettings

    bind = Bind.parse(args.bind)
    settings = admitted(GatewaySettings.from_environment(), bind, new_token=args.new_token)
    # The port before the database: one in use stops the start with nothing opened.
    with bind.listen() as listening:
        url = database_url_of(args.db)
        note = None
        if _is_fleet(url):
            # A fleet producer and reader: the workers hold the host.
            if args.host:
                raise parley.errors.InvalidRequest(
                    "on a fleet the workers hold the host: --host is for the embedded gateway"
                )
            client = parley.connect(url)
        else:
            # Embedded: this process runs the turns.  With no host named, the offline
            # scripted agent of `parley chat`, so a fresh clone serves a working page.
            if not (args.host or _environment_names_a_host()):
                args.host = f"scripted:{CHAT_SCRIPT}"
                note = (
                    "the model is an offline script (set PARLEY_HOST or PARLEY_MODEL for a "
                    "real one)"
                )
                settings = dataclasses.replace(settings, sample_files=True)
            client = _client(args, runs_turns=True)
        return serve(client, bind, listening, settings, note=note)


def _say(args: argparse.Namespace, console: Console) -> int:
    text, _source = _text_argument(
        args.text, args.text_file, what="message", option="--text-file", limit=MAX_STEER_BYTES
    )
    with _client(args) as client:
        handle = client.attach(args.turn_id)
        position = handle.say(text)
        console.print(
            f"steer {position} accepted: the model reads it at the turn's next step boundary",
            soft_wrap=True,
        )
    return 0


def _interrupt(args: argparse.Namespace, console: Console) -> int:
    # Embedded, interrupting a turn that waits for answers denies them, and the process
    # with the host (--host, PARLEY_HOST, PARLEY_MODEL) commits the turn's end; on a fleet
    # a worker does.
    runs_turns = bool(args.host or _environment_names_a_host())
    with _client(args, runs_turns=runs_turns) as client:
        handle = client.attach(args.turn_id)
        handle.interrupt()
        console.print(
            f"interrupt accepted: the turn stops at its next step boundary; continue it "
            f"with: parley resume {handle.turn_id}",
            soft_wrap=True,
        )
    return 0


def _text_argument(
    given: str | None, path: str | None, *, what: str, option: str, limit: int
) -> tuple[str, str | None]:
    """The text a command takes: ``given`` on the command line, or read from the file
    ``path``, or from stdin (``-`` as either); and where it was read from (None: the
    command line).  At most ``limit`` bytes are read: a larger text is refused, as the
    client would refuse it, without reading the rest."""
    if given is not None and path is not None:
        raise parley.errors.InvalidRequest(f"give the {what} or {option}, not both")
    if given is not None and given != "-":
        return given, None
    path = path or given
    if path is None:
        raise parley.errors.InvalidRequest(
            f"no {what}: give it, or {option} PATH (- reads it from stdin)"
        )
    if path == "-":
        source = "stdin"
        data = sys.stdin.buffer.read(limit + 1)
    else:
        source = path
        try:
            with open(path, "rb") as file:
                data = file.read(limit + 1)
        except OSError as exc:
            raise parley.errors.InvalidRequest(
                f"cannot read the {what} from {path}: {exc.strerror or exc}"
            ) from None
    if len(data) > limit:
        raise parley.errors.InvalidRequest(
            f"the {what} from {source} is over the limit of {limit} bytes"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise parley.errors.InvalidRequest(
            f"the {what} from {source} is not UTF-8 text (byte {exc.start})"
        ) from None
    if not text.strip():
        raise parley.errors.InvalidRequest(f"the {what} from {source} is empty")
    return text, source


def _prompt_line(prompt: str, source: str | None) -> Text:
    """The prompt echoed: whole when given on the command line; read from a file or
    stdin (a large one, most likely), its first line and its size."""
    line = Text("you: ", "bold")
    if source is None:
        return line.append(prompt)
    first = prompt.strip().splitlines()[0]
    line.append(first if len(first) <= 80 else first[:79] + "…")
    return line.append(f"  ({len(prompt)} characters from {source})", "dim")


def _follow(args: argparse.Namespace, console: Console) -> int:
    with _client(args) as client:
        printer = EventPrinter(console, workers=True)
        for event in client.attach(args.turn_id).events(after=args.after):
            printer(event)
    return 0


def _history(args: argparse.Namespace, console: Console) -> int:
    with _client(args) as client:
        session = client.session(args.session_id)
        for turn in session.history():
            console.print(turn_line(turn, full_id=True))
    return 0


def _tree(args: argparse.Namespace, console: Console) -> int:
    with _client(args) as client:
        session = client.session(args.session_id)
        tree = tree_of(
            session.tree(), head=session.head, label=f"session {session.id}", full_ids=True
        )
        console.print(tree)
    return 0


def _prune(args: argparse.Namespace, console: Console) -> int:
    from parley.retention import days, report_lines

    older_than = days(args.older_than)  # refused before anything is opened
    with _client(args) as client:
        report = client.prune(older_than, workspaces=args.workspaces, dry_run=args.dry_run)
    for line in report_lines(report):
        console.print(Text(line), soft_wrap=True)
    return 0


def _status(args: argparse.Namespace, console: Console) -> int:
    from parley.status import fleet_status

    if not 0 < args.timeout <= 60:
        raise parley.errors.InvalidRequest("--timeout takes a number of seconds from 0 to 60")
    url = database_url_of(args.db)
    path = sqlite_file(url)
    if path is not None and not path.exists():
        raise parley.errors.InvalidRequest(f"no database at {path}")
    report = fleet_status(url, ping_seconds=args.timeout)
    if args.json:
        # One line, as written: no markup, no wrapping.
        console.print(json.dumps(report.to_json()), markup=False, highlight=False, soft_wrap=True)
    else:
        for line in report.lines():
            console.print(Text(line), soft_wrap=True)
    return 0


NAMES_STORED = (
    _follow,
    _history,
    _tree,
    _submit,
    _resume,
    _approve,
    _say,
    _interrupt,
    _prune,
)
"""Commands about a session or turn already stored: they refuse a SQLite database that is
not there (as does ``chat SESSION``)."""

DAEMONS = (_worker, _beat, _gateway)
"""The fleet's long-running processes: they log what they do (INFO and above)."""


def _configure_logging(args: argparse.Namespace) -> None:
    """``PARLEY_LOG_FORMAT`` for this process (a value it does not know stops the command
    before anything else happens).  A daemon logs its work; any other command logs only
    warnings, and in text leaves them to Python's default (the message alone) as it
    always has."""
    args.log_format = log_format()
    if args.command in DAEMONS:
        configure_logging(logging.INFO, args.log_format)
    elif args.log_format is LogFormat.JSON:
        configure_logging(logging.WARNING, args.log_format)


def _environment_names_a_host() -> bool:
    return bool(os.environ.get("PARLEY_HOST") or os.environ.get("PARLEY_MODEL"))


if __name__ == "__main__":
    sys.exit(main())
