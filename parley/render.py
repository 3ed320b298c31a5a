"""Terminal rendering of events, turns and trees (shared by the CLI and the demo)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from schemas.events import Event, EventKind
from schemas.records import TurnRecord, TurnStatus

OUTCOME_STYLE = {
    TurnStatus.FINISHED: "green",
    TurnStatus.SUCCEEDED: "green",
    TurnStatus.CHECK_FAILED: "yellow",
    TurnStatus.BUDGET_EXCEEDED: "yellow",
    TurnStatus.CANCELLED: "magenta",
    TurnStatus.FAILED: "red",
    TurnStatus.QUEUED: "dim",
    TurnStatus.RUNNING: "cyan",
}


class EventPrinter:
    """Prints a turn's events as they arrive: tokens inline, the rest on their own line."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._mid_line = False

    def __call__(self, event: Event) -> None:
        kind, data = event.kind, event.data
        if kind is EventKind.TOKEN:
            self.console.print(Text(data["text"], style="bold"), end="", soft_wrap=True)
            self._mid_line = True
            return
        line = self._describe(event)
        if line is None:
            return
        if self._mid_line:
            self.console.print()
            self._mid_line = False
        self.console.print(line)

    @staticmethod
    def _describe(event: Event) -> Text | None:
        data = event.data
        seq = f"{event.seq:>3} "
        match event.kind:
            case EventKind.TOOL_CALL:
                return Text.assemble(
                    (seq, "dim"), ("→ ", "cyan"), (f"{data['name']}({data['arguments']})", "cyan")
                )
            case EventKind.TOOL_RESULT:
                content = str(data["content"]).strip().replace("\n", " ⏎ ")
                style = "red" if data["is_error"] else "dim"
                return Text.assemble((seq, "dim"), ("← ", style), (content[:100], style))
            case EventKind.REFUSAL:
                return Text.assemble(
                    (seq, "dim"), ("✋ refused by ", "bold red"), (data["rule"], "bold red")
                )
            case EventKind.STEER:
                return Text.assemble(
                    (seq, "dim"), ("✎ steer delivered: ", "bold yellow"), (data["text"], "yellow")
                )
            case EventKind.STEP_RESTARTED:
                return Text.assemble((seq, "dim"), (f"↺ step {data['index']} restarted", "magenta"))
            case EventKind.CHECK:
                verdict = "passed" if data["passed"] else "failed"
                return Text.assemble((seq, "dim"), (f"check {verdict}", "yellow"))
            case EventKind.END:
                outcome = TurnStatus(data["outcome"])
                return Text.assemble(
                    (seq, "dim"),
                    ("■ ", OUTCOME_STYLE[outcome]),
                    (outcome.value, OUTCOME_STYLE[outcome]),
                )
            case _:
                return None


def turn_line(turn: TurnRecord, *, head: str | None = None) -> Text:
    """One turn: short id, outcome, prompt and reply."""
    style = OUTCOME_STYLE[turn.status]
    text = Text.assemble(
        (turn.turn_id[:8], "dim"), " ", (f"[{turn.status.value}]", style), " ", turn.prompt
    )
    if turn.reply:
        text.append(f"  → {turn.reply[:70]}", style="italic")
    if head is not None and turn.turn_id == head:
        text.append("  ◀ head", style="bold cyan")
    return text


def tree_of(turns: Sequence[TurnRecord], *, head: str | None, label: str) -> Tree:
    """A session's turns as a rich tree (children in submission order)."""
    tree = Tree(Text(label, style="bold"))
    nodes: dict[str | None, Tree] = {None: tree}
    for turn in turns:
        parent = nodes.get(turn.parent_id, tree)
        nodes[turn.turn_id] = parent.add(turn_line(turn, head=head))
    return tree
