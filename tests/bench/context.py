"""Context benchmark: prompt-cache friendliness and the cost of assembling a long session.
Run by hand:

    .venv/bin/python -m tests.bench.context

Prints (1) over 50 turns of one session, how many leading bytes of each request are
identical to the previous turn's last request (what a provider's prompt cache can reuse),
with and without a context budget; (2) the time to assemble the context of turn 10 and of
turn 1000 of one session (replay + check, then fitting under a budget), and the wall time
of a whole one-step turn at both points, beside a bare SQLite commit of the same run.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import parley
from parley.engine.context import assemble, history_messages, turn_replay
from parley.engine.replay_cache import ReplayCache
from parley.ports.backend import PathTurn
from parley.schemas.messages import Message, Prefix, message_bytes
from tests.bench.embedded import bare_sqlite_commit
from tests.support.helpers import RecordingModel

RULES = {
    "rules": [
        {
            "when": "^read",
            "steps": [
                {
                    "text": "Reading. ",
                    "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
                },
                {"text": "The notes say what they say; noted."},
            ],
        },
        {"when": ".*", "steps": [{"text": "ok"}]},
    ]
}  # fmt: skip
NOTES = "A line of notes, about sixty characters long, for the replay.\n" * 8


def request_bytes(prefix: Prefix, messages: tuple[Message, ...]) -> bytes:
    """A request as parley serialises it canonically: the order a provider sees."""
    return prefix.canonical_bytes() + b"".join(message_bytes(m) for m in messages)


def common_prefix(a: bytes, b: bytes) -> int:
    size = min(len(a), len(b))
    for n in range(size):
        if a[n] != b[n]:
            return n
    return size


def cache_reuse(directory: Path, budget: parley.ContextBudget | None) -> None:
    model = RecordingModel(parley.models.ScriptedModel(RULES))
    host = parley.Host(model=model, context_budget=budget)
    (directory / "notes.txt").write_text(NOTES)
    with parley.connect(f"sqlite:///{directory / 'cache.db'}", host=host) as client:
        session = client.open_session(str(directory))
        ends: list[bytes] = []
        starts: list[bytes] = []
        prefixes: set[bytes] = set()
        for n in range(50):
            before = len(model.requests)
            session.turn(f"read the notes, round {n}")
            mine = model.requests[before:]
            prefixes.update(r.prefix.canonical_bytes() for r in mine)
            starts.append(request_bytes(mine[0].prefix, mine[0].messages))
            ends.append(request_bytes(mine[-1].prefix, mine[-1].messages))
    shared = [common_prefix(ends[n], starts[n + 1]) for n in range(49)]
    whole = [common_prefix(ends[n], starts[n + 1]) == len(ends[n]) for n in range(49)]
    label = "no budget" if budget is None else f"budget {budget.max_tokens} tokens"
    print(f"prompt-cache reuse over 50 turns ({label}):")
    size = len(next(iter(prefixes)))
    ratios = [s / len(t) for s, t in zip(shared, starts[1:], strict=True)]
    print(f"  distinct prefixes (system prompt + tools): {len(prefixes)}, {size} B")
    print(f"  turn n+1's first request repeats turn n's last request whole: {sum(whole)}/49 turns")
    print(
        f"  identical leading bytes: median {statistics.median(shared):.0f} B of a median "
        f"{statistics.median(len(s) for s in starts):.0f} B request "
        f"({100 * statistics.median(ratios):.1f}%)"
    )


def assembly(directory: Path) -> None:
    host = parley.Host(model=parley.models.ScriptedModel(RULES))
    (directory / "notes.txt").write_text(NOTES)
    floor = statistics.median(bare_sqlite_commit(directory, 300)) * 1000
    prefix = Prefix(
        system_prompt=host.system_prompt, tools=tuple(t.declaration for t in host.tools)
    )
    budget = parley.ContextBudget(max_tokens=8000)
    with parley.connect(f"sqlite:///{directory / 'long.db'}", host=host) as client:
        session = client.open_session(str(directory))
        marks: dict[int, dict[str, float]] = {}
        for n in range(1, 1001):
            if n in (10, 1000):
                marks[n] = measure(client, session, prefix, budget)
            session.turn(f"read the notes, round {n}")
    print(f"\ncontext assembly (bare SQLite commit floor {floor:.3f} ms; medians):")
    for n, figures in marks.items():
        print(f"  turn {n:>4}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in figures.items()))


def measure(
    client: parley.Client, session: parley.Session, prefix: Prefix, budget: parley.ContextBudget
) -> dict[str, float]:
    """Cold: a process that never saw the session loads and replays the whole path.  Warm:
    the engine's path, every settled turn replayed from its cache.  Then the budget's fit,
    and a whole one-step turn."""
    store = client.store
    path = session.history()

    def cold() -> tuple[Message, ...]:
        nodes = [PathTurn(turn=t, steps=tuple(store.steps_of(t.turn_id))) for t in path]
        return history_messages(nodes)

    cache = ReplayCache()
    for node in path:
        cache.put(node.turn_id, node.status, turn_replay(node.prompt, store.steps_of(node.turn_id)))

    def warm() -> tuple[Message, ...]:
        messages: list[Message] = []
        for node in path:
            messages.extend(cache.get(node.turn_id) or ())
        return assemble(tuple(messages), "q", [], [])

    history = warm()
    figures = {
        "cold load+replay": timed(cold, repeat=5),
        "warm replay": timed(warm),
        "fit to 8000 tokens": timed(lambda: budget.fit(prefix, history[:-1], history[-1:])),
        "whole one-step turn": timed(lambda: session.turn("hello"), repeat=5),
    }
    return figures


def timed(action: Callable[[], object], repeat: int = 20) -> float:
    """Median milliseconds of ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> int:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        for name in ("a", "b", "c"):
            (root / name).mkdir()
        cache_reuse(root / "a", None)
        cache_reuse(root / "b", parley.ContextBudget(max_tokens=3000))
        assembly(root / "c")
    return 0


if __name__ == "__main__":
    sys.exit(main())
