"""Compactions (docs/compaction.md): a durable record on the session's path, made between
turns in one transaction, that changes what the model is sent from the next turn on and
nothing that is stored; a branch from before it does not see it; dropping it gives the
model the turns again; bad requests change nothing."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.engine.compaction import SUMMARY_INSTRUCTIONS, trimmed_result_marker
from parley.errors import CompactionNotFound, Conflict, InvalidRequest
from parley.ports.host import ModelReply, ModelRequest
from parley.schemas.events import Compacted, EventKind
from parley.schemas.messages import AssistantMessage, Message, ToolMessage, UserMessage
from tests.support.helpers import RecordingModel

BIG = 4000


@parley.tool
def fetch(page: int) -> str:
    """Fetch a page of data.

    Args:
        page: which page.
    """
    return f"page {page}: " + "x" * BIG


RULES = [
    {
        "when": "^fetch",
        "steps": [
            {"text": "fetching ", "tool_calls": [{"name": "fetch", "arguments": {"page": 1}}]},
            {"text": "fetched: {prompt}"},
        ],
    },
    {
        "when": "^USER: ",  # a summarizing call: the covered turns as text
        "steps": [{"text": "## Goal\nfetch pages\n## Decisions\nnone\n## Next steps\nmore"}],
    },
    {"when": "^slow", "steps": [{"text": "s" * 100, "chunk_chars": 1, "delay_ms": 20}]},
    {"when": ".*", "steps": [{"text": "heard: {prompt}"}]},
]


def client_for(db: str) -> tuple[parley.Client, RecordingModel]:
    model = RecordingModel(parley.models.ScriptedModel({"rules": RULES}))
    host = parley.Host(model=model, tools=[fetch])
    return parley.connect(db, host=host), model


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db.sqlite'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def tool_contents(messages: tuple[Message, ...]) -> list[str]:
    return [m.content for m in messages if isinstance(m, ToolMessage)]


def prompts(messages: tuple[Message, ...]) -> list[str]:
    return [m.text for m in messages if isinstance(m, UserMessage)]


def test_a_trim_changes_what_the_next_turn_sends_and_nothing_stored(
    db: str, tmp_path: Path
) -> None:
    client, model = client_for(db)
    with client:
        session = client.open_session(str(tmp_path))
        for n in range(4):
            session.turn(f"fetch {n}")
        before = session.transcript()
        record = session.compact(strategy="trim", keep_turns=1, keep=1)
        assert record.strategy is parley.CompactionStrategy.TRIM
        history = session.history()
        assert record.through_turn_id == history[-2].turn_id
        assert record.tokens_after < record.tokens_before
        assert session.compactions() == [record]
        assert session.transcript() == before  # the tree is untouched

        session.turn("after")
        sent = model.requests[-1].messages
        # The three covered turns: the newest kept round whole, the two older trimmed;
        # the turn after the compaction whole.  Every call still has its result.
        results = tool_contents(sent)
        assert len(results) == 4
        assert results[0] == results[1] == trimmed_result_marker(len(f"page 1: {'x' * BIG}"))
        assert results[2].endswith("x" * BIG) and results[3].endswith("x" * BIG)
        assert prompts(sent) == ["fetch 0", "fetch 1", "fetch 2", "fetch 3", "after"]
        calls = [c for m in sent if isinstance(m, AssistantMessage) for c in m.tool_calls]
        assert [c.id for c in calls] == [m.call_id for m in sent if isinstance(m, ToolMessage)]

        # The compacted event was stored on the head turn, after its end.
        events = list(client.attach(history[-1].turn_id).events())
        assert [e.kind for e in events][-2:] == [EventKind.END, EventKind.COMPACTED]
        payload = events[-1].payload
        assert isinstance(payload, Compacted) and payload.compaction_id == record.compaction_id


def test_a_branch_from_before_a_compaction_does_not_see_it(db: str, tmp_path: Path) -> None:
    client, model = client_for(db)
    with client:
        session = client.open_session(str(tmp_path))
        for n in range(3):
            session.turn(f"fetch {n}")
        first, second, _ = session.history()
        session.compact(strategy="trim", keep_turns=1, keep=0)  # through the second
        session.turn("on the compacted path")
        assert len([c for c in tool_contents(model.requests[-1].messages) if "x" * 100 in c]) == 1

        session.branch_from(first.turn_id)
        session.turn("on a branch from before it")
        assert all(c.endswith("x" * BIG) for c in tool_contents(model.requests[-1].messages))

        # A branch from the turn it covers through still sees it.
        session.branch_from(second.turn_id)
        session.turn("under the covered turn")
        sent = tool_contents(model.requests[-1].messages)
        assert sent == [trimmed_result_marker(BIG + 8)] * 2


def test_dropping_a_compaction_gives_the_model_the_turns_again(db: str, tmp_path: Path) -> None:
    client, model = client_for(db)
    with client:
        session = client.open_session(str(tmp_path))
        for n in range(3):
            session.turn(f"fetch {n}")
        older = session.compact(strategy="trim", keep_turns=2, keep=0)
        newer = session.compact(strategy="summarize", keep_turns=0)
        session.turn("summarized")
        sent = model.requests[-1].messages
        assert tool_contents(sent) == []
        assert prompts(sent)[0].startswith("[parley compacted")
        assert "## Goal" in newer.text and "## Next steps" in newer.text
        assert older.usage is None and newer.usage is not None and newer.usage.output_tokens
        assert session.compactions()[1].usage == newer.usage  # stored with it

        dropped = session.drop_compaction(newer.compaction_id)
        assert dropped.dropped and dropped.compaction_id == newer.compaction_id
        assert session.drop_compaction(newer.compaction_id).dropped  # again: no change
        session.turn("the older one applies again")
        sent = model.requests[-1].messages
        assert tool_contents(sent)[0] == trimmed_result_marker(BIG + 8)
        assert tool_contents(sent)[1].endswith("x" * BIG)

        session.drop_compaction(older.compaction_id)
        session.turn("no compaction")
        assert all(c.endswith("x" * BIG) for c in tool_contents(model.requests[-1].messages))
        assert [c.dropped for c in session.compactions()] == [True, True]


def test_bad_compaction_requests_change_nothing(db: str, tmp_path: Path) -> None:
    client, _ = client_for(db)
    with client:
        session = client.open_session(str(tmp_path))
        with pytest.raises(Conflict, match="nothing to compact"):
            session.compact(strategy="trim", keep_turns=0)
        session.turn("fetch 0")
        bad: list[dict[str, Any]] = [
            {"strategy": "shrink"},
            {"strategy": "native"},
            {"keep_turns": -1},
            {"keep_turns": True},
            {"keep": "2"},
        ]
        for arguments in bad:
            with pytest.raises(InvalidRequest):
                session.compact(**{"strategy": "trim", "keep_turns": 0, **arguments})
        with pytest.raises(Conflict, match="nothing to compact"):
            session.compact(strategy="trim", keep_turns=1)
        with pytest.raises(CompactionNotFound):
            session.drop_compaction("no-such-compaction")
        with pytest.raises(InvalidRequest):
            session.drop_compaction("")
        assert session.compactions() == []


def test_a_compaction_is_refused_while_a_turn_is_unfinished(db: str, tmp_path: Path) -> None:
    client, _ = client_for(db)
    with client:
        session = client.open_session(str(tmp_path))
        session.turn("fetch 0")
        session.turn("fetch 1")
        handle = session.submit("slow turn")  # two seconds of streaming
        with pytest.raises(Conflict, match="between turns"):
            session.compact(strategy="trim", keep_turns=0)
        assert handle.wait(30).outcome is parley.TurnStatus.FINISHED
        assert session.compactions() == []


class SummaryAtAGate(RecordingModel):
    """A model whose summarizing call waits, once inside, until the test opens the gate."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.inside, self.gate = threading.Event(), threading.Event()

    def stream(self, request: ModelRequest, on_delta: Any) -> ModelReply:
        if request.prefix.system_prompt == SUMMARY_INSTRUCTIONS:
            self.inside.set()
            assert self.gate.wait(30)
        return super().stream(request, on_delta)


def test_of_two_compactions_asked_at_once_the_one_that_ends_second_is_refused(
    db: str, tmp_path: Path
) -> None:
    """Two compactions made from the same history at once (two requests, a summary's
    model call long): the first stored wins, the other is a :class:`Conflict` and stores
    nothing, rather than a second record (and ``compacted`` event) of the same turns."""
    model = SummaryAtAGate(parley.models.ScriptedModel({"rules": RULES}))
    with parley.connect(db, host=parley.Host(model=model, tools=[fetch])) as client:
        session = client.open_session(str(tmp_path))
        session.turn("fetch 0")
        session.turn("fetch 1")
        refused: list[BaseException] = []

        def summarize() -> None:
            try:
                session.compact(strategy="summarize", keep_turns=1)
            except Conflict as exc:
                refused.append(exc)

        slow = threading.Thread(target=summarize)
        slow.start()
        assert model.inside.wait(30)
        trimmed = session.compact(strategy="trim", keep_turns=1)
        model.gate.set()
        slow.join(30)
        assert [str(e) for e in refused] and "made while this one was" in str(refused[0])
        assert session.compactions() == [trimmed]


def test_a_compaction_of_the_turns_one_covers_already_is_refused(db: str, tmp_path: Path) -> None:
    """Compacting again with no new turn covered would store a copy of the one that
    applies (a trim's copy of the messages, a summary's another model call) for nothing:
    it is a :class:`Conflict` and stores nothing; a turn later, or once that one is
    dropped, it is made."""
    client, model = client_for(db)
    with client:
        session = client.open_session(str(tmp_path))
        session.turn("fetch 0")
        session.turn("fetch 1")
        first = session.compact(strategy="trim", keep_turns=1)
        calls = len(model.requests)
        for strategy in ("trim", "summarize"):
            with pytest.raises(Conflict, match="covers the same turns"):
                session.compact(strategy=strategy, keep_turns=1)
        assert len(model.requests) == calls  # no summary was asked for
        assert session.compactions() == [first]
        session.drop_compaction(first.compaction_id)
        again = session.compact(strategy="summarize", keep_turns=1)
        assert again.through_turn_id == first.through_turn_id
        session.turn("fetch 2")
        chained = session.compact(strategy="trim", keep_turns=1)
        assert chained.through_turn_id != again.through_turn_id
