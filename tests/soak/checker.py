"""After the run, the history checker: it reads only the store (the soak's PostgreSQL), the
ledger the tools appended to, and the journal the clients kept, and names every place where
they disagree with parley's guarantees.  Each violation carries its turn, so the report can
print the turn's events beside it."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from parley.coordination.constants import TAKEOVER_SEQ_GAP
from tests.soak.journal import Journal, Turn

TERMINAL = {"finished", "succeeded", "check_failed", "budget_exceeded", "cancelled", "failed"}
EXPECTED = {
    "reply": {"finished"},
    "tools": {"finished"},
    "steer": {"finished"},
    "approve": {"finished"},
    "interrupt": {"finished", "cancelled"},
}
"""The outcomes each kind of turn may end with: none of the soak's turns may fail."""
DECISIONS = {"approve": "approved", "deny": "denied"}
TURN_COLUMNS = (
    *("session_id", "parent_id", "ordinal", "prompt", "request_id", "created_at"),
    *("status", "steps", "undelivered", "last_seq", "error"),
)


NOT_RUN_AGAIN = "error: not run again"
"""How an approved call's result begins when an earlier attempt started it and died
before its step committed (src/parley/engine/tool_calls.py): it may have run once, in that
attempt, and is never run again."""


@dataclass(frozen=True)
class Violation:
    rule: str
    turn_id: str | None
    detail: str


@dataclass
class Store:
    """What the checker reads from the database, grouped by turn."""

    turns: dict[str, dict[str, Any]] = field(default_factory=dict)
    """turn id → its turn and run columns."""
    events: dict[str, list[tuple[int, str, dict[str, Any], datetime]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    steps: dict[str, list[tuple[int, dict[str, Any], datetime]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    approvals: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions: dict[str, str | None] = field(default_factory=dict)
    """session id → head turn id."""
    batch_lines: dict[str, list[tuple[str, str | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    batch_status: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, database_url: str) -> Store:
        store = cls()
        with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://")) as db:
            for row in db.execute(
                "SELECT t.id, t.session_id, t.parent_id, t.ordinal, t.prompt, t.request_id,"
                " t.created_at, r.status, r.steps, r.undelivered, r.last_seq, r.error"
                " FROM turns t JOIN runs r ON r.turn_id = t.id"
            ):
                store.turns[row[0]] = dict(zip(TURN_COLUMNS, row[1:], strict=True))
            for turn_id, seq, kind, data, at in db.execute(
                "SELECT turn_id, seq, kind, data, created_at FROM events ORDER BY turn_id, seq"
            ):
                store.events[turn_id].append((seq, kind, data, at))
            for turn_id, index, payload, at in db.execute(
                "SELECT r.turn_id, s.step_index, s.payload, s.created_at"
                " FROM steps s JOIN runs r ON r.id = s.run_id ORDER BY r.turn_id, s.step_index"
            ):
                store.steps[turn_id].append((index, payload, at))
            for approval_id, turn_id, decision, decided_at in db.execute(
                "SELECT id, turn_id, decision, decided_at FROM approvals"
            ):
                store.approvals[approval_id] = {
                    "turn_id": turn_id,
                    "decision": decision,
                    "decided_at": decided_at,
                }
            for session_id, head in db.execute("SELECT id, head_turn_id FROM sessions"):
                store.sessions[session_id] = head
            for batch_id, turn_id, error in db.execute(
                "SELECT batch_id, turn_id, error FROM batch_lines"
            ):
                store.batch_lines[batch_id].append((turn_id, error))
            for batch_id, status in db.execute("SELECT id, status FROM batches"):
                store.batch_status[batch_id] = status
        return store

    def session_turns(self) -> dict[str, list[str]]:
        """Each session's turns in ordinal order."""
        grouped: dict[str, list[str]] = defaultdict(list)
        for turn_id, turn in sorted(self.turns.items(), key=lambda kv: kv[1]["ordinal"]):
            grouped[turn["session_id"]].append(turn_id)
        return grouped

    def ends(self, turn_id: str) -> list[dict[str, Any]]:
        return [data for _, kind, data, _ in self.events.get(turn_id, ()) if kind == "end"]


def read_ledger(path: Path) -> dict[tuple[str, str], list[float]]:
    """(turn id, mark) → when each call of it began."""
    calls: dict[tuple[str, str], list[float]] = defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            calls[(entry["turn_id"], entry["mark"])].append(entry["at"])
    return calls


@dataclass
class Checker:
    store: Store
    journal: Journal
    ledger: dict[tuple[str, str], list[float]]
    violations: list[Violation] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def flag(self, rule: str, turn_id: str | None, detail: str) -> None:
        self.violations.append(Violation(rule, turn_id, detail))

    def check(self) -> list[Violation]:
        batch_turns = self._batches()
        self._turns(batch_turns)
        self._steps()
        self._ledger()
        self._steers()
        self._approvals()
        self._readers()
        self._trees()
        self._heads()
        return self.violations

    # -- every turn ends exactly once -------------------------------------------------

    def _turns(self, batch_turns: set[str]) -> None:
        for turn_id in set(self.store.turns) - set(self.journal.turns) - batch_turns:
            self.flag("no stray turns", turn_id, "a turn in the store that nobody submitted")
        for turn in self.journal.turns.values():
            stored = self.store.turns.get(turn.turn_id)
            if stored is None:
                self.flag("accepted turns are kept", turn.turn_id, "accepted, not in the store")
                continue
            for repeat in turn.repeats:
                if repeat != turn.turn_id:
                    self.flag("idempotent submission", turn.turn_id, f"a repeat answered {repeat}")
            self._one_end(turn.turn_id, 1 + turn.resumes, stored["status"])
            if turn.outcome != stored["status"]:
                self.flag(
                    "the client saw the outcome",
                    turn.turn_id,
                    f"the client saw {turn.outcome}, the store has {stored['status']}",
                )
            if stored["status"] not in EXPECTED.get(turn.kind, {"finished"}):
                self.flag("no turn fails", turn.turn_id, f"{stored['status']}: {stored['error']}")
        for turn_id in batch_turns:
            stored = self.store.turns.get(turn_id)
            if stored is None:
                self.flag("batch lines are kept", turn_id, "a batch line's turn is missing")
            else:
                self._one_end(turn_id, 1, stored["status"])

    def _one_end(self, turn_id: str, expected: int, status: str) -> None:
        ends = self.store.ends(turn_id)
        if len(ends) != expected:
            self.flag("exactly one end per run", turn_id, f"{len(ends)} ends, {expected} expected")
        if status not in TERMINAL:
            self.flag("every turn ends", turn_id, f"still {status}")
        elif ends and ends[-1]["outcome"] != status:
            self.flag("end and run agree", turn_id, f"end says {ends[-1]['outcome']}, run {status}")

    # -- steps and tool calls ---------------------------------------------------------

    def _steps(self) -> None:
        for turn_id, stored in self.store.turns.items():
            indexes = [index for index, _, _ in self.store.steps.get(turn_id, ())]
            if indexes != list(range(len(indexes))) or len(indexes) != stored["steps"]:
                self.flag("steps commit once, in order", turn_id, f"steps {indexes}")
            announced = Counter(
                data.get("index")
                for _, kind, data, _ in self.store.events.get(turn_id, ())
                if kind == "step"
            )
            doubled = [index for index, n in announced.items() if n > 1]
            if doubled:
                self.flag("no step committed twice", turn_id, f"step events twice: {doubled}")

    def _ledger(self) -> None:
        """Every ledger call a committed step reports ran, and none began after its step
        committed; a denied call never ran; an approved call whose attempt died while it
        ran (its result says it was not run again) ran at most once."""
        reruns = 0
        for turn_id, steps in self.store.steps.items():
            for _, payload, committed_at in steps:
                marks = {
                    c["id"]: json.loads(c["arguments"]).get("mark") for c in payload["tool_calls"]
                }
                for result in payload["tool_results"]:
                    mark = marks.get(result["call_id"])
                    calls = self.ledger.get((turn_id, str(mark)), [])
                    ran = result["content"].startswith("noted")
                    unknown = result["content"].startswith(NOT_RUN_AGAIN)
                    if ran and not calls:
                        self.flag("tools really ran", turn_id, f"{mark}: committed, not in ledger")
                    if unknown and len(calls) > 1:
                        rule = "an approved call runs at most once"
                        self.flag(rule, turn_id, f"{mark} ran {len(calls)}x")
                    if not ran and not unknown and calls:
                        self.flag("a denied call never runs", turn_id, f"{mark} ran {len(calls)}x")
                    late = [at for at in calls if at > committed_at.timestamp()]
                    if late:
                        self.flag(
                            "no tool call runs again after its step committed",
                            turn_id,
                            f"{mark} began {len(late)}x after its step committed",
                        )
                    reruns += max(0, len(calls) - 1)
        self.figures["tool calls run again before their step committed"] = reruns

    # -- steers and approvals ---------------------------------------------------------

    def _steers(self) -> None:
        counts = Counter[str]()
        for turn in self.journal.turns.values():
            if not turn.says:
                continue
            delivered = Counter(
                data.get("text")
                for _, kind, data, _ in self.store.events.get(turn.turn_id, ())
                if kind == "steer"
            )
            undelivered = Counter(self.store.turns.get(turn.turn_id, {}).get("undelivered") or ())
            for say in turn.says:
                counts[say.status] += 1
                got, lost = delivered[say.text], undelivered[say.text]
                if say.status == "accepted" and got + lost != 1:
                    self.flag(
                        "a steer is delivered or reported",
                        turn.turn_id,
                        f"{say.text!r}: delivered {got}x, reported undelivered {lost}x",
                    )
                elif say.status in ("ended", "refused") and got:
                    self.flag("a refused steer is not delivered", turn.turn_id, say.text)
                elif say.status == "unknown" and got > 1:
                    self.flag("a steer is delivered once", turn.turn_id, f"{say.text!r} {got}x")
        self.figures["says"] = dict(counts)

    def _approvals(self) -> None:
        answered: dict[str, tuple[Turn, Any]] = {}
        for turn in self.journal.turns.values():
            for answer in turn.answers:
                answered[answer.approval_id] = (turn, answer)
                if answer.status not in (200, 409) or answer.repeat_status not in (None, 409):
                    self.flag(
                        "an approval is answered once",
                        turn.turn_id,
                        f"{answer.approval_id}: {answer.status}, again {answer.repeat_status}",
                    )
        for approval_id, stored in self.store.approvals.items():
            if stored["turn_id"] not in self.journal.turns:
                continue
            if approval_id not in answered:
                self.flag("every approval is answered", stored["turn_id"], approval_id)
                continue
            turn, answer = answered[approval_id]
            if stored["decision"] != DECISIONS[answer.decision]:
                self.flag(
                    "the answer given is the answer kept",
                    turn.turn_id,
                    f"{approval_id}: asked {answer.decision}, stored {stored['decision']}",
                )

    # -- streams ----------------------------------------------------------------------

    def _readers(self) -> None:
        gaps = 0
        for reader in self.journal.readers:
            durable = {seq: kind for seq, kind, _, _ in self.store.events.get(reader.turn_id, ())}
            seqs = reader.seqs
            if any(b <= a for a, b in itertools.pairwise(seqs)):
                self.flag("no duplicate or reordered seq", reader.turn_id, f"seqs {seqs}")
                continue
            if not reader.ended:
                self.flag("a reader reads to the end", reader.turn_id, f"seqs {seqs}")
                continue
            seen = dict(zip(seqs, reader.kinds, strict=True))
            missing = [s for s, k in durable.items() if s <= seqs[-1] and s not in seen]
            if missing:
                self.flag("no durable event is skipped", reader.turn_id, f"missed seqs {missing}")
            wrong = [s for s, k in seen.items() if s in durable and durable[s] != k]
            if wrong:
                self.flag("a seq is one event", reader.turn_id, f"kinds differ at {wrong}")
            gaps += sum(
                b - a - 1 - sum(1 for s in durable if a < s < b)
                for a, b in itertools.pairwise([0, *seqs])
                if b - a < TAKEOVER_SEQ_GAP // 2  # (a takeover numbers on from 2^20 past)
            )
        self.figures["token events a reader missed (Redis lost them)"] = gaps

    # -- trees and heads --------------------------------------------------------------

    def _trees(self) -> None:
        by_session = self.store.session_turns()
        for session_id, accepted in self.journal.order.items():
            stored = by_session.get(session_id, [])
            if [t for t in stored if t in set(accepted)] != accepted:
                self.flag("turns are ordered by submission", accepted[0], f"session {session_id}")
            self._parents(accepted)
            self._start_order(stored)
        for snapshot in self.journal.snapshots:
            for turn_id, parent_id, prompt, status in snapshot.turns:
                stored_turn = self.store.turns.get(turn_id)
                # A turn takes its place under the head when it first starts: until then
                # (queued) it has no parent yet, and gaining one is not a change.
                unplaced = parent_id is None and status == "queued"
                if (
                    stored_turn is None
                    or stored_turn["prompt"] != prompt
                    or (stored_turn["parent_id"] != parent_id and not unplaced)
                ):
                    self.flag(
                        "the tree is append-only", turn_id, f"snapshot of {snapshot.session_id}"
                    )

    def _parents(self, accepted: list[str]) -> None:
        previous: str | None = None
        for turn_id in accepted:
            turn = self.journal.turns[turn_id]
            expected = turn.branched_from or previous
            if self.store.turns.get(turn_id, {}).get("parent_id", expected) != expected:
                self.flag("a turn hangs under the head", turn_id, f"parent is not {expected}")
            previous = turn_id

    def _start_order(self, stored: Iterable[str]) -> None:
        last: datetime | None = None
        for turn_id in stored:
            starts = [
                at for _, kind, _, at in self.store.events.get(turn_id, ()) if kind == "started"
            ]
            if not starts:
                continue
            if last is not None and starts[0] < last:
                self.flag(
                    "turns of a session start in order", turn_id, "started before an earlier one"
                )
            last = starts[0]

    def _heads(self) -> None:
        for head in self.journal.heads:
            stored_head = self.store.sessions.get(head.session_id)
            if head.head_turn_id != stored_head:
                self.flag("head and store agree", stored_head, f"session {head.session_id}")
            path: list[str] = []
            cursor = stored_head
            while cursor is not None:
                path.append(cursor)
                cursor = self.store.turns[cursor]["parent_id"]
            if list(reversed(path)) != head.history:
                self.flag("head and history agree", stored_head, f"session {head.session_id}")
            accepted = self.journal.order.get(head.session_id)
            if accepted and stored_head != accepted[-1]:
                self.flag("the head is the last submission", stored_head, head.session_id)

    def _batches(self) -> set[str]:
        turns: set[str] = set()
        for batch in self.journal.batches:
            lines = self.store.batch_lines.get(batch.batch_id, [])
            if len(lines) != len(batch.custom_ids):
                self.flag("a batch keeps every line", None, f"{batch.batch_id}: {len(lines)} lines")
            if (
                batch.status != "completed"
                or self.store.batch_status.get(batch.batch_id) != "completed"
            ):
                self.flag("a batch completes", None, f"{batch.batch_id}: {batch.status}")
            for turn_id, error in lines:
                if turn_id is None:
                    self.flag("a batch line runs", None, f"{batch.batch_id}: {error}")
                else:
                    turns.add(turn_id)
        return turns
