"""Terminal rendering of events, turns and trees (shared by the CLI and the demo)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from parley.schemas.compactions import CompactionRecord
from parley.schemas.events import (
    AgentEnded,
    AgentStarted,
    ApprovalAnswered,
    ApprovalRequested,
    Checked,
    Ended,
    Event,
    Payload,
    Refused,
    Started,
    Steered,
    StepCommitted,
    StepRestarted,
    Token,
    ToolAnswered,
    ToolCalled,
    WaitingForEvent,
)
from parley.schemas.records import Approval, TurnRecord, TurnStatus

OUTCOME_STYLE = {
    TurnStatus.FINISHED: "green",
    TurnStatus.SUCCEEDED: "green",
    TurnStatus.CHECK_FAILED: "yellow",
    TurnStatus.BUDGET_EXCEEDED: "yellow",
    TurnStatus.CANCELLED: "magenta",
    TurnStatus.FAILED: "red",
    TurnStatus.QUEUED: "dim",
    TurnStatus.RUNNING: "cyan",
    TurnStatus.WAITING: "yellow",
}


class EventPrinter:
    """Prints a turn's events as they arrive: tokens inline, the rest on their own line.

    A step none of whose tokens it saw (a reader that came after the turn's replay buffer
    expired) is printed from the step's committed text instead, and a turn's end says why
    it failed and which steers never reached the model.  One printer may show several
    turns.

    With ``workers`` it also names the worker that takes each turn (``host:pid:thread``,
    as the run stores it), and the one that takes it over if its worker dies.  Each line
    starts with its event's seq (what ``parley follow --after`` takes) unless not
    ``numbered``."""

    def __init__(self, console: Console, *, workers: bool = False, numbered: bool = True) -> None:
        self.console = console
        self.workers = workers
        self.numbered = numbered
        self._mid_line = False
        self._streamed: set[tuple[str, int]] = set()  # (turn, step) that showed tokens
        self._drivers: dict[str, str] = {}  # turn → the worker driving it now
        self._lines: dict[tuple[str, int], str] = {}  # a child's (turn, step) line so far

    def __call__(self, event: Event) -> None:
        path = getattr(event, "path", ())  # a tree's event (docs/sub-agents.md)
        if path:
            self._child(event, path)
            return
        payload = event.payload
        if isinstance(payload, Started):
            if self.workers:
                self._print_line(self._claimed(event, payload))
            return
        if isinstance(payload, (Ended, ApprovalRequested)):
            # Its driver let go: a later claim is a resume, not a takeover.
            self._drivers.pop(event.turn_id, None)
        if isinstance(payload, Token):
            self._streamed.add((event.turn_id, payload.step))
            self._print_inline(payload.text)
            return
        if isinstance(payload, StepCommitted):
            if payload.text and (event.turn_id, payload.step) not in self._streamed:
                self._print_inline(payload.text)
        elif isinstance(payload, Ended):
            self._streamed = {s for s in self._streamed if s[0] != event.turn_id}
        for line in self._describe(self._seq(event.seq), payload):
            self._print_line(line)

    def _child(self, event: Event, path: Sequence[Mapping[str, str]]) -> None:
        """A descendant's event, indented by its depth under its agent's name: its text
        a whole line at a time (children stream at once, and their tokens inline would
        interleave mid-word), its other lines as the turn's own are."""
        agent = str(path[-1].get("agent", "agent")).rsplit("/", 1)[-1]
        label = Text.assemble(("  " * len(path), ""), (f"{agent} │ ", "bold blue"))
        payload = event.payload
        if isinstance(payload, (Token, StepCommitted, Ended)):
            for text in self._child_text(event.turn_id, payload):
                self._print_line(Text.assemble(label, (text, "bold")))
            if isinstance(payload, Token):
                return
            if isinstance(payload, Ended):
                self._streamed = {s for s in self._streamed if s[0] != event.turn_id}
        elif isinstance(payload, Started):
            if self.workers:
                self._print_line(Text.assemble(label, self._claimed(event, payload, seq="")))
            return
        for line in self._describe("", payload):
            self._print_line(Text.assemble(label, line))

    def _child_text(self, turn_id: str, payload: Token | StepCommitted | Ended) -> list[str]:
        """A child's lines of text that are whole now: those a token completed, the rest
        of a step at its commit (its committed text if none of its tokens came), what is
        left at its end."""
        if isinstance(payload, Ended):
            ends = [k for k in self._lines if k[0] == turn_id]
            return [rest for rest in (self._lines.pop(k) for k in ends) if rest.strip()]
        key = (turn_id, payload.step)
        if isinstance(payload, Token):
            self._streamed.add(key)
            *complete, self._lines[key] = (self._lines.get(key, "") + payload.text).split("\n")
            return complete
        rest = self._lines.pop(key, "")
        if key not in self._streamed:
            rest = payload.text
        return rest.split("\n") if rest.strip() else []

    def _claimed(self, event: Event, started: Started, seq: str | None = None) -> Text:
        before = self._drivers.get(event.turn_id)
        self._drivers[event.turn_id] = started.worker
        shown = Text(self._seq(event.seq) if seq is None else seq, "dim")
        if before is None:
            took = Text.assemble(("▶ worker ", "cyan"), (started.worker, "bold cyan"), " took it")
        else:
            # A claim while another worker had it: that one died or lost the session.
            took = Text.assemble(
                ("▶ worker ", "magenta"),
                (started.worker, "bold magenta"),
                (f" took it over from {before}", "magenta"),
            )
        return Text.assemble(shown, took, (f" (attempt {started.attempt})", "dim"))

    def _print_line(self, line: Text) -> None:
        if self._mid_line:
            self.console.print()
            self._mid_line = False
        self.console.print(line)

    def _print_inline(self, text: str) -> None:
        self.console.print(Text(text, style="bold"), end="", soft_wrap=True)
        self._mid_line = True

    def _seq(self, seq: int) -> str:
        return f"{seq:>3} " if self.numbered else ""

    @classmethod
    def _describe(cls, seq: str, payload: Payload) -> list[Text]:
        if isinstance(payload, (AgentStarted, AgentEnded)):
            return [cls._agent_line(seq, payload)]
        if isinstance(payload, WaitingForEvent):
            return [waiting_line(seq, payload)]
        line = cls._line(seq, payload)
        lines = [] if line is None else [line]
        if isinstance(payload, Ended):
            if payload.error:
                lines.append(Text(f"    {payload.error}", style=OUTCOME_STYLE[TurnStatus.FAILED]))
            for text in payload.undelivered:
                lines.append(Text.assemble(("    ✎ steer not delivered: ", "yellow"), text))
        return lines

    @staticmethod
    def _agent_line(seq: str, payload: AgentStarted | AgentEnded) -> Text:
        """A child turn a call opened, or its end (docs/sub-agents.md)."""
        if isinstance(payload, AgentStarted):
            return Text.assemble(
                (seq, "dim"),
                ("↳ ", "blue"),
                (payload.agent, "bold blue"),
                (f" started (turn {payload.turn_id})", "blue"),
            )
        outcome = TurnStatus(payload.outcome)
        return Text.assemble(
            (seq, "dim"),
            ("↲ ", OUTCOME_STYLE[outcome]),
            (payload.agent or "agent", "bold"),
            (f" {outcome.value}", OUTCOME_STYLE[outcome]),
        )

    @staticmethod
    def _line(seq: str, payload: Payload) -> Text | None:
        match payload:
            case ToolCalled(name=name, arguments=arguments):
                return Text.assemble((seq, "dim"), ("→ ", "cyan"), (f"{name}({arguments})", "cyan"))
            case ToolAnswered(content=content, is_error=is_error):
                shown = content.strip().replace("\n", " ⏎ ")
                style = "red" if is_error else "dim"
                return Text.assemble((seq, "dim"), ("← ", style), (shown[:100], style))
            case Refused(rule=rule):
                return Text.assemble(
                    (seq, "dim"), ("✋ refused by ", "bold red"), (rule, "bold red")
                )
            case Steered(text=text):
                return Text.assemble(
                    (seq, "dim"), ("✎ steer delivered: ", "bold yellow"), (text, "yellow")
                )
            case ApprovalRequested(approval_id=approval_id, tool=tool, arguments=arguments):
                return Text.assemble(
                    (seq, "dim"),
                    ("? waiting for an answer: ", "bold yellow"),
                    (f"{tool}({arguments})", "yellow"),
                    (f"  parley approve TURN {approval_id}", "dim"),
                )
            case ApprovalAnswered(decision=decision, reason=reason):
                style = "green" if decision == "approved" else "red"
                why = f": {reason}" if reason else ""
                return Text.assemble((seq, "dim"), (f"✓ {decision}{why}", style))
            case StepRestarted(step=step):
                return Text.assemble((seq, "dim"), (f"↺ step {step} restarted", "magenta"))
            case Checked(passed=passed):
                verdict = "passed" if passed else "failed"
                return Text.assemble((seq, "dim"), (f"check {verdict}", "yellow"))
            case Ended(outcome=outcome_name):
                outcome = TurnStatus(outcome_name)
                return Text.assemble(
                    (seq, "dim"),
                    ("■ ", OUTCOME_STYLE[outcome]),
                    (outcome.value, OUTCOME_STYLE[outcome]),
                )
            case _:
                return None


def waiting_line(seq: str, waiting: WaitingForEvent) -> Text:
    """A call that waits for an event or a time (docs/time.md#waiting-for-an-event)."""
    what = f"event {waiting.event}" if waiting.event else "a time"
    return Text.assemble(
        (seq, "dim"),
        (f"⏸ waiting for {what}", "bold yellow"),
        (f" until {waiting.until}" if waiting.until else "", "yellow"),
    )


def approval_line(approval: Approval) -> Text:
    """One call that asked for an answer: its id (whole, to copy), the call, the answer."""
    answer = approval.decision.value if approval.decision else "waiting"
    style = {"approved": "green", "denied": "red"}.get(answer, "yellow")
    text = Text.assemble(
        (approval.approval_id, "dim"),
        " ",
        (f"[{answer}]", style),
        " ",
        f"{approval.tool}({approval.arguments})",
    )
    if approval.reason:
        text.append(f"  {approval.reason}", style="italic")
    return text


def error_line(exc: BaseException) -> Text:
    """An error as one line of plain text (its message may hold anything, brackets too)."""
    return Text.assemble((f"{type(exc).__name__}: ", "bold red"), str(exc))


def turn_line(turn: TurnRecord, *, head: str | None = None, full_id: bool = False) -> Text:
    """One turn: id (its first 8 characters unless ``full_id``, for a command line whose
    output is copied into the next command), outcome, prompt and reply."""
    style = OUTCOME_STYLE[turn.status]
    turn_id = turn.turn_id if full_id else turn.turn_id[:8]
    text = Text.assemble((turn_id, "dim"), " ", (f"[{turn.status.value}]", style), " ", turn.prompt)
    if turn.reply:
        text.append(f"  → {turn.reply[:70]}", style="italic")
    if head is not None and turn.turn_id == head:
        text.append("  ◀ head", style="bold cyan")
    return text


def compaction_line(record: CompactionRecord, *, applies: bool) -> Text:
    """A compaction, marked where it sits in a history (after the newest turn it
    covers): strategy, sizes, id, and whether it is the one the next turn is sent."""
    text = Text.assemble(
        ("── compacted ", "bold magenta"),
        (f"[{record.strategy}] ", "magenta"),
        f"{record.tokens_before} → {record.tokens_after} tokens, the turns above ",
        ("(applies) " if applies else "(superseded) ", "bold" if applies else "dim"),
        (record.compaction_id, "dim"),
    )
    return text


def tree_of(
    turns: Sequence[TurnRecord], *, head: str | None, label: str, full_ids: bool = False
) -> Tree:
    """A session's turns as a rich tree (children in submission order)."""
    tree = Tree(Text(label, style="bold"))
    nodes: dict[str | None, Tree] = {None: tree}
    for turn in turns:
        parent = nodes.get(turn.parent_id, tree)
        nodes[turn.turn_id] = parent.add(turn_line(turn, head=head, full_id=full_ids))
    return tree
