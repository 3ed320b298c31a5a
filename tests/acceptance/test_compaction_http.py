"""A compaction asked for over HTTP whose model call fails at the provider
(docs/http.md#5-requests-and-refusals): a real ``parley gateway`` whose host's model is
an OpenAI-compatible server on loopback (``tests/providers/servers.py``).  The refusal
says the provider failed (``502``; ``503`` with ``Retry-After`` when it limited the
rate), not that the gateway did (``500``), and nothing is stored.  A summary's model
call is heavy work (docs/security.md#6-heavy-work): one tenant's compactions waiting on
their provider hold none of the threads another tenant's reads need."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.providers.servers import ProviderServer, Reply, openai_server, openai_text
from tests.support.fleet import REPO
from tests.support.gateway import Gateway, make_tokens, start_gateway
from tests.support.waiting import wait_until

READ_SECONDS = 10.0
"""How long another tenant's read may take while compactions wait on the provider: it
waits on nothing, so this is slack for a loaded machine."""
CALLS = 45
"""Compactions asked at once: more than the routes' shared pool has threads (40)."""


@pytest.fixture
def provider() -> Iterator[ProviderServer]:
    with openai_server() as server:
        yield server


@pytest.fixture
def gateway(tmp_path: Path, provider: ProviderServer) -> Iterator[Gateway]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")},
        "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'parley.db'}",
        "PARLEY_HOST": "tests.support.hosts:provider_host",
        "PARLEY_TEST_PROVIDER_URL": provider.base_url,
        "PYTHONPATH": str(REPO),
    }
    started = start_gateway(env, tmp_path / "gateway", tokens=make_tokens(["alpha", "beta"]))
    yield started
    started.stop()


def test_a_summary_the_provider_refuses_is_a_provider_error_and_stores_nothing(
    gateway: Gateway, provider: ProviderServer
) -> None:
    tenant = gateway.tenant()
    session = tenant.new_session()
    for n in range(2):
        provider.plan(Reply(frames=openai_text(f"answer {n}")))
        turn = tenant.submit(session["id"], f"question {n}")
        assert tenant.result(turn["turn_id"])["status"] == "finished"
    compact = f"/v1/sessions/{session['id']}/compact"
    listed = f"/v1/sessions/{session['id']}/compactions"
    events_before = tenant.event_json(turn["turn_id"])

    provider.plan(Reply(status=401, body={"error": {"message": "no such key", "type": "auth"}}))
    refused = tenant.http.post(compact, json={"strategy": "summarize", "keep_turns": 1})
    assert refused.status_code == 502, refused.text
    assert refused.json()["error"]["type"] == "ProviderError"
    assert "401" in refused.json()["error"]["message"]

    limited = {"error": {"message": "slow down", "type": "requests"}}
    provider.plan(Reply(status=429, headers={"retry-after": "7"}, body=limited))
    throttled = tenant.http.post(compact, json={"strategy": "summarize", "keep_turns": 1})
    assert throttled.status_code == 503, throttled.text
    assert throttled.json()["error"]["type"] == "ProviderError"
    assert throttled.headers["retry-after"] == "7"

    assert tenant.http.get(listed).json() == {"compactions": []}
    assert tenant.event_json(turn["turn_id"]) == events_before


def test_compactions_waiting_on_their_provider_do_not_delay_another_tenants_reads(
    gateway: Gateway, provider: ProviderServer
) -> None:
    tenant, reader = gateway.tenant(), gateway.tenant()
    session = tenant.new_session()
    provider.plan(Reply(frames=openai_text("answer")))
    turn = tenant.submit(session["id"], "question")
    assert tenant.result(turn["turn_id"])["status"] == "finished"
    gate = threading.Event()
    summary = openai_text("## Goal\nanswers")
    provider.plan(*[Reply(frames=summary, gate=gate, gate_timeout=60) for _ in range(CALLS)])
    answered: list[int] = []

    def compact() -> None:
        body = {"strategy": "summarize", "keep_turns": 0}
        url = f"/v1/sessions/{session['id']}/compact"
        answered.append(tenant.http.post(url, json=body, timeout=120).status_code)

    askers = [threading.Thread(target=compact) for _ in range(CALLS)]
    try:
        for asker in askers:
            asker.start()
        # The turn's call, then the tenant's share of the heavy threads (two) asking.
        wait_until(lambda: len(provider.received) == 1 + 2, what="summaries asked")
        read: list[int] = []
        reading = threading.Thread(
            target=lambda: read.append(reader.http.get("/v1/sessions", timeout=60).status_code)
        )
        reading.start()
        reading.join(READ_SECONDS)
        assert read == [200], "the read waited for another tenant's compactions"
        assert len(provider.received) == 1 + 2  # the others wait without a thread
    finally:
        gate.set()
        for asker in askers:
            asker.join(120)
    # Each is answered once the gate opens: stored, or refused if made from the same
    # history as one stored meanwhile.
    assert len(answered) == CALLS and set(answered) <= {201, 409} and 201 in answered
