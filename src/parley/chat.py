"""``parley chat``: an interactive conversation in the terminal.

The main thread reads lines; a follower thread prints the running turn's events as they
arrive.  A line typed while a turn runs is a steer (``say``) for its next step boundary,
or, while one of its calls waits for a person, the answer (``y``, ``n`` or a reason);
Ctrl-C interrupts the running turn, and a second Ctrl-C (or one with nothing running)
quits.  Slash commands work at any time: ``/history``, ``/tree``, ``/branch N``,
``/resume``, ``/help``, ``/quit``.  Every turn is durable: ``parley chat SESSION_ID``
reopens the conversation where it was left.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rich.console import Console
from rich.text import Text

import parley
from parley.errors import ParleyError, TurnEnded
from parley.render import EventPrinter, error_line, tree_of, turn_line
from parley.schemas.events import EventKind
from parley.tree_reading import TreeReader

HELP = (
    "type a message and press Enter; while the agent works, a line steers it.\n"
    "Ctrl-C interrupts the turn (twice quits).  /history  /tree  /branch N  /resume  "
    "/help  /quit"
)
PROMPT = "[bold cyan]you>[/] "


class Chat:
    """One terminal conversation on one session."""

    def __init__(
        self,
        client: parley.Client,
        session: parley.Session,
        console: Console,
        read_line: Callable[[], str] = input,
        *,
        notices: Console | None = None,
        prints_prompt: bool = True,
    ) -> None:
        """``console`` shows the running turn as it streams; ``notices`` (default: the
        same) what the chat says in answer to the person, which must not break the
        stream's line; ``read_line`` reads what the person types, drawing the prompt
        itself unless ``prints_prompt`` (:class:`parley.chat_terminal.ChatTerminal`
        does both)."""
        self.client = client
        self.session = session
        self.console = console
        self.notices = notices or console
        self.read_line = read_line
        self.prints_prompt = prints_prompt
        self._handle: parley.TurnHandle | None = None
        self._follower: threading.Thread | None = None
        self._interrupted = False
        self._guard = threading.Lock()

    # ------------------------------------------------------------------ loop

    def run(self) -> int:
        """Read and act on lines until /quit, end of input, or a second Ctrl-C."""
        self.notices.print(f"[bold]session {self.session.id}[/]  (reopen: parley chat <id>)")
        self.notices.print(f"[dim]{HELP}[/]")
        self._prompt()
        while True:
            try:
                line = self.read_line()
            except EOFError:
                self._wait_for_turn()
                return 0
            except KeyboardInterrupt:
                if not self._on_ctrl_c():
                    return 0
                continue
            try:
                if not self._on_line(line.strip()):
                    return 0
            except KeyboardInterrupt:  # while submitting, steering or listing
                if not self._on_ctrl_c():
                    return 0

    def _on_ctrl_c(self) -> bool:
        """Interrupt the running turn; False (quit) if none runs or it was already asked."""
        handle = self._running()
        if handle is None or self._interrupted:
            self.notices.print("\n[dim]bye[/]")
            return False
        self._interrupted = True
        try:
            self.notices.print("\n[magenta]interrupting… (Ctrl-C again quits)[/]")
            handle.interrupt()
        except ParleyError as exc:  # it ended meanwhile
            self.notices.print(Text(str(exc), style="dim"))
        except KeyboardInterrupt:
            # The second Ctrl-C, pressed while the first was being handled, away from
            # the prompt (which reads a Ctrl-C as a key, not as a signal).
            self.notices.print("\n[dim]bye[/]")
            return False
        return True

    def _on_line(self, line: str) -> bool:
        """Act on one line; False to quit."""
        if not line:
            if self._running() is None:
                self._prompt()
            return True
        if line.startswith("/"):
            return self._command(line)
        handle = self._running()
        try:
            if handle is not None and self._answered(handle, line):
                return True
            if handle is not None:
                try:
                    handle.say(line)
                    self.notices.print(
                        "[yellow]✎ steer sent: it reaches the agent at the next step[/]"
                    )
                    return True
                except TurnEnded:
                    # The turn ended as the line was typed: it starts the next turn instead.
                    self._wait_for_turn()
            self._start(self.session.submit(line))
        except ParleyError as exc:
            self.notices.print(error_line(exc))
            if self._running() is None:
                self._prompt()
        return True

    def _answered(self, handle: parley.TurnHandle, line: str) -> bool:
        """While a call of the turn waits for an answer, a line answers the oldest: ``y``
        approves it, ``n`` denies it, anything else denies it with that reason."""
        waiting = handle.approvals()
        if not waiting:
            return False
        approval = waiting[0]
        if line.lower() in ("y", "yes"):
            handle.approve(approval.approval_id)
            self.notices.print(Text(f"✓ approved {approval.tool}", style="green"))
        else:
            reason = None if line.lower() in ("n", "no") else line
            handle.deny(approval.approval_id, reason=reason)
            self.notices.print(Text(f"✗ denied {approval.tool}", style="red"))
        if len(waiting) > 1:
            self._ask(waiting[1])
        return True

    def _ask(self, approval: parley.Approval) -> None:
        self.notices.print(
            Text.assemble(
                ("? ", "bold yellow"),
                (f"{approval.tool}({approval.arguments})", "yellow"),
                ("  y approves · n denies · or type why you deny it", "dim"),
            )
        )

    # ------------------------------------------------------------------ commands

    def _command(self, line: str) -> bool:
        name, _, argument = line.partition(" ")
        argument = argument.strip()
        try:
            match name:
                case "/quit" | "/exit":
                    self._wait_for_turn()
                    return False
                case "/help":
                    self.notices.print(HELP, markup=False)
                case "/history":
                    self._history()
                case "/tree":
                    session = self.session
                    self.notices.print(
                        tree_of(session.tree(), head=session.head, label=f"session {session.id}")
                    )
                case "/branch":
                    self._branch(argument)
                case "/resume":
                    self._resume()
                case _:
                    unknown = (f"unknown command {name}", "red")
                    self.notices.print(Text.assemble(unknown, "  ", HELP))
        except ParleyError as exc:
            self.notices.print(error_line(exc))
        if self._running() is None:
            self._prompt()
        return True

    def _history(self) -> None:
        turns = self.session.history()
        if not turns:
            self.notices.print("[dim](no turns yet)[/]")
        for number, turn in enumerate(turns, start=1):
            self.notices.print(f"{number:>3} ", turn_line(turn), end="\n")

    def _branch(self, argument: str) -> None:
        """Move the head to turn N of /history: the next message continues from there."""
        if self._running() is not None:
            self.notices.print("[red]a turn is running: interrupt it (Ctrl-C) first[/]")
            return
        turns = self.session.history()
        if not argument.isdecimal() or not 1 <= int(argument) <= len(turns):
            self.notices.print(f"[red]/branch takes a turn number from /history (1–{len(turns)})")
            return
        turn = turns[int(argument) - 1]
        self.session.branch_from(turn.turn_id)
        self.notices.print(f"[cyan]branched: the next message follows turn {argument}[/]")
        self.notices.print(turn_line(turn))

    def _resume(self) -> None:
        """Continue the session's newest turn if it was interrupted, failed or stranded.
        Only the newest: resuming an older one would move the head back to it and leave
        the turns after it off the conversation."""
        if self._running() is not None:
            self.notices.print("[red]a turn is already running[/]")
            return
        tree = self.session.tree()
        if not tree or not (
            tree[-1].status.resumable or tree[-1].status is parley.TurnStatus.RUNNING
        ):
            state = f"the last turn {tree[-1].status.value}" if tree else "no turns yet"
            self.notices.print(f"[dim]nothing to resume ({state})[/]")
            return
        turn = tree[-1]
        # Shown already: follow the resumed attempt from the turn's newest event on.
        seen = self.client.attach(turn.turn_id).latest_seq()
        self.notices.print(Text.assemble(("resuming ", "cyan"), turn_line(turn)))
        self._start(self.session.resume(turn.turn_id), after=seen)

    # ------------------------------------------------------------------ turns

    def _start(self, handle: parley.TurnHandle, after: int = 0) -> None:
        with self._guard:
            self._handle = handle
            self._interrupted = False
        self.console.print("[bold green]agent>[/] ", end="")
        self._follower = threading.Thread(
            target=self._follow, args=(handle, after), name="parley-chat-follow", daemon=True
        )
        self._follower.start()

    def _follow(self, handle: parley.TurnHandle, after: int) -> None:
        # Events by what they say, not by seq: a person reading along has no use for it.
        printer = EventPrinter(self.console, numbered=False)
        try:
            asked = False
            # The turn's tree: its children indented under their calls (docs/sub-agents.md).
            for event in TreeReader(handle, after):
                printer(event)
                if event.kind is EventKind.APPROVAL_REQUESTED and not asked:
                    # The step's first waiting call is asked about; the next ones after it.
                    asked = True
                    waiting = handle.approvals()
                    if waiting:
                        self._ask(waiting[0])
                elif event.kind is EventKind.STEP:
                    asked = False
        except ParleyError as exc:
            self.console.print()
            self.console.print(error_line(exc))
        finally:
            with self._guard:
                if self._handle is handle:
                    self._handle = None
            self._prompt()

    def _running(self) -> parley.TurnHandle | None:
        with self._guard:
            return self._handle

    def _wait_for_turn(self) -> None:
        follower = self._follower
        if follower is not None:
            follower.join()

    def _prompt(self) -> None:
        if self.prints_prompt:
            self.console.print(PROMPT, end="")
