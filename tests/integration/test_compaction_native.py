"""Native compactions (docs/compaction.md#native) against a real HTTP server on loopback
that speaks the Anthropic Messages wire format: the provider's own ``compaction`` block,
asked for with the ``compaction`` parameter, kept opaque and verbatim, sent back first
only in requests to that provider; another model gets the turns; on request and by the
host's policy before a turn's first call; chained and dropped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.errors import InvalidRequest
from parley.models import AnthropicModel
from parley.schemas.events import EventKind
from parley.schemas.messages import UserMessage
from tests.providers.servers import ProviderServer, Received, Reply, anthropic_message
from tests.providers.servers import anthropic_server as serve_anthropic
from tests.support.helpers import RecordingModel

KEY = "sk-ant-test-0123456789abcdef"
BETA = "compact-2026-09-04"


def compaction_reply(summary: str, opaque: str) -> Reply:
    """The API's answer to a compaction request: one ``compaction`` block, alone."""
    block = {
        "type": "compaction",
        "content": summary,
        "encrypted_content": opaque,
        "signature": f"sig-{opaque}",
    }
    usage = {
        "input_tokens": 900,
        "output_tokens": 40,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    message = {
        "id": "msg_compaction",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [block],
        "stop_reason": "compaction",
        "stop_sequence": None,
        "usage": usage,
    }
    return Reply(body=message)


def block_of(reply: Reply) -> dict[str, Any]:
    block: dict[str, Any] = reply.body["content"][0]
    return block


def answer(text: str) -> Reply:
    return Reply(frames=anthropic_message(text))


MODELS: list[AnthropicModel] = []


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with serve_anthropic() as running:
        yield running
    while MODELS:
        MODELS.pop().close()  # its HTTP client's connections


def anthropic_host(server: ProviderServer, **options: Any) -> parley.Host:
    model = AnthropicModel("claude-test", base_url=server.base_url, api_key=KEY, max_retries=0)
    MODELS.append(model)
    return parley.Host(model=model, system_prompt="You are terse.", **options)


def texts(request: Received) -> list[str]:
    """The text of every text block of a request's messages, in order."""
    return [
        block["text"]
        for message in request.json()["messages"]
        for block in message["content"]
        if block.get("type") == "text"
    ]


def test_a_native_compaction_is_kept_opaque_and_sent_only_to_its_provider(
    server: ProviderServer, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with parley.connect(db, host=anthropic_host(server)) as client:
        session = client.open_session(str(tmp_path))
        for n in range(3):
            server.plan(answer(f"answer {n}"))
            session.turn(f"prompt {n}")
        first = compaction_reply("## Summary\nprompts 0 and 1 were answered", "opaque-1")
        server.plan(first)
        record = session.compact(strategy="native", keep_turns=1)

        asked = server.received[-1]
        body = asked.json()
        assert body["compaction"] == {"type": "summarize"}
        assert BETA in asked.headers["anthropic-beta"]
        assert texts(asked) == ["prompt 0", "answer 0", "prompt 1", "answer 1"]
        assert body["system"][0]["text"] == "You are terse."
        assert record.strategy is parley.CompactionStrategy.NATIVE
        assert record.messages == ()  # nothing any other model could read
        assert record.native is not None and record.native.provider == "anthropic"
        assert record.native.item == block_of(first)  # verbatim
        assert record.text == "## Summary\nprompts 0 and 1 were answered"
        assert record.usage is not None and record.usage.input_tokens == 900

        # The next request to Anthropic starts with the block, then the turns after it.
        server.plan(answer("answer 3"))
        session.turn("prompt 3")
        sent = server.received[-1]
        messages = sent.json()["messages"]
        assert messages[0] == {"role": "assistant", "content": [block_of(first)]}
        assert texts(sent) == ["prompt 2", "answer 2", "prompt 3"]
        assert BETA in sent.headers["anthropic-beta"]

        # A newer one starts from it: the request sends the older block first.
        second = compaction_reply("## Summary\nprompts 0 to 2 were answered", "opaque-2")
        server.plan(second)
        newer = session.compact(strategy="native", keep_turns=1)
        assert server.received[-1].json()["messages"][0]["content"] == [block_of(first)]
        assert texts(server.received[-1]) == ["prompt 2", "answer 2"]  # the newest kept

        # Dropped, the older one applies again; both dropped, the turns are sent whole.
        session.drop_compaction(newer.compaction_id)
        server.plan(answer("answer 4"))
        session.turn("prompt 4")
        assert server.received[-1].json()["messages"][0]["content"] == [block_of(first)]
        session.drop_compaction(record.compaction_id)
        server.plan(answer("answer 5"))
        session.turn("prompt 5")
        assert texts(server.received[-1])[:2] == ["prompt 0", "answer 0"]
        assert "anthropic-beta" not in server.received[-1].headers

        # Made again: any other model gets the turns, never the opaque block.
        server.plan(compaction_reply("## Summary\nall of it", "opaque-3"))
        session.compact(strategy="native", keep_turns=1)
    scripted = RecordingModel(
        parley.models.ScriptedModel({"rules": [{"when": ".*", "steps": [{"text": "ok"}]}]})
    )
    with parley.connect(db, host=parley.Host(model=scripted)) as other:
        other.session(session.id).turn("prompt 6")
        sent_other = scripted.requests[-1].messages
        assert scripted.requests[-1].native is None
        prompts = [m.text for m in sent_other if isinstance(m, UserMessage)]
        assert prompts == [f"prompt {n}" for n in range(7)]
        # And it cannot make one: its provider has no compaction of its own.
        with pytest.raises(InvalidRequest, match="natively"):
            other.session(session.id).compact(strategy="native", keep_turns=1)
    assert server.pending() == 0


def test_a_host_compacts_natively_before_a_turns_first_call(
    server: ProviderServer, tmp_path: Path
) -> None:
    policy = parley.Compaction(strategy="native", threshold=0.5, keep_turns=1, window=200)
    host = anthropic_host(server, compaction=policy)
    with parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host=host) as client:
        session = client.open_session(str(tmp_path))
        long = "x" * 300  # about 75 tokens: two turns of them pass 100
        for n in range(2):
            server.plan(answer(f"answer {n}"))
            session.turn(f"{long} {n}")
        assert session.compactions() == []  # the second turn had nothing to cover yet
        made = compaction_reply("## Summary\nthe first turn", "opaque-auto")
        server.plan(made, answer("answer 2"))
        result = session.turn(f"{long} 2")

        asked, sent = server.received[-2:]
        assert asked.json()["compaction"] == {"type": "summarize"}
        assert texts(asked) == [f"{long} 0", "answer 0"]
        assert sent.json()["messages"][0]["content"] == [block_of(made)]
        assert texts(sent) == [f"{long} 1", "answer 1", f"{long} 2"]
        (record,) = session.compactions()
        assert record.made_by_turn_id == result.turn_id
        assert record.native is not None and record.native.item == block_of(made)
        # Shown in its turn, and paid for by it.
        kinds = [e.kind for e in client.attach(result.turn_id).events()]
        assert kinds.index(EventKind.COMPACTED) < kinds.index(EventKind.STEP)
        assert result.usage.input_tokens >= 900
