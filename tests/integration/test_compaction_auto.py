"""A host's compaction (docs/compaction.md#when): a turn whose first request would pass
the host's share of the window compacts the session first, in its own stream, charged to
it; a long session stays under its window on every request with every turn stored."""

from __future__ import annotations

from pathlib import Path

import pytest

import parley
from parley.engine.compaction import message_tokens
from parley.engine.context import check_replay
from parley.engine.turn_compaction import request_tokens
from parley.errors import InvalidRequest
from parley.schemas.events import EventKind
from parley.schemas.messages import ToolMessage, UserMessage
from tests.support.helpers import RecordingModel

BIG = 2000
SUMMARY_USAGE = {"input_tokens": 700, "output_tokens": 40}


@parley.tool
def fetch(page: int) -> str:
    """Fetch a page of data.

    Args:
        page: which page.
    """
    return f"page {page}: " + "y" * BIG


RULES = [
    {
        "when": "^USER: ",  # a summarizing call: the covered turns as text
        "steps": [{"text": "## Goal\nfetch pages\n## Next steps\nmore", "usage": SUMMARY_USAGE}],
    },
    {
        "when": "^fetch",
        "steps": [
            {"text": "", "tool_calls": [{"name": "fetch", "arguments": {"page": 1}}]},
            {"text": "fetched"},
        ],
    },
    {"when": ".*", "steps": [{"text": "heard: {prompt}"}]},
]


def client_for(db: str, compaction: parley.Compaction) -> tuple[parley.Client, RecordingModel]:
    model = RecordingModel(parley.models.ScriptedModel({"rules": RULES}))
    host = parley.Host(model=model, tools=[fetch], compaction=compaction)
    return parley.connect(db, host=host), model


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db.sqlite'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def test_a_turn_past_the_threshold_compacts_first_and_pays_for_it(db: str, tmp_path: Path) -> None:
    # Each fetch turn adds about 520 tokens: the third turn's first request passes 1,000.
    policy = parley.Compaction(strategy="summarize", threshold=0.5, keep_turns=1, window=2000)
    client, model = client_for(db, policy)
    with client:
        session = client.open_session(str(tmp_path))
        plain = [session.turn(f"fetch {n}") for n in range(2)]
        assert session.compactions() == []
        third = session.turn("fetch 2")
        [record] = session.compactions()
        assert record.made_by_turn_id == third.turn_id
        assert record.through_turn_id == plain[0].turn_id  # all but the newest turn
        assert record.strategy is parley.CompactionStrategy.SUMMARIZE
        assert record.usage == parley.Usage(**SUMMARY_USAGE)
        # The turn's events: started, compacted, then its steps.
        kinds = [e.kind for e in client.attach(third.turn_id).events()]
        assert kinds[:3] == [EventKind.QUEUED, EventKind.STARTED, EventKind.COMPACTED]
        # Its usage holds the summary's.
        assert third.usage.input_tokens >= SUMMARY_USAGE["input_tokens"]
        assert third.usage.input_tokens - plain[1].usage.input_tokens > 500
        summary_request, first_request = model.requests[-3], model.requests[-2]
        assert summary_request.prefix.tools == ()
        assert first_request.messages[0] == UserMessage(
            text="[parley compacted the earlier part of this conversation; its summary "
            "follows]\n\n## Goal\nfetch pages\n## Next steps\nmore"
        )
        # Then the second turn whole, then this one.
        assert [m.text for m in first_request.messages if isinstance(m, UserMessage)] == [
            first_request.messages[0].text,
            "fetch 1",
            "fetch 2",
        ]
        assert len(session.history()) == 3  # every turn is still there


def test_a_compaction_is_not_made_again_for_what_is_covered(db: str, tmp_path: Path) -> None:
    policy = parley.Compaction(strategy="trim", threshold=0.5, keep_turns=0, keep=0, window=2000)
    client, _ = client_for(db, policy)
    with client:
        session = client.open_session(str(tmp_path))
        for n in range(3):
            session.turn(f"fetch {n}")
        made = session.compactions()
        assert len(made) == 1
        # Trimmed, the history is small: the next turns need no compaction.
        session.turn("hello")
        session.turn("hello again")
        assert session.compactions() == made


def test_an_empty_summary_stores_nothing_and_the_turn_goes_on(tmp_path: Path) -> None:
    rules = [{"when": "^USER: ", "steps": [{"text": "  "}]}, *RULES[1:]]
    model = RecordingModel(parley.models.ScriptedModel({"rules": rules}))
    policy = parley.Compaction(strategy="summarize", threshold=0.5, keep_turns=1, window=2000)
    host = parley.Host(model=model, tools=[fetch], compaction=policy)
    with parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host=host) as client:
        session = client.open_session(str(tmp_path))
        results = [session.turn(f"fetch {n}") for n in range(3)]
        assert [r.outcome for r in results] == [parley.TurnStatus.FINISHED] * 3
        assert session.compactions() == []
        kinds = [e.kind for e in client.attach(results[2].turn_id).events()]
        assert EventKind.COMPACTED not in kinds
        # The summary was asked for, and the turn's own request sent the turns whole.
        assert model.requests[-3].prefix.tools == ()
        assert len([m for m in model.requests[-2].messages if isinstance(m, ToolMessage)]) == 2


def test_a_compaction_policy_refuses_bad_settings() -> None:
    for bad in (
        {"strategy": "shrink"},
        {"threshold": 0},
        {"threshold": 1.5},
        {"threshold": "0.8"},
        {"keep_turns": -1},
        {"keep": 1.5},
        {"window": 0},
        {"window": True},
    ):
        with pytest.raises(InvalidRequest):
            parley.Compaction(**bad)
    scripted = parley.models.ScriptedModel({"rules": RULES})
    with pytest.raises(InvalidRequest, match="window"):
        parley.Host(model=scripted, tools=[fetch], compaction=parley.Compaction())
    with pytest.raises(InvalidRequest, match=r"parley\.Compaction"):
        parley.Host(model=scripted, tools=[fetch], compaction="summarize")  # type: ignore[arg-type]
    # A native one needs a model whose provider compacts itself.
    native = parley.Compaction(strategy="native", window=8000)
    with pytest.raises(InvalidRequest, match="natively"):
        parley.Host(model=scripted, tools=[fetch], compaction=native)


@pytest.mark.slow
def test_a_thousand_turns_stay_under_the_window_with_every_turn_stored(tmp_path: Path) -> None:
    window = 8000
    policy = parley.Compaction(strategy="summarize", threshold=0.8, keep_turns=2, window=window)
    client, model = client_for(f"sqlite:///{tmp_path / 'db.sqlite'}", policy)
    turns = 1000
    with client:
        session = client.open_session(str(tmp_path))
        for n in range(turns):
            session.turn(f"fetch {n}")
        assert len(session.history()) == turns
        assert len(session.tree()) == turns
        steps = sum(len(client.store.steps_of(t.turn_id)) for t in session.history())
        assert steps == 2 * turns
        made = session.compactions()
        assert len(made) > 10
    for request in model.requests:
        check_replay(request.messages)  # no call without its result, ever
        assert request_tokens(request.prefix, request.messages) < window
    results = [m for m in model.requests[-1].messages if isinstance(m, ToolMessage)]
    assert all(m.content.endswith("y" * BIG) for m in results)  # kept turns are whole
    assert message_tokens(model.requests[-1].messages) < window
