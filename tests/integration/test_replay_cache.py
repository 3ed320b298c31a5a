"""The replay cache changes what is loaded, never what is sent: requests built from cached
turns equal requests built from the store, across processes that share a session, and a
cancelled turn that is resumed later is never replayed from a stale copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import parley
from parley.engine.replay_cache import ReplayCache, replay_size
from parley.schemas.messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from parley.store import claims, rows, turn_reads
from tests.support.helpers import RecordingModel

RULES = [
    {
        "when": "^read",
        "steps": [
            {"text": "reading ", "tool_calls": [{"name": "list_files", "arguments": {}}]},
            {"text": "read: {last_message}"},
        ],
    },
    {
        "when": "^slow",
        "steps": [
            {"text": "first ", "tool_calls": [{"name": "list_files", "arguments": {}}]},
            {"text": "second part, slowly", "chunk_chars": 1, "delay_ms": 30},
        ],
    },
    {"when": ".*", "steps": [{"text": "heard: {last_message}"}]},
]


def client_for(db: str) -> tuple[parley.Client, RecordingModel]:
    model = RecordingModel(parley.models.ScriptedModel({"rules": RULES}))
    return parley.connect(db, host=parley.Host(model=model)), model


class CountingSteps:
    """Counts which runs' steps the store loads (both of its sides)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loaded: list[str] = []
        original = rows.read_steps

        def counting(db: Any, run_ids: Any) -> Any:
            self.loaded.extend(run_ids)
            return original(db, run_ids)

        for module in (turn_reads, claims):
            monkeypatch.setattr(module, "read_steps", counting)


def test_cached_turns_are_not_loaded_and_requests_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    warm, warm_model = client_for(db)
    with warm:
        session = warm.open_session(str(tmp_path))
        for n in range(5):
            session.turn(f"read round {n}")
        counter = CountingSteps(monkeypatch)
        session.turn("read once more")
        history_runs = {t.run_id for t in session.history()[:-1]}
        assert not history_runs & set(counter.loaded), "cached turns were loaded again"

        # A process with an empty cache builds exactly the same request.
        cold, cold_model = client_for(db)
        with cold:
            cold.session(session.id).turn("read once more")
        warm_request = warm_model.requests[-1]
        cold_request = cold_model.requests[-1]
        # The warm request is the cold one's start: the cold one has one more turn.
        assert cold_request.messages[: len(warm_request.messages)] == warm_request.messages
        assert len(cold_request.messages) == len(warm_request.messages) + 4


def test_processes_taking_turns_on_one_session_send_complete_histories(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first, first_model = client_for(db)
    second, second_model = client_for(db)
    with first, second:
        session_id = first.open_session(str(tmp_path)).id
        for n in range(6):
            client = first if n % 2 == 0 else second
            client.session(session_id).turn(f"read round {n}")
        reference, reference_model = client_for(db)
        with reference:
            reference.session(session_id).turn("hello")
        truth = reference_model.requests[-1].messages[:-1]  # the history, from the store
        # The sixth turn's final request, whichever process ran it (embedded, either may
        # drive a queued turn: on a loaded machine the other's recovery thread can take
        # it first).
        sixth = [
            r.messages
            for r in (*first_model.requests, *second_model.requests)
            if any(getattr(m, "text", "") == "read round 5" for m in r.messages)
            and not any(getattr(m, "text", "") == "hello" for m in r.messages)
        ]
        last = max(sixth, key=len)
        # Its final request is the history the store holds, up to that point.
        assert len(last) == len(truth) - 1
        assert last == truth[: len(last)]


def test_a_cancelled_turn_resumed_elsewhere_is_replayed_whole(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    client, model = client_for(db)
    other, other_model = client_for(db)
    with client, other:
        session = client.open_session(str(tmp_path))
        handle = session.submit("slow turn")
        for event in handle.events():
            if event.kind is parley.EventKind.TOKEN and event.data["step"] == 1:
                handle.interrupt()
                break
        # This process ran the cancelled attempt (and knew the turn as it was then);
        # another continues it: it now has one more step.
        assert handle.wait(timeout=30).outcome == parley.TurnStatus.CANCELLED
        resumed = other.session(session.id).resume(handle.turn_id)
        assert resumed.wait(timeout=30).outcome == parley.TurnStatus.FINISHED
        session.turn("after")
        # The request of the turn "after", whichever process ran it: embedded, either
        # may drive a queued turn (on a loaded machine the other's recovery thread can
        # take it first, and this one the resumed turn).
        requests = [*model.requests, *other_model.requests]
        after = [r for r in requests if getattr(r.messages[-1], "text", "") == "after"]
        assert len(after) == 1
        texts = [getattr(m, "text", "") for m in after[0].messages]
        assert "second part, slowly" in texts, "a stale copy of the resumed turn was replayed"


def test_the_cache_keeps_only_settled_turns_and_stays_bounded() -> None:
    cache = ReplayCache(capacity_bytes=2 * replay_size(()))
    cache.put("cancelled", parley.TurnStatus.CANCELLED, ())
    cache.put("failed", parley.TurnStatus.FAILED, ())
    assert len(cache) == 0
    for name in ("a", "b", "c"):
        cache.put(name, parley.TurnStatus.FINISHED, ())
    assert not cache.knows("a") and cache.knows("b") and cache.knows("c")


def test_the_cache_is_bounded_by_what_its_turns_hold_not_by_their_number() -> None:
    # A turn whose tool read a big file weighs what a thousand chat turns do.
    chat = (UserMessage(text="hello"), AssistantMessage(text="hi there"))
    reads = (
        UserMessage(text="read it"),
        AssistantMessage(text="", tool_calls=(ToolCall(id="c", name="read", arguments="{}"),)),
        ToolMessage(call_id="c", name="read", content="x" * 200_000),
        AssistantMessage(text="done"),
    )
    cache = ReplayCache(capacity_bytes=1_000_000)
    for n in range(1000):
        cache.put(f"chat{n}", parley.TurnStatus.FINISHED, chat)
    assert len(cache) == 1000 and cache.size <= 1_000_000
    for n in range(10):
        cache.put(f"reads{n}", parley.TurnStatus.FINISHED, reads)
    assert cache.size <= 1_000_000
    assert cache.knows("reads9") and not cache.knows("reads0")  # only the newest fit
    assert not cache.knows("chat0")  # the least recently used went first
    cache.put("huge", parley.TurnStatus.FINISHED, reads * 10)  # bigger than it all: skipped
    assert not cache.knows("huge") and cache.knows("reads9")
    cache.put("reads9", parley.TurnStatus.FINISHED, chat)  # put again: counted once
    assert cache.size == sum(replay_size(m) for m in _held(cache))


def _held(cache: ReplayCache) -> list[tuple[Message, ...]]:
    return [entry[0] for entry in cache._entries.values()]
