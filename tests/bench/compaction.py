"""Compaction benchmark: what assembling a request costs at turn 10 and at turn 1000 of
a session whose host compacts it (docs/compaction.md), beside the same path read whole
(what a session without compaction reads) and a bare SQLite commit.  Run by hand:

    .venv/bin/python -m tests.bench.compaction [DATABASE_URL]

(SQLite in a temporary directory by default; a PostgreSQL URL names an empty database.)
Every turn reads a 2 000-byte file and answers (four messages, about 540 tokens); the
host summarizes the path but its newest four turns once a first request would pass 80%
of a 16 000-token window.  Two sessions of one database, one of 10 turns and one of
1000, are measured in alternation, round after round, so that a machine's load weighs
on both marks alike.  Prints medians: (1) the path read as a claim reads it (back to the
compaction that applies, with it); (2) cold assembly, as a turn's claim does it in a
process that never saw the session (that read, the steps of the turns after the
compaction, replayed), and the whole path replayed; (3) a whole one-step turn (submit,
claim, run, commit, wait); and how many turns and messages the compacted request holds.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import parley
from parley.engine.replay_cache import ReplayCache
from parley.engine.turn_history import TurnHistory
from parley.ports.backend import PathTurn
from parley.schemas.messages import Message
from parley.store.compactions import read_compacted_path
from parley.store.rows import read_steps
from tests.bench.embedded import bare_sqlite_commit

READ = {"name": "read_file", "arguments": {"path": "notes.txt"}}
RULES = {
    "rules": [
        {"when": "^USER: ", "steps": [{"text": "## Goal\nread the notes\n## Next steps\nmore"}]},
        {
            "when": "^read",
            "steps": [
                {"text": "", "tool_calls": [READ]},
                {"text": "noted."},
            ],
        },
        {"when": ".*", "steps": [{"text": "ok"}]},
    ]
}  # fmt: skip
NOTES = "A line of notes, about sixty characters long, for the replay.\n" * 32
POLICY = parley.Compaction(strategy="summarize", threshold=0.8, keep_turns=4, window=16_000)


def assemble_cold(client: parley.Client, session: parley.Session, *, compacted: bool) -> int:
    """What a claim reads and replays for the session's next turn, in a process that
    never saw the session; the messages' count.  ``compacted``: as a claim does it (the
    path back to the compaction that applies, that compaction, the steps of the turns
    after it); else the whole path, every turn replayed."""
    store = client.store
    head = store.get_session(session.id).head_turn_id
    if compacted:
        record, path = store.db.reading(lambda db: read_compacted_path(db, head))
    else:
        record, path = None, store.path(head)
    steps = store.db.reading(lambda db: read_steps(db, [t.run_id for t in path]))
    nodes = tuple(PathTurn(turn=t, steps=tuple(steps.get(t.run_id, ()))) for t in path)
    messages: tuple[Message, ...] = TurnHistory(nodes, store, ReplayCache(), record).messages()
    return len(messages)


def read_path(client: parley.Client, session: parley.Session) -> int:
    """The claim's read of the path (back to the compaction that applies); its turns."""
    store = client.store
    head = store.get_session(session.id).head_turn_id
    return len(store.db.reading(lambda db: read_compacted_path(db, head))[1])


ROUNDS = 15


def measure(
    figures: dict[str, Callable[[int], object]], marks: list[int]
) -> dict[int, dict[str, float]]:
    """Median milliseconds of each figure at each mark, taken in alternation."""
    samples: dict[int, dict[str, list[float]]] = {m: {k: [] for k in figures} for m in marks}
    for _ in range(ROUNDS):
        for name, action in figures.items():
            for mark in marks:
                start = time.perf_counter()
                action(mark)
                samples[mark][name].append((time.perf_counter() - start) * 1000)
    return {m: {k: statistics.median(v) for k, v in f.items()} for m, f in samples.items()}


def main() -> int:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        (root / "notes.txt").write_text(NOTES)
        url = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{root / 'long.db'}"
        floor = statistics.median(bare_sqlite_commit(root, 300)) * 1000
        host = parley.Host(model=parley.models.ScriptedModel(RULES), compaction=POLICY)
        with parley.connect(url, host=host) as client:
            sessions = {n: client.open_session(str(root)) for n in (10, 1000)}
            for mark, session in sessions.items():
                for n in range(1, mark + 1):
                    session.turn(f"read the notes, round {n}")
            made = len(sessions[1000].compactions())
            shape = {
                m: (read_path(client, s), assemble_cold(client, s, compacted=True))
                for m, s in sessions.items()
            }
            figures: dict[str, Callable[[int], object]] = {
                "path read": lambda m: read_path(client, sessions[m]),
                "cold assembly, compacted": lambda m: assemble_cold(
                    client, sessions[m], compacted=True
                ),
                "cold assembly, whole path": lambda m: assemble_cold(
                    client, sessions[m], compacted=False
                ),
                "whole one-step turn": lambda m: sessions[m].turn("hello"),
            }
            marks = measure(figures, [10, 1000])
        print(
            f"compaction on {url.split(':')[0]}: {made} compactions over 1000 turns; "
            f"bare SQLite commit {floor:.3f} ms"
        )
        for n, values in marks.items():
            turns, messages = shape[n]
            print(
                f"  turn {n:>4} ({turns} turns after the compaction, {messages} messages): "
                + ", ".join(f"{k} {v:.2f} ms" for k, v in values.items())
            )
        ratio = {k: marks[1000][k] / marks[10][k] for k in marks[10]}
        print("  turn 1000 / turn 10: " + ", ".join(f"{k} {v:.1f}x" for k, v in ratio.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
