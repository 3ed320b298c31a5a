"""A submission that says it will be streamed (``Prefer: stream``) starts its turn's feed
in the gateway (src/parley/gateway/feeds.py, ``Feeds.follow_submitted``): the stream that
comes after gets every event from seq 1 (or from its ``Last-Event-ID``) whenever it
comes; a feed whose stream never comes goes away, and no more than ``MAX_UNCLAIMED`` wait
at once; another tenant is not let in by the feed; a submission that does not say so
starts no feed; a Responses create with ``stream``, an AG-UI run and an AI SDK chat start
the feed their stream reads.  On an embedded gateway in this process (its feeds are looked at
directly), with two tenants."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import parley
from parley.gateway import GatewaySettings, create_app, feeds
from parley.gateway.feeds import Feeds
from tests.support.helpers import scripted_host
from tests.support.sse import sse_messages
from tests.support.waiting import wait_until

ACME = "acme-token-0123456789abcdef"
BRAVO = "bravo-token-0123456789abcdef"
TEXT = "".join(f"s{i:02d} " for i in range(40))  # 40 tokens, 10 ms apart
RULES = [{"when": ".*", "steps": [{"text": TEXT, "chunk_chars": 4, "delay_ms": 10}]}]


@dataclass
class Gateway:
    """The gateway in this process: its HTTP client, its feeds and its parley client."""

    http: TestClient
    feeds: Feeds
    client: parley.Client

    def session(self, token: str = ACME) -> str:
        answer = self.http.post("/v1/sessions", json={}, headers=auth(token))
        assert answer.status_code == 201, answer.text
        session_id: str = answer.json()["id"]
        return session_id

    def submit(self, session_id: str, *, prefer: str | None = None) -> Any:
        headers = auth(ACME) | ({"Prefer": prefer} if prefer is not None else {})
        answer = self.http.post(
            f"/v1/sessions/{session_id}/turns", json={"prompt": "go"}, headers=headers
        )
        assert answer.status_code == 202, answer.text
        return answer

    def seqs(self, turn_id: str, token: str = ACME, **headers: str) -> list[int]:
        """The seqs the turn's event stream sends (it ends after the turn's end)."""
        with self.http.stream(
            "GET", f"/v1/turns/{turn_id}/events", headers=auth(token) | headers
        ) as answer:
            assert answer.status_code == 200, answer.read()
            messages = sse_messages(answer.iter_lines())
            return [int(m.id) for m in messages if m.comment is None and m.id is not None]

    def truth(self, turn_id: str) -> list[int]:
        """Every seq the turn has, as the client reads them."""
        return [event.seq for event in self.client.attach(turn_id).events()]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    settings = GatewaySettings.from_environment(
        {
            "PARLEY_WORKSPACES": str(tmp_path / "workspaces"),
            "PARLEY_GATEWAY_TOKENS": f"{ACME}=acme,{BRAVO}=bravo",
        }
    )
    client = parley.connect(f"sqlite:///{tmp_path / 'p.db'}", host=scripted_host(RULES))
    app = create_app(client, settings)
    with TestClient(app) as http:
        yield Gateway(http, app.state.feeds, client)


def feed_threads(turn_id: str) -> list[threading.Thread]:
    """The threads following the turn (a feed's thread is named after the turn)."""
    return [t for t in threading.enumerate() if t.name == f"parley-feed-{turn_id[:8]}"]


@pytest.mark.parametrize("delay", [0.0, 0.2, "ended"])
def test_a_streamed_submissions_stream_gets_every_event_from_seq_1_whenever_it_comes(
    gateway: Gateway, delay: float | str
) -> None:
    answer = gateway.submit(gateway.session(), prefer="stream")
    assert answer.headers["Preference-Applied"] == "stream"
    turn_id = answer.json()["turn_id"]
    assert gateway.feeds.unclaimed == 1 and feed_threads(turn_id)
    if delay == "ended":
        wait_until(lambda: gateway.feeds.live == 0, what="the feed read the turn to its end")
    else:
        assert isinstance(delay, float)
        time.sleep(delay)
    seen = gateway.seqs(turn_id)
    truth = gateway.truth(turn_id)
    assert len(truth) > 20 and truth[0] == 1
    assert seen == truth
    assert gateway.feeds.unclaimed == 0  # the stream took the feed the submission started
    # A reader resuming after seq 5 gets what follows it, once each, in order.
    assert gateway.seqs(turn_id, **{"Last-Event-ID": "5"}) == [s for s in truth if s > 5]


def test_another_tenant_cannot_read_a_turns_prestarted_feed(gateway: Gateway) -> None:
    answer = gateway.submit(gateway.session(), prefer="respond-async, stream; x=1")
    assert answer.headers["Preference-Applied"] == "stream"
    turn_id = answer.json()["turn_id"]
    refused = gateway.http.get(f"/v1/turns/{turn_id}/events", headers=auth(BRAVO))
    assert refused.status_code == 404, refused.text
    assert refused.json()["error"]["type"] == "TurnNotFound"
    assert gateway.feeds.owned(turn_id, "bravo") is None
    assert gateway.feeds.unclaimed == 1  # still waiting for its own tenant's stream
    assert gateway.seqs(turn_id) == gateway.truth(turn_id)


def test_a_prestarted_feed_nobody_reads_goes_away(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feeds, "UNCLAIMED_SECONDS", 0.5)
    turn_id = gateway.submit(gateway.session(), prefer="stream").json()["turn_id"]
    assert gateway.feeds.unclaimed == 1 and feed_threads(turn_id)
    wait_until(lambda: gateway.feeds.unclaimed == 0, 10, "the unread feed to be retired")
    wait_until(lambda: not feed_threads(turn_id), 10, "the unread feed's thread to end")
    assert gateway.feeds.owned(turn_id, "acme") is None  # forgotten: a stream reads it anew
    assert gateway.seqs(turn_id) == gateway.truth(turn_id)


def test_no_more_than_max_unclaimed_prestarted_feeds_wait_at_once(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feeds, "MAX_UNCLAIMED", 2)
    answers = [gateway.submit(gateway.session(), prefer="stream") for _ in range(3)]
    assert [a.headers.get("Preference-Applied") for a in answers] == ["stream", "stream", None]
    assert gateway.feeds.unclaimed == 2
    # Each stream has every event, the one whose submission started no feed too.
    for answer in reversed(answers):
        turn_id = answer.json()["turn_id"]
        assert gateway.seqs(turn_id) == gateway.truth(turn_id)
    assert gateway.feeds.unclaimed == 0


@pytest.mark.parametrize("prefer", [None, "respond-async", "streaming, wait=5"])
def test_a_submission_that_does_not_say_it_streams_starts_no_feed(
    gateway: Gateway, prefer: str | None
) -> None:
    answer = gateway.submit(gateway.session(), prefer=prefer)
    assert "Preference-Applied" not in answer.headers
    turn_id = answer.json()["turn_id"]
    assert gateway.feeds.unclaimed == 0 and gateway.feeds.live == 0
    assert not feed_threads(turn_id)
    waited = gateway.http.get(f"/v1/turns/{turn_id}/result?wait=30", headers=auth(ACME))
    assert waited.status_code == 200 and waited.json()["status"] == "finished"
    assert gateway.feeds.live == 0 and not feed_threads(turn_id)  # the ends watcher's wait


USER = {"id": "m1", "role": "user"}
PROTOCOL_STREAMS = {
    "responses": ("/v1/responses", {"input": "go", "stream": True}),
    "ag-ui": (
        "/v1/ag-ui",
        {"threadId": "t1", "runId": "r1", "messages": [{**USER, "content": "go"}]},
    ),
    "ai-sdk": (
        "/v1/chat",
        {"id": "c1", "messages": [{**USER, "parts": [{"type": "text", "text": "go"}]}]},
    ),
}


@pytest.mark.parametrize("protocol", list(PROTOCOL_STREAMS))
def test_a_protocols_streaming_submission_starts_the_feed_its_stream_reads(
    gateway: Gateway, protocol: str
) -> None:
    # The feed a submission starts is the only kind that knows its turn's tenant: one
    # that the stream started would not answer Feeds.owned.  It lingers after the stream.
    path, body = PROTOCOL_STREAMS[protocol]
    with gateway.http.stream("POST", path, json=body, headers=auth(ACME)) as answer:
        assert answer.status_code == 200, answer.read()
        raw = answer.read()
    assert raw
    sessions = gateway.client.session_records(tenant="acme", limit=10)
    (turn_id,) = [t.turn_id for s in sessions for t in gateway.client.tree_of(s.session_id)]
    assert gateway.feeds.owned(turn_id, "acme") is not None
    assert gateway.feeds.owned(turn_id, "bravo") is None
    assert gateway.feeds.unclaimed == 0  # the stream took it
