"""``parley demo``: the whole story offline, on SQLite, with the scripted model.

A turn that reads a file and streams its answer; a policy refusal; a steer mid-turn; an
interrupt and a resume of the same turn; a branch and the tree; and a second process that
reopens the session with nothing but its id.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.rule import Rule

import parley
from parley import ToolContext
from parley.errors import InvalidRequest
from parley.render import EventPrinter, tree_of, turn_line
from parley.schemas.events import EventKind
from parley.tools import WORKSPACE_TOOLS, FunctionTool

SCRIPT = Path(__file__).with_name("script.json")

FILES = {
    "retry.py": "RETRY_ON = (502, 504)\nATTEMPTS = 3\n\n\ndef backoff(attempt: int) -> float:\n"
    "    return 0.2 * 2**attempt\n",
    "config.toml": "[pool]\nsize = 10\n",
    "secrets/api_token.txt": "tok-OLD\n",
    "docs/README.md": "# Service docs\n",
}


def _apply_migration(arguments: dict[str, Any], context: ToolContext) -> str:
    # Slow on purpose: the interrupt in chapter 4 lands while this runs, and the step
    # still commits whole with its result.
    time.sleep(0.8)
    log = Path(context.root) / "migration.log"
    with log.open("a") as out:
        out.write(f"applied step {arguments['step']}\n")
    return f"applied migration step {arguments['step']}"


APPLY_MIGRATION = FunctionTool(
    name="apply_migration",
    description="Apply one step of the connection-pool migration.",
    parameters={
        "type": "object",
        "properties": {"step": {"type": "integer"}},
        "required": ["step"],
        "additionalProperties": False,
    },
    function=_apply_migration,
)


def demo_host() -> parley.Host:
    """The demo's host (also what the second process loads: PARLEY_HOST=parley.demo:demo_host)."""
    return parley.Host(
        model=parley.models.ScriptedModel(SCRIPT),
        system_prompt="You are a careful engineer working in this repository.",
        tools=[*WORKSPACE_TOOLS, APPLY_MIGRATION],
        policy=parley.Policy(deny_write=["secrets/**"]),
    )


def run_demo(console: Console, workdir: Path | None = None) -> int:
    """Play the story; returns the exit status."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="parley-demo-") as tmp:
            return _story(console, Path(tmp))
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidRequest(f"cannot keep the demo in {workdir}: {exc}") from exc
    return _story(console, workdir)


def _story(console: Console, workdir: Path) -> int:
    root = workdir / "workspace"
    for name, content in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    database = f"sqlite:///{workdir / 'runs.db'}"
    host = demo_host()
    console.print(
        Panel.fit(
            "[bold]parley demo[/]: a durable, steerable agent conversation, offline.\n"
            f"database [cyan]{escape(database)}[/]\nworkspace [cyan]{escape(str(root))}[/]",
            border_style="cyan",
        )
    )
    with parley.connect(database, host=host) as client:
        session = client.open_session(root, metadata={"demo": True})
        console.print(f"session [bold cyan]{session.id}[/]\n")
        show = EventPrinter(console)

        chapter(console, "1. A turn reads a file and streams its answer")
        first = ask(console, session, "what does the retry policy retry?", show)

        chapter(console, "2. The policy refuses a write; the turn goes on")
        ask(console, session, "rotate the API token", show)
        console.print(
            "   secrets/api_token.txt still holds "
            f"[bold]{(root / 'secrets/api_token.txt').read_text().strip()}[/]"
        )

        _steer_mid_turn(console, session, show)
        _interrupt_then_resume(console, session, show, root)
        _branch(console, session, show, first.turn_id)

    if not _second_process(console, database, session.id):
        return 1
    console.print(Rule(style="green"), width=rule_width(console))
    console.print("[bold green]demo complete[/]: every turn above is durable in", escape(database))
    return 0


def _steer_mid_turn(console: Console, session: parley.Session, show: EventPrinter) -> None:
    chapter(console, "3. A steer mid-turn reaches the model at the next step boundary")
    prompt(console, "bring the docs up to date")
    handle = session.submit("bring the docs up to date")
    steered = False
    for event in handle.events():
        show(event)
        if event.kind is EventKind.TOKEN and not steered:
            steered = True
            handle.say("actually, only touch the docs")
            console.print(
                "\n   [yellow]operator says:[/] actually, only touch the docs", highlight=False
            )
    reply(console, handle.wait())


def _interrupt_then_resume(
    console: Console, session: parley.Session, show: EventPrinter, root: Path
) -> None:
    chapter(console, "4. An interrupt stops the turn at a boundary; resume continues it")
    prompt(console, "migrate the connection pool")
    handle = session.submit("migrate the connection pool")
    seen = 0
    for event in handle.events():
        show(event)
        seen = event.seq
        if event.kind is EventKind.TOOL_CALL:
            handle.interrupt()
            console.print(
                "   [magenta]operator interrupts[/] while the tool runs: the step commits whole"
            )
    cancelled = handle.wait()
    console.print(
        f"   outcome [magenta]{cancelled.outcome}[/] after {cancelled.steps} committed "
        f"step(s); reply {cancelled.reply}; "
        f"migration.log: {(root / 'migration.log').read_text().splitlines()}"
    )
    resumed = session.resume(handle.turn_id)
    console.print(f"   resume: same turn {resumed.turn_id[:8]} and run {resumed.run_id[:8]}")
    for event in resumed.events(after=seen):
        show(event)
    reply(console, resumed.wait())


def _branch(console: Console, session: parley.Session, show: EventPrinter, turn_id: str) -> None:
    chapter(console, "5. Branch from the first turn; the abandoned branch stays readable")
    session.branch_from(turn_id)
    ask(console, session, "and what about 503?", show)
    console.print(tree_of(session.tree(), head=session.head, label=f"session {session.id[:8]}"))
    console.print("   history (what the model sees next):")
    for turn in session.history():
        console.print("   ", turn_line(turn))


def _second_process(console: Console, database: str, session_id: str) -> bool:
    chapter(console, "6. A second process reopens the session with only its id")
    env = {**os.environ, "PARLEY_DATABASE_URL": database, "PARLEY_HOST": "parley.demo:demo_host"}
    for argv in (["history", session_id], ["submit", session_id, "where were we?"]):
        console.print(f"   [dim]$ parley {' '.join(argv)}[/]", highlight=False)
        completed = subprocess.run(
            [sys.executable, "-m", "parley", *argv],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        console.print(completed.stdout.rstrip(), highlight=False, markup=False)
        if completed.returncode != 0:
            console.print(f"[red]the second process failed:[/] {escape(completed.stderr)}")
            return False
    return True


def chapter(console: Console, title: str) -> None:
    """A chapter heading."""
    console.print()
    console.print(Rule(f"[bold]{title}", align="left", style="cyan"), width=rule_width(console))


def rule_width(console: Console) -> int:
    """A rule spans the terminal; off one (piped), the console's width is the never-wrap
    one of the command line's output, and a rule that wide would be thousands of dashes."""
    return console.width if console.is_terminal else 80


def prompt(console: Console, text: str) -> None:
    """Echo the operator's prompt."""
    console.print(f"[bold]you:[/] {text}", highlight=False)


def ask(
    console: Console, session: parley.Session, text: str, show: EventPrinter
) -> parley.TurnResult:
    """Run an observed turn and print its reply."""
    prompt(console, text)
    result = session.turn(text, on_event=show)
    reply(console, result)
    return result


def reply(console: Console, result: parley.TurnResult) -> None:
    """The turn's closing line."""
    console.print(
        f"   [dim]turn {result.turn_id[:8]} · {result.steps} step(s) · "
        f"{result.usage.input_tokens}+{result.usage.output_tokens} tokens[/]"
    )
