"""``Session.seed_history`` (docs/host.md#3-seeded-history): an existing conversation imported
before the first turn replays like any other, is checked like any other, and keeps the
host's raw rows beside it."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.errors import CodecError, Conflict, InvalidRequest
from tests.acceptance.conftest import ClientFactory
from tests.providers.servers import (
    Reply,
    anthropic_message,
    anthropic_server,
    openai_server,
    openai_text,
)
from tests.support.deployments import ALL, on_deployments
from tests.support.helpers import Control

pytestmark = on_deployments(*ALL)

ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "what does retry.py retry?"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "retry.py"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "RETRY_ON = (502, 504)"},
    {"role": "assistant", "content": "It retries 502 and 504."},
    {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
    {"role": "assistant", "content": "You are welcome."},
]
RAW = [{"id": 1, "kind": "host-row", "body": "what does retry.py retry?"}]


def test_a_seeded_conversation_replays_before_the_next_turn(
    make_client: ClientFactory, workspace: Path, control: Control
) -> None:
    client = make_client([ECHO])
    session = client.open_session(workspace)
    seeded = session.seed_history(CONVERSATION, raw_rows=RAW)
    assert [t.prompt for t in seeded] == ["what does retry.py retry?", "thanks"]
    assert [t.reply for t in seeded] == ["It retries 502 and 504.", "You are welcome."]
    assert session.head == seeded[-1].turn_id
    assert session.seeded() == (CONVERSATION, RAW)

    result = session.turn("and 503?")
    assert result.reply == "heard: and 503?"
    messages = control.requests()[-1]["messages"]
    assert [(m["role"], m.get("text", m.get("content"))) for m in messages] == [
        ("user", "what does retry.py retry?"),
        ("assistant", "Let me look."),
        ("tool", "RETRY_ON = (502, 504)"),
        ("assistant", "It retries 502 and 504."),
        ("user", "thanks"),
        ("assistant", "You are welcome."),
        ("user", "and 503?"),
    ]
    assert messages[1]["tool_calls"] == [
        {"id": "call_1", "name": "read_file", "arguments": '{"path": "retry.py"}'}
    ]
    assert [t.prompt for t in session.history()] == [
        "what does retry.py retry?",
        "thanks",
        "and 503?",
    ]

    session.branch_from(seeded[0].turn_id)  # a seeded turn is a turn like any other
    session.turn("another way")
    assert len(control.requests()[-1]["messages"]) == 5


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        (CONVERSATION[:2], CodecError),  # a tool call without its result
        (CONVERSATION[:2] + CONVERSATION[4:], CodecError),  # goes on past it
        ([CONVERSATION[0], CONVERSATION[2]], CodecError),  # a result for no call
        ([CONVERSATION[1]], InvalidRequest),  # no user message first
        ([{"role": "system", "content": "be nice"}, *CONVERSATION], InvalidRequest),
        ([{"role": "robot", "content": "?"}], InvalidRequest),
        ([], InvalidRequest),
        ("not a list", InvalidRequest),
    ],
)
def test_a_history_that_does_not_replay_is_refused_and_changes_nothing(
    make_client: ClientFactory, workspace: Path, messages: Any, error: type[Exception]
) -> None:
    client = make_client([ECHO])
    session = client.open_session(workspace)
    with pytest.raises(error):
        session.seed_history(messages)
    assert session.tree() == [] and session.seeded() is None
    session.seed_history(CONVERSATION)  # still possible: nothing was stored
    assert len(session.tree()) == 2


def test_a_history_is_seeded_only_before_the_first_turn(
    make_client: ClientFactory, workspace: Path
) -> None:
    client = make_client([ECHO])
    session = client.open_session(workspace)
    session.turn("hello")
    with pytest.raises(Conflict):
        session.seed_history(CONVERSATION)
    other = client.open_session(workspace)
    other.seed_history(CONVERSATION)
    with pytest.raises(Conflict):  # once
        other.seed_history(CONVERSATION)
    assert len(other.tree()) == 2


@pytest.mark.embedded_only
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_seeded_tool_round_replays_to_a_real_provider_protocol(
    provider: str, tmp_path: Path, workspace: Path
) -> None:
    """The seeded conversation, tool round included, sent to a loopback OpenAI server (that
    refuses what OpenAI refuses: an orphan call, a wrong shape) and to an Anthropic one:
    request by request, the seeded turns come first, in their provider's own form."""
    if provider == "openai":
        server = openai_server(strict=True)
        server.plan(Reply(frames=openai_text("fine")))
        model: Any = parley.models.OpenAIChatModel(
            "gpt-test", base_url=server.base_url, api_key="sk-test", max_retries=0
        )
    else:
        server = anthropic_server()
        server.plan(Reply(frames=anthropic_message("fine")))
        model = parley.models.AnthropicModel(
            "claude-test", base_url=server.base_url, api_key="sk-test", max_retries=0
        )
    # The model is closed with the test: its client's sockets left to the garbage collector
    # would be reported unclosed whenever a collection happens to find them.
    with (
        server,
        closing(model),
        parley.connect(f"sqlite:///{tmp_path / 'p.db'}", host=parley.Host(model=model)) as client,
    ):
        session = client.open_session(workspace)
        session.seed_history(CONVERSATION)
        result = session.turn("and 503?")
        [sent] = server.received
    assert result.outcome is parley.TurnStatus.FINISHED and result.reply == "fine"
    messages = sent.json()["messages"]
    if provider == "openai":
        assert [m["role"] for m in messages] == [
            "system", "user", "assistant", "tool", "assistant", "user", "assistant", "user",
        ]  # fmt: skip
        assert messages[2]["tool_calls"][0]["id"] == "call_1"
        assert messages[3]["tool_call_id"] == "call_1"
    else:
        roles = [m["role"] for m in messages]
        assert roles == ["user", "assistant", "user", "assistant", "user", "assistant", "user"]
        uses = [b for b in messages[1]["content"] if b["type"] == "tool_use"]
        results = [b for b in messages[2]["content"] if b["type"] == "tool_result"]
        assert uses[0]["id"] == results[0]["tool_use_id"] == "call_1"
