"""The gateway's ``GET /metrics``: a real ``parley gateway`` (embedded, so it runs the
turns too) scraped over HTTP after a turn it streamed; and the token that
``PARLEY_METRICS_TOKEN`` may ask for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import parley
from parley.gateway import GatewaySettings, create_app
from tests.support.fleet import REPO
from tests.support.gateway import make_tokens, start_gateway
from tests.support.scrape import parse, scrape
from tests.support.waiting import wait_until


def embedded_env(directory: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    return {
        **base,
        "PARLEY_DATABASE_URL": f"sqlite:///{directory / 'parley.db'}",
        "PARLEY_HOST": "tests.support.hosts:workspace_host",
        "PYTHONPATH": str(REPO),
    }


def test_the_gateway_counts_the_turns_it_ran_and_the_streams_it_served(tmp_path: Path) -> None:
    gateway = start_gateway(embedded_env(tmp_path), tmp_path / "gw", tokens=make_tokens(["acme"]))
    try:
        acme = gateway.tenant("acme")
        gated = [
            {"tool_calls": [{"name": "wait_for_gate"}]},
            {"text": "streamed", "chunk_chars": 2},
        ]
        acme.control.script([{"when": ".*", "steps": gated}])
        metrics = f"{gateway.url}/metrics"
        before = scrape(metrics)  # no token: none is configured for it
        assert before.families["parley_sse_connections"] == "gauge"
        assert before.families["parley_turns_ended"] == "counter"
        assert before.families["parley_turn_duration_seconds"] == "histogram"

        session = acme.new_session(workspace="repo")
        turn = acme.submit(session["id"], "hello")
        with acme.stream(turn["turn_id"]) as stream:
            messages = stream.events()
            events = [next(messages).json()]
            acme.control.wait_entered()
            during = scrape(metrics)  # while the turn waits and its stream is open
            acme.control.open_gate()
            events.extend(m.json() for m in messages)
        assert events[-1]["kind"] == "end" and events[-1]["data"]["outcome"] == "finished"
        assert during.value("parley_sse_connections") == 1
        assert during.value("parley_turns_in_flight") == 1

        after = scrape(metrics)
        assert after.value("parley_turns_submitted_total") == 1
        assert after.value("parley_turns_started_total", start="new") == 1
        assert after.value("parley_turns_ended_total", outcome="finished") == 1
        assert after.value("parley_steps_total") == 2
        assert after.value("parley_tool_calls_total", tool="wait_for_gate") == 1
        assert after.value("parley_first_token_latency_seconds_count") == 1
        assert after.value("parley_sse_connections_opened_total") == 1
        # The driver lets its turn go, and the stream its connection, just after the end.
        wait_until(
            lambda: (
                (now := scrape(metrics)).value("parley_sse_connections") == 0
                and now.value("parley_turns_in_flight") == 0
            ),
            what="the stream's connection and the turn to be counted done",
        )
        assert "GET /metrics 200" in gateway.logs()  # in the access log like any route
    finally:
        gateway.stop()


def test_a_metrics_token_guards_the_metrics_and_no_tenant_token_opens_them(tmp_path: Path) -> None:
    metrics_token = "metrics-0123456789abcdef"
    tenant_token = "tenant-0123456789abcdef"
    settings = GatewaySettings.from_environment(
        {
            "PARLEY_WORKSPACES": str(tmp_path),
            "PARLEY_GATEWAY_TOKENS": f"{tenant_token}=acme",
            "PARLEY_METRICS_TOKEN": metrics_token,
        }
    )
    client = parley.connect(f"sqlite:///{tmp_path / 'p.db'}")
    with TestClient(create_app(client, settings)) as http:
        for headers in ({}, {"Authorization": f"Bearer {tenant_token}"}):
            refused = http.get("/metrics", headers=headers)
            assert refused.status_code == 401, refused.text
            assert refused.json()["error"]["type"] == "Unauthorized"
            assert refused.headers["www-authenticate"] == "Bearer"
        answered = http.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
        assert answered.status_code == 200
        assert "parley_turns_in_flight" in parse(answered.text).families
        # OpenMetrics for a scraper that asks for it, as prometheus_client's own server.
        open_metrics = http.get(
            "/metrics",
            headers={
                "Authorization": f"Bearer {metrics_token}",
                "Accept": "application/openmetrics-text; version=1.0.0",
            },
        )
        assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
        assert open_metrics.text.rstrip().endswith("# EOF")
        # Not part of the documented API.
        assert "/metrics" not in http.get("/openapi.json").json()["paths"]


def test_a_malformed_metrics_token_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(parley.errors.InvalidRequest, match="PARLEY_METRICS_TOKEN") as refused:
        GatewaySettings.from_environment(
            {"PARLEY_WORKSPACES": str(tmp_path), "PARLEY_METRICS_TOKEN": "short"}
        )
    assert "short" not in str(refused.value)  # a token, even a bad one, is never repeated
