"""The HTTP gateway (docs/http.md) through a real ``parley gateway`` process, on every
deployment: embedded on SQLite, embedded on PostgreSQL, and a fleet producer in front of
real workers.  Route by route and status by status: the resources, the event stream, the
error form, tenants, workspaces and tokens.

One gateway per deployment serves the module (``tests/support/gateway.py``); each test takes
fresh tenants from it, so its scripted model's rules and its sessions are its own.  The
approval and protocol routes (AG-UI, chat, responses) are tested with their features.
"""

from __future__ import annotations

import io
import itertools
import json
import re
import stat
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from openai import OpenAI
from sqlalchemy import select

import parley
from parley.schemas import tables
from parley.schemas.events import EventKind
from tests.support.deployments import ALL, on_deployments
from tests.support.gateway import (
    Gateway,
    Gateways,
    Tenant,
    deployment_env,
    gateway_fixtures,
    make_tokens,
    scripted_tenant,
    start_gateway,
)
from tests.support.sse import SseMessage

pytestmark = on_deployments(*ALL)

KEEPALIVE_SECONDS = 0.5

SESSION_FIELDS = {"id", "workspace", "metadata", "head_turn_id", "created_at", "title", "batch_id"}
TURN_FIELDS = {
    "turn_id",
    "session_id",
    "parent_id",
    "run_id",
    "prompt",
    "status",
    "reply",
    "created_at",
    "waiting_for",
    "not_before",
    "waiting_event",
}
DETAIL_FIELDS = TURN_FIELDS | {
    "steps",
    "usage",
    "error",
    "undelivered",
    "pending_approvals",
    "children",
}
EVENT_FIELDS = {"turn_id", "seq", "kind", "data"}
STATUSES = {
    "queued",
    "running",
    "waiting",
    "finished",
    "succeeded",
    "check_failed",
    "budget_exceeded",
    "cancelled",
    "failed",
}
TERMINAL = STATUSES - {"queued", "running", "waiting"}
# The routes of docs/http.md#4-routes but approvals and the protocols (tested with their features).
ROUTES = [
    ("post", "/v1/sessions"),
    ("get", "/v1/sessions"),
    ("get", "/v1/sessions/{session_id}"),
    ("patch", "/v1/sessions/{session_id}"),
    ("post", "/v1/sessions/{session_id}/turns"),
    ("get", "/v1/sessions/{session_id}/history"),
    ("get", "/v1/sessions/{session_id}/tree"),
    ("post", "/v1/sessions/{session_id}/branch"),
    ("post", "/v1/sessions/{session_id}/compact"),
    ("get", "/v1/sessions/{session_id}/compactions"),
    ("delete", "/v1/sessions/{session_id}/compactions/{compaction_id}"),
    ("get", "/v1/turns/{turn_id}"),
    ("get", "/v1/turns/{turn_id}/events"),
    ("get", "/v1/turns/{turn_id}/result"),
    ("post", "/v1/turns/{turn_id}/say"),
    ("post", "/v1/turns/{turn_id}/interrupt"),
    ("post", "/v1/turns/{turn_id}/resume"),
    ("get", "/healthz"),
    ("get", "/readyz"),
]

ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
GATED = {
    "when": "^gated",
    "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "ok: {last_message}"}],
}
RETRY = {
    "when": "retry policy",
    "steps": [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "retry.py"}}]},
        {"text": "It retries 502 and 504.", "chunk_chars": 4},
    ],
}
LOOP = {
    "when": "^loop",
    "steps": [{"tool_calls": [{"name": "read_file", "arguments": {"path": "missing.txt"}}]}],
}
STREAM_TEXT = "".join(f"word{i} " for i in range(60))
STREAM = {"when": "^stream", "steps": [{"text": STREAM_TEXT, "chunk_chars": 6, "delay_ms": 25}]}


# ------------------------------------------------------------------------ fixtures


gateways, gateway = gateway_fixtures(
    "gateways", {"PARLEY_GATEWAY_KEEPALIVE": str(KEEPALIVE_SECONDS)}
)


@pytest.fixture
def alpha(gateway: Gateway) -> Tenant:
    return scripted_tenant(gateway, [GATED, RETRY, LOOP, STREAM, ECHO])


@pytest.fixture
def beta(gateway: Gateway) -> Tenant:
    return scripted_tenant(gateway, [GATED, RETRY, LOOP, STREAM, ECHO])


# ------------------------------------------------------------------------ helpers


def unknown_id() -> str:
    return str(uuid.uuid4())


def assert_error(response: httpx.Response, status: int, type_name: str) -> dict[str, Any]:
    """``response`` is the error form with ``status`` and ``type``, and names nothing of
    the server's insides."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body: dict[str, Any] = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == type_name, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    for internal in ("Traceback", 'File "', ".py", "sqlalchemy", "psycopg"):
        assert internal not in response.text, response.text
    return body


def assert_utc(value: str) -> None:
    """An ISO 8601 time in UTC."""
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    assert parsed.utcoffset() is not None and parsed.utcoffset() == UTC.utcoffset(None), value


def ended_events(tenant: Tenant, turn_id: str) -> list[dict[str, Any]]:
    """The durable events of an ended turn (tokens may age out of the replay buffer)."""
    return [e for e in tenant.event_json(turn_id) if e["kind"] != "token"]


def snapshot(tenant: Tenant) -> dict[str, Any]:
    """What a refused request must not change: the tenant's sessions, each session's
    tree, every ended turn's durable events, and the tenant's workspace directories."""
    listing = tenant.http.get("/v1/sessions", params={"limit": 200})
    assert listing.status_code == 200, listing.text
    sessions = listing.json()["sessions"]
    state: dict[str, Any] = {
        "sessions": sessions,
        "workspaces": sorted(p.name for p in tenant.workspaces.iterdir()),
    }
    for session in sessions:
        tree = tenant.http.get(f"/v1/sessions/{session['id']}/tree").json()["turns"]
        state[session["id"]] = tree
        for turn in tree:
            if turn["status"] in TERMINAL:
                state[turn["turn_id"]] = ended_events(tenant, turn["turn_id"])
    return state


def tree_of(tenant: Tenant, session_id: str) -> list[dict[str, Any]]:
    response = tenant.http.get(f"/v1/sessions/{session_id}/tree")
    assert response.status_code == 200, response.text
    turns: list[dict[str, Any]] = response.json()["turns"]
    return turns


def history_of(tenant: Tenant, session_id: str) -> list[dict[str, Any]]:
    response = tenant.http.get(f"/v1/sessions/{session_id}/history")
    assert response.status_code == 200, response.text
    turns: list[dict[str, Any]] = response.json()["turns"]
    return turns


def session_of(tenant: Tenant, session_id: str) -> dict[str, Any]:
    response = tenant.http.get(f"/v1/sessions/{session_id}")
    assert response.status_code == 200, response.text
    session: dict[str, Any] = response.json()
    return session


def requests_of(tenant: Tenant, turn_id: str) -> list[dict[str, Any]]:
    """What the scripted model was sent for the turn."""
    return [r for r in tenant.control.requests() if r["turn_id"] == turn_id]


def gated_turn(tenant: Tenant, session_id: str, prompt: str = "gated job") -> dict[str, Any]:
    """A turn held inside its first step's tool call until the test opens the gate."""
    turn = tenant.submit(session_id, prompt)
    tenant.control.wait_entered()
    return turn


def check_frames(messages: list[SseMessage]) -> list[dict[str, Any]]:
    """Each frame is ``id: SEQ``, ``event: KIND``, ``data: Event JSON``; the events."""
    events = []
    for message in messages:
        event = message.json()
        assert set(event) == EVENT_FIELDS, event
        assert message.id == str(event["seq"]), message
        assert message.event == event["kind"], message
        events.append(event)
    return events


# ------------------------------------------------------------------------ sessions


def test_sessions_are_created_read_and_listed_newest_first_in_pages(alpha: Tenant) -> None:
    response = alpha.http.post(
        "/v1/sessions", json={"workspace": "project-1", "metadata": {"team": ["a", 1]}}
    )
    assert response.status_code == 201, response.text
    named = response.json()
    assert set(named) == SESSION_FIELDS
    assert named["workspace"] == "project-1"
    assert named["metadata"] == {"team": ["a", 1]}
    assert named["head_turn_id"] is None
    assert_utc(named["created_at"])
    assert response.headers["location"] == f"/v1/sessions/{named['id']}"
    assert (alpha.workspaces / "project-1").is_dir()
    assert session_of(alpha, named["id"]) == named

    plain = alpha.new_session()  # no workspace: it is named after the session
    assert plain["workspace"] == plain["id"] and plain["metadata"] == {}
    assert (alpha.workspaces / plain["id"]).is_dir()
    bodiless = alpha.http.post("/v1/sessions")  # every field is optional, so is the body
    assert bodiless.status_code == 201, bodiless.text
    assert bodiless.json()["workspace"] == bodiless.json()["id"]
    shared = alpha.new_session(workspace="project-1")  # sessions may share one
    assert shared["workspace"] == "project-1" and shared["id"] != named["id"]
    longest = alpha.new_session(workspace="W" * 64)
    assert longest["workspace"] == "W" * 64

    ids = [named["id"], plain["id"], bodiless.json()["id"], shared["id"], longest["id"]]
    ids += [alpha.new_session()["id"] for _ in range(47)]  # 52 in all
    newest_first = ids[::-1]

    listing = alpha.http.get("/v1/sessions")
    assert listing.status_code == 200
    assert set(listing.json()) == {"sessions"}
    sessions = listing.json()["sessions"]
    assert [s["id"] for s in sessions] == newest_first[:50]  # the default limit
    assert sessions[-1] == session_of(alpha, newest_first[49])

    pages: list[str] = []
    before: str | None = None
    while True:
        params: dict[str, Any] = (
            {"limit": 20} if before is None else {"limit": 20, "before": before}
        )
        page = alpha.http.get("/v1/sessions", params=params).json()["sessions"]
        assert len(page) <= 20
        pages += [s["id"] for s in page]
        if len(page) < 20:
            break
        before = page[-1]["id"]
    assert pages == newest_first
    everything = alpha.http.get("/v1/sessions", params={"limit": 200}).json()["sessions"]
    assert [s["id"] for s in everything] == newest_first
    last = alpha.http.get("/v1/sessions", params={"before": ids[0]}).json()["sessions"]
    assert last == []


def test_listing_refuses_bad_limits_and_unknown_pages(alpha: Tenant) -> None:
    alpha.new_session()
    for limit in ("0", "-1", "many", "1.5"):
        assert_error(alpha.http.get("/v1/sessions", params={"limit": limit}), 422, "InvalidRequest")
    for before in (unknown_id(), "a\x00b", "x" * 36):
        missing = alpha.http.get("/v1/sessions", params={"before": before})
        assert_error(missing, 404, "SessionNotFound")


def submit_batch(gateway: Gateway, tenant: Tenant, bodies: list[dict[str, Any]]) -> str:
    """A batch of Responses lines, made as the ``openai`` client makes one; its id."""
    api = OpenAI(base_url=f"{gateway.url}/v1", api_key=tenant.token)
    rows = [
        json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/responses", "body": b})
        for n, b in enumerate(bodies)
    ]
    data = io.BytesIO(("\n".join(rows) + "\n").encode())
    upload = api.files.create(file=("lines.jsonl", data), purpose="batch")
    batch = api.batches.create(
        input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h"
    )
    return batch.id


def test_a_listing_leaves_out_the_sessions_batch_lines_opened_when_asked(
    gateway: Gateway, alpha: Tenant
) -> None:
    conversation = alpha.new_session()
    assert conversation["batch_id"] is None
    lines = [{"input": "one"}, {"input": "two", "conversation": conversation["id"]}, {"input": "3"}]
    batch_id = submit_batch(gateway, alpha, lines)
    later = alpha.new_session()

    everything = alpha.http.get("/v1/sessions").json()["sessions"]
    opened = [s for s in everything if s["batch_id"] == batch_id]
    assert len(everything) == 4 and len(opened) == 2  # every session, by default
    assert {s["title"] for s in opened} == {"one", "3"}
    assert session_of(alpha, opened[0]["id"])["batch_id"] == batch_id
    conversations = [later["id"], conversation["id"]]  # the one a line continued is one
    listed = alpha.http.get("/v1/sessions", params={"batch_sessions": "false"})
    assert listed.status_code == 200, listed.text
    assert [s["id"] for s in listed.json()["sessions"]] == conversations
    paged = alpha.http.get(
        "/v1/sessions", params={"batch_sessions": "false", "limit": 1, "before": later["id"]}
    )
    assert [s["id"] for s in paged.json()["sessions"]] == conversations[1:]
    default = alpha.http.get("/v1/sessions", params={"batch_sessions": "true"})
    assert [s["id"] for s in default.json()["sessions"]] == [s["id"] for s in everything]
    refused = alpha.http.get("/v1/sessions", params={"batch_sessions": "maybe"})
    assert_error(refused, 422, "InvalidRequest")


def test_a_json_get_answers_304_while_its_etag_names_it(
    gateway: Gateway, alpha: Tenant, beta: Tenant
) -> None:
    alpha.new_session()
    first = alpha.http.get("/v1/sessions")
    tag = first.headers["etag"]
    assert re.fullmatch(r'"[A-Za-z0-9_-]{22}"', tag), tag
    assert alpha.http.get("/v1/sessions").headers["etag"] == tag  # the body's, every time
    for named in (tag, f"W/{tag}", f'"elsewhere", {tag}', "*"):
        same = alpha.http.get("/v1/sessions", headers={"If-None-Match": named})
        assert same.status_code == 304, (named, same.status_code)
        assert same.content == b"" and "content-type" not in same.headers
        assert same.headers["etag"] == tag
        assert {n: same.headers.get(n) for n in NO_SNIFF_NO_STORE} == NO_SNIFF_NO_STORE
    other = alpha.http.get("/v1/sessions", headers={"If-None-Match": '"elsewhere"'})
    assert other.status_code == 200 and other.json() == first.json()

    session = alpha.new_session()  # the list changed: a new tag, and the list
    changed = alpha.http.get("/v1/sessions", headers={"If-None-Match": tag})
    assert changed.status_code == 200 and changed.headers["etag"] != tag
    assert changed.json()["sessions"][0]["id"] == session["id"]
    # Another tenant's list is its own, whatever tag it sends.
    assert beta.http.get("/v1/sessions", headers={"If-None-Match": tag}).status_code == 200
    # Only a GET's JSON answer: a write, a refusal and a stream are answered as always.
    created = alpha.http.post("/v1/sessions", json={}, headers={"If-None-Match": "*"})
    assert created.status_code == 201 and "etag" not in created.headers
    missing = alpha.http.get(f"/v1/sessions/{unknown_id()}", headers={"If-None-Match": "*"})
    assert missing.status_code == 404 and "etag" not in missing.headers
    turn = alpha.submit(session["id"], "hello")
    alpha.result(turn["turn_id"])
    with alpha.stream(turn["turn_id"]) as stream:
        assert stream.response.status_code == 200 and "etag" not in stream.response.headers


def test_every_gateway_of_a_fleet_gives_an_answer_the_same_etag(
    gateways: Gateways, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """(The fleet only: a page's polls may reach any gateway of the fleet.)"""
    first = gateways.get("fleet-postgres", request)
    env = deployment_env("fleet-postgres", request, "")
    second = start_gateway(
        env, tmp_path, tokens=first.tokens, extra={"PARLEY_WORKSPACES": str(first.workspaces)}
    )
    try:
        alpha = first.tenant()
        alpha.new_session()
        tag = alpha.http.get("/v1/sessions").headers["etag"]
        also_alpha = second.tenant(alpha.name)
        again = also_alpha.http.get("/v1/sessions", headers={"If-None-Match": tag})
        assert again.status_code == 304, again.text
    finally:
        second.stop()


def test_a_session_is_titled_by_its_first_prompt_or_over_patch(alpha: Tenant) -> None:
    session = alpha.new_session()
    assert session["title"] is None  # no turn yet
    first = "  What does\tretry.py\nretry on?  " + "and then some " * 10
    alpha.result(alpha.submit(session["id"], first)["turn_id"])
    alpha.result(alpha.submit(session["id"], "a second prompt")["turn_id"])
    titled = session_of(alpha, session["id"])["title"]
    # One line, its words as typed, cut short for a list.
    assert titled.startswith("What does retry.py retry on? and then some")
    assert len(titled) == 80 and titled.endswith("…")
    listed = alpha.http.get("/v1/sessions").json()["sessions"]
    assert [s["title"] for s in listed if s["id"] == session["id"]] == [titled]

    renamed = alpha.http.patch(f"/v1/sessions/{session['id']}", json={"title": "Retries ✓"})
    assert renamed.status_code == 200, renamed.text
    assert set(renamed.json()) == SESSION_FIELDS
    assert renamed.json()["title"] == "Retries ✓" == session_of(alpha, session["id"])["title"]

    given = alpha.new_session(title="Chosen up front")
    assert given["title"] == "Chosen up front"
    alpha.result(alpha.submit(given["id"], "a first prompt")["turn_id"])
    assert session_of(alpha, given["id"])["title"] == "Chosen up front"  # kept


def test_a_bad_title_is_422_and_changes_nothing(alpha: Tenant, beta: Tenant) -> None:
    session = alpha.new_session(title="Kept")
    path = f"/v1/sessions/{session['id']}"
    for body in (
        {"title": None},
        {"title": 7},
        {"title": ""},
        {"title": "   "},
        {"title": "x" * 201},
        {"title": "two\nlines"},
        {"title": "an \x1b[31mescape"},
        {"title": "a\u2028separator"},
        {},
        {"title": "Kept", "workspace": "elsewhere"},
    ):
        assert_error(alpha.http.patch(path, json=body), 422, "InvalidRequest")
    assert_error(alpha.http.post("/v1/sessions", json={"title": "a\tb"}), 422, "InvalidRequest")
    assert alpha.http.patch(path, json={"title": "x" * 200}).status_code == 200
    assert_error(beta.http.patch(path, json={"title": "Mine"}), 404, "SessionNotFound")
    assert_error(
        alpha.http.patch(f"/v1/sessions/{unknown_id()}", json={"title": "t"}),
        404,
        "SessionNotFound",
    )
    assert session_of(alpha, session["id"])["title"] == "x" * 200


# ------------------------------------------------------------------------ turns


def test_a_turn_is_accepted_runs_and_reads_back_in_history_and_tree(alpha: Tenant) -> None:
    session = alpha.new_session()
    response = alpha.http.post(f"/v1/sessions/{session['id']}/turns", json={"prompt": "hello"})
    assert response.status_code == 202, response.text
    turn = response.json()
    assert set(turn) == TURN_FIELDS
    assert turn["session_id"] == session["id"] and turn["prompt"] == "hello"
    assert turn["parent_id"] is None and turn["status"] in STATUSES
    assert_utc(turn["created_at"])
    assert response.headers["location"] == f"/v1/turns/{turn['turn_id']}"

    done = alpha.result(turn["turn_id"])
    assert set(done) == DETAIL_FIELDS
    assert (done["turn_id"], done["run_id"]) == (turn["turn_id"], turn["run_id"])
    assert done["status"] == "finished" and done["reply"] == "heard: hello"
    assert done["steps"] == 1 and done["error"] is None
    assert set(done["usage"]) == {"input_tokens", "output_tokens"}
    assert done["usage"]["input_tokens"] > 0 and done["usage"]["output_tokens"] > 0
    assert done["undelivered"] == [] and done["pending_approvals"] == []
    details = alpha.http.get(f"/v1/turns/{turn['turn_id']}")
    assert details.status_code == 200 and details.json() == done

    second = alpha.submit(session["id"], "and again")
    assert alpha.result(second["turn_id"])["reply"] == "heard: and again"
    history = history_of(alpha, session["id"])
    assert [t["turn_id"] for t in history] == [turn["turn_id"], second["turn_id"]]
    assert all(set(t) == TURN_FIELDS for t in history)
    assert history[1]["parent_id"] == turn["turn_id"]
    assert history[0] == {k: done[k] for k in TURN_FIELDS}
    assert tree_of(alpha, session["id"]) == history
    assert session_of(alpha, session["id"])["head_turn_id"] == second["turn_id"]


def test_a_failed_turn_says_why_in_its_details(alpha: Tenant) -> None:
    alpha.control.fail_model("the model is down")
    session = alpha.new_session()
    turn = alpha.submit(session["id"], "hello")
    done = alpha.result(turn["turn_id"], wait=60)
    assert done["status"] == "failed" and done["reply"] is None
    assert "the model is down" in done["error"]
    end = alpha.event_json(turn["turn_id"])[-1]
    assert end["kind"] == "end" and end["data"]["outcome"] == "failed"


def test_a_repeated_request_id_or_idempotency_key_answers_the_same_turn(alpha: Tenant) -> None:
    session = alpha.new_session()
    turns = f"/v1/sessions/{session['id']}/turns"
    first = alpha.http.post(turns, json={"prompt": "do it once", "request_id": "req-42"})
    assert first.status_code == 202, first.text
    again = alpha.http.post(turns, json={"prompt": "do it once", "request_id": "req-42"})
    assert again.status_code == 200, again.text
    assert set(again.json()) == TURN_FIELDS
    assert (again.json()["turn_id"], again.json()["run_id"]) == (
        first.json()["turn_id"],
        first.json()["run_id"],
    )

    key = {"Idempotency-Key": "key-7"}
    keyed = alpha.http.post(turns, json={"prompt": "keyed"}, headers=key)
    assert keyed.status_code == 202, keyed.text
    keyed_again = alpha.http.post(turns, json={"prompt": "keyed"}, headers=key)
    assert keyed_again.status_code == 200, keyed_again.text
    assert keyed_again.json()["turn_id"] == keyed.json()["turn_id"]
    both = alpha.http.post(turns, json={"prompt": "keyed", "request_id": "key-7"}, headers=key)
    assert both.status_code == 200 and both.json()["turn_id"] == keyed.json()["turn_id"]

    alpha.result(first.json()["turn_id"])
    alpha.result(keyed.json()["turn_id"])
    after_end = alpha.http.post(turns, json={"prompt": "do it once", "request_id": "req-42"})
    assert after_end.status_code == 200
    assert after_end.json()["turn_id"] == first.json()["turn_id"]
    assert after_end.json()["status"] == "finished"

    before = snapshot(alpha)
    other_prompt = alpha.http.post(turns, json={"prompt": "something else", "request_id": "req-42"})
    assert_error(other_prompt, 409, "Conflict")
    differing = alpha.http.post(turns, json={"prompt": "x", "request_id": "a"}, headers=key)
    assert_error(differing, 422, "InvalidRequest")
    assert snapshot(alpha) == before
    tree = tree_of(alpha, session["id"])
    assert [t["turn_id"] for t in tree] == [first.json()["turn_id"], keyed.json()["turn_id"]]


def test_budgets_from_http_end_the_turn_budget_exceeded(alpha: Tenant) -> None:
    session = alpha.new_session()
    steps = alpha.submit(session["id"], "loop forever", max_steps=2)
    done = alpha.result(steps["turn_id"])
    assert done["status"] == "budget_exceeded" and done["reply"] is None
    assert done["steps"] == 2
    tokens = alpha.submit(session["id"], "loop again", max_tokens=10)
    done = alpha.result(tokens["turn_id"])
    assert done["status"] == "budget_exceeded" and done["reply"] is None
    unbounded = alpha.submit(session["id"], "no budget this time")
    assert alpha.result(unbounded["turn_id"])["status"] == "finished"


def test_if_busy_reject_is_409_session_busy_and_queues_nothing(alpha: Tenant) -> None:
    session = alpha.new_session()
    gated = gated_turn(alpha, session["id"])
    before = snapshot(alpha)
    rejected = alpha.http.post(
        f"/v1/sessions/{session['id']}/turns", json={"prompt": "rejected", "if_busy": "reject"}
    )
    assert_error(rejected, 409, "SessionBusy")
    assert snapshot(alpha) == before
    queued = alpha.submit(session["id"], "queued behind", if_busy="enqueue")
    alpha.control.open_gate()
    assert alpha.result(gated["turn_id"])["status"] == "finished"
    assert alpha.result(queued["turn_id"])["reply"] == "heard: queued behind"
    assert [t["prompt"] for t in tree_of(alpha, session["id"])] == ["gated job", "queued behind"]


def test_a_turn_with_a_check_or_an_unknown_field_is_refused_and_changes_nothing(
    alpha: Tenant,
) -> None:
    session = alpha.new_session()
    alpha.result(alpha.submit(session["id"], "first")["turn_id"])
    turns = f"/v1/sessions/{session['id']}/turns"
    before = snapshot(alpha)
    bodies: list[Any] = [
        {"prompt": "run the tests", "check": "pytest -q"},
        {"prompt": "run the tests", "check": None},
        {"prompt": "x", "promt": "typo"},
        {},
        {"prompt": ""},
        {"prompt": 5},
        {"prompt": None},
        {"prompt": "x", "if_busy": "sometimes"},
        {"prompt": "x", "max_steps": 0},
        {"prompt": "x", "max_tokens": -1},
        {"prompt": "x", "max_steps": "many"},
        {"prompt": "x", "max_steps": "5"},  # the JSON type declared, never a string of it
        {"prompt": "x", "max_tokens": "100"},
        {"prompt": "x", "max_steps": True},
        {"prompt": "x", "max_steps": 2.5},
        {"prompt": "x", "request_id": ""},
        {"prompt": "x", "request_id": "r" * 201},
        {"prompt": "x", "request_id": "nul\x00"},
        {"prompt": "nul\x00"},
        {"prompt": "   "},
        [],
        "a prompt",
        None,
    ]
    for body in bodies:
        response = alpha.http.post(turns, content=json.dumps(body), headers=JSON)
        assert_error(response, 422, "InvalidRequest")
    assert snapshot(alpha) == before


JSON = {"Content-Type": "application/json"}


def test_a_turns_priority_is_stored_and_one_that_is_no_lane_is_refused(
    gateway: Gateway, alpha: Tenant
) -> None:
    """``"priority"`` puts the turn in its lane (docs/admission.md#priority): the run is
    stored so; anything but the two lanes is 422 in the error form, and nothing changes."""
    session = alpha.new_session()
    batch = alpha.submit(session["id"], "a batch job", priority="batch")
    plain = alpha.submit(session["id"], "someone waits")
    asked = alpha.submit(session["id"], "asked for", priority="interactive")
    for turn in (batch, plain, asked):
        assert alpha.result(turn["turn_id"])["status"] == "finished"
    with parley.connect(gateway.env["PARLEY_DATABASE_URL"]) as reader:
        lanes = [reader.store.run_state(t["turn_id"]).priority for t in (batch, plain, asked)]
    assert lanes == ["batch", "interactive", "interactive"]

    turns = f"/v1/sessions/{session['id']}/turns"
    before = snapshot(alpha)
    for priority in ("urgent", "Batch", "", 1, 0, True, None, ["batch"], {"lane": "batch"}):
        body = {"prompt": "x", "priority": priority}
        response = alpha.http.post(turns, content=json.dumps(body), headers=JSON)
        message = assert_error(response, 422, "InvalidRequest")["error"]["message"]
        assert "priority" in message, message
    assert snapshot(alpha) == before


def test_a_turn_delayed_over_http_waits_for_its_time_and_a_bad_time_is_refused(
    gateway: Gateway, alpha: Tenant
) -> None:
    """``"at"`` (RFC 3339) or ``"after"`` (seconds) delays the turn (docs/time.md): it is
    answered queued with its ``not_before`` and ``waiting_for: "time"``, and starts no
    earlier; a time without its offset, a negative, infinite or non-numeric ``after``,
    or both at once are 422 in the error form, and nothing changes."""
    session = alpha.new_session()
    turns = f"/v1/sessions/{session['id']}/turns"
    asked = datetime.now(UTC) + timedelta(seconds=1.5)
    at = alpha.http.post(turns, json={"prompt": "at", "at": asked.isoformat()})
    assert at.status_code == 202, at.text
    assert at.json()["status"] == "queued" and at.json()["waiting_for"] == "time"
    assert datetime.fromisoformat(at.json()["not_before"].replace("Z", "+00:00")) == asked
    after = alpha.http.post(turns, json={"prompt": "after", "after": 0.5})
    assert after.json()["waiting_for"] == "time", after.text
    for turn in (at.json(), after.json()):
        assert alpha.result(turn["turn_id"])["status"] == "finished"
    with parley.connect(gateway.env["PARLEY_DATABASE_URL"]) as reader:
        runs = reader.store.engine.connect()
        with runs:
            began = runs.execute(
                select(tables.runs.c.started_at).where(
                    tables.runs.c.turn_id == at.json()["turn_id"]
                )
            ).scalar_one()
    assert (began if began.tzinfo else began.replace(tzinfo=UTC)) >= asked

    before = snapshot(alpha)
    for body in (
        {"at": "2030-01-01T09:00:00"},
        {"at": "tomorrow"},
        {"at": 1_900_000_000},
        {"after": -1},
        {"after": "60"},
        {"after": True},
        {"at": asked.isoformat(), "after": 5},
    ):
        response = alpha.http.post(turns, content=json.dumps({"prompt": "x", **body}), headers=JSON)
        assert_error(response, 422, "InvalidRequest")
    for raw in ('{"prompt": "x", "after": Infinity}', '{"prompt": "x", "after": NaN}'):
        refused = alpha.http.post(turns, content=raw, headers=JSON)
        assert refused.status_code in (400, 422), refused.text
    assert snapshot(alpha) == before


# ------------------------------------------------------------------------ branch


def test_branch_moves_the_head_and_refuses_foreign_unknown_and_unstarted_turns(
    alpha: Tenant,
) -> None:
    session = alpha.new_session()
    one = alpha.submit(session["id"], "one")
    alpha.result(one["turn_id"])
    two = alpha.submit(session["id"], "two")
    alpha.result(two["turn_id"])

    branch = f"/v1/sessions/{session['id']}/branch"
    moved = alpha.http.post(branch, json={"turn_id": one["turn_id"]})
    assert moved.status_code == 200, moved.text
    assert set(moved.json()) == SESSION_FIELDS
    assert moved.json()["head_turn_id"] == one["turn_id"]
    assert moved.json() == session_of(alpha, session["id"])
    three = alpha.submit(session["id"], "three")
    assert alpha.result(three["turn_id"])["parent_id"] == one["turn_id"]
    assert [t["prompt"] for t in history_of(alpha, session["id"])] == ["one", "three"]
    assert [t["prompt"] for t in tree_of(alpha, session["id"])] == ["one", "two", "three"]

    other = alpha.new_session()
    elsewhere = alpha.submit(other["id"], "elsewhere")
    alpha.result(elsewhere["turn_id"])
    gated = gated_turn(alpha, session["id"])
    waiting = alpha.submit(session["id"], "not started yet")

    before = snapshot(alpha)
    assert_error(
        alpha.http.post(branch, json={"turn_id": elsewhere["turn_id"]}), 409, "ForeignTurn"
    )
    assert_error(alpha.http.post(branch, json={"turn_id": unknown_id()}), 404, "TurnNotFound")
    assert_error(alpha.http.post(branch, json={"turn_id": waiting["turn_id"]}), 409, "Conflict")
    nowhere = f"/v1/sessions/{unknown_id()}/branch"
    assert_error(alpha.http.post(nowhere, json={"turn_id": one["turn_id"]}), 404, "SessionNotFound")
    for body in ({}, {"turn_id": ""}, {"turn_id": one["turn_id"], "also": 1}, {"turn_id": 7}):
        assert_error(alpha.http.post(branch, json=body), 422, "InvalidRequest")
    assert snapshot(alpha) == before

    alpha.control.open_gate()
    alpha.result(gated["turn_id"])
    alpha.result(waiting["turn_id"])


# ------------------------------------------------------------------------ compaction

COMPACTION_FIELDS = {
    "id",
    "session_id",
    "through_turn_id",
    "strategy",
    "text",
    "tokens_before",
    "tokens_after",
    "created_at",
    "made_by_turn_id",
    "dropped",
    "dropped_at",
    "usage",
}


def test_compact_lists_and_drops_and_refuses_what_it_cannot_do(alpha: Tenant, beta: Tenant) -> None:
    session = alpha.new_session()
    turns = [alpha.submit(session["id"], f"turn {n}") for n in range(3)]
    for turn in turns:
        alpha.result(turn["turn_id"])
    sid = session["id"]
    listed = f"/v1/sessions/{sid}/compactions"
    made = alpha.http.post(
        f"/v1/sessions/{sid}/compact", json={"strategy": "trim", "keep_turns": 1}
    )
    assert made.status_code == 201, made.text
    record = made.json()
    assert set(record) == COMPACTION_FIELDS
    assert record["through_turn_id"] == turns[1]["turn_id"]
    assert record["strategy"] == "trim" and not record["dropped"]
    assert record["made_by_turn_id"] is None
    assert alpha.http.get(listed).json() == {"compactions": [record]}
    # Its event is the head turn's newest.
    kinds = [e["kind"] for e in ended_events(alpha, turns[2]["turn_id"])]
    assert kinds[-2:] == ["end", "compacted"]

    before = snapshot(alpha)
    compact = f"/v1/sessions/{sid}/compact"
    for body in (
        {"strategy": "native"},
        {"strategy": "shrink"},
        {"keep_turns": -1},
        {"keep_turns": "1"},
        {"keep": True},
        {"strategy": "trim", "also": 1},
    ):
        assert_error(alpha.http.post(compact, json=body), 422, "InvalidRequest")
    nothing = {"strategy": "trim", "keep_turns": 5}
    assert_error(alpha.http.post(compact, json=nothing), 409, "Conflict")
    nowhere = f"/v1/sessions/{unknown_id()}/compact"
    assert_error(alpha.http.post(nowhere, json={}), 404, "SessionNotFound")
    # Another tenant's session is unknown to beta.
    assert_error(beta.http.post(compact, json={"strategy": "trim"}), 404, "SessionNotFound")
    assert_error(beta.http.get(listed), 404, "SessionNotFound")
    unknown = f"{listed}/{unknown_id()}"
    assert_error(alpha.http.delete(unknown), 404, "CompactionNotFound")
    assert_error(beta.http.delete(f"{listed}/{record['id']}"), 404, "SessionNotFound")
    assert snapshot(alpha) == before
    assert alpha.http.get(listed).json() == {"compactions": [record]}
    gated = gated_turn(alpha, sid)  # a turn unfinished: compacting waits for its end
    assert_error(alpha.http.post(compact, json={"strategy": "trim"}), 409, "Conflict")
    assert alpha.http.get(listed).json() == {"compactions": [record]}
    alpha.control.open_gate()
    alpha.result(gated["turn_id"])

    dropped = alpha.http.delete(f"{listed}/{record['id']}")
    assert dropped.status_code == 200, dropped.text
    assert dropped.json()["dropped"] and dropped.json()["dropped_at"]
    assert alpha.http.get(listed).json()["compactions"][0]["dropped"]


# ------------------------------------------------------------------------ events


def test_the_event_stream_sends_every_event_once_in_order_and_closes_after_end(
    alpha: Tenant,
) -> None:
    session = alpha.new_session(workspace="repo")
    (alpha.workspaces / "repo" / "retry.py").write_text("RETRY_ON = (502, 504)\n")
    turn = alpha.submit(session["id"], "what does the retry policy retry?")
    with alpha.stream(turn["turn_id"]) as stream:
        assert stream.response.status_code == 200
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        messages = list(stream.events())  # returns: the gateway closed the stream
    events = check_frames(messages)
    assert {e["turn_id"] for e in events} == {turn["turn_id"]}
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    kinds = [e["kind"] for e in events]
    assert kinds[:2] == ["queued", "started"] and kinds[-1] == "end"
    assert kinds.count("end") == 1
    assert {"tool_call", "tool_result", "step", "token"} <= set(kinds)
    result = next(e for e in events if e["kind"] == "tool_result")
    assert result["data"]["content"] == "RETRY_ON = (502, 504)\n"
    for step in (e for e in events if e["kind"] == "step"):
        tokens = [
            e for e in events if e["kind"] == "token" and e["data"]["step"] == step["data"]["index"]
        ]
        assert "".join(t["data"]["text"] for t in tokens) == step["data"]["text"]
    end = events[-1]["data"]
    assert end["outcome"] == "finished" and end["reply"] == "It retries 502 and 504."
    assert alpha.result(turn["turn_id"])["reply"] == end["reply"]


def test_a_reader_resumes_with_after_or_last_event_id_exactly_once(alpha: Tenant) -> None:
    session = alpha.new_session()
    turn = alpha.submit(session["id"], "stream an essay")
    turn_id = turn["turn_id"]
    seen: list[dict[str, Any]] = []
    with alpha.stream(turn_id) as stream:
        for message in stream.events():
            seen.append(message.json())
            if len(seen) == 5:
                break
    assert alpha.http.get(f"/v1/turns/{turn_id}").json()["status"] == "running"
    with alpha.stream(turn_id, headers={"Last-Event-ID": str(seen[-1]["seq"])}) as stream:
        for message in stream.events():
            seen.append(message.json())
            if len(seen) == 12:
                break
    assert alpha.http.get(f"/v1/turns/{turn_id}").json()["status"] == "running"
    seen += alpha.event_json(turn_id, after=seen[-1]["seq"])

    assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))  # no gap, no repeat
    assert seen[-1]["kind"] == "end"
    text = "".join(e["data"]["text"] for e in seen if e["kind"] == "token")
    assert text == STREAM_TEXT  # and every token of the one step, in order

    whole = alpha.event_json(turn_id)
    assert [e for e in whole if e["kind"] != "token"] == [e for e in seen if e["kind"] != "token"]
    for k in (0, 3, len(seen) - 1, len(seen)):
        later = [e for e in alpha.event_json(turn_id, after=k) if e["kind"] != "token"]
        assert later == [e for e in seen if e["seq"] > k and e["kind"] != "token"]
    by_header = alpha.events(turn_id, headers={"Last-Event-ID": str(len(seen) - 1)})
    assert [m.json() for m in by_header] == [seen[-1]]


def test_a_turn_read_again_after_its_end_gives_every_durable_event_with_its_seq(
    alpha: Tenant,
) -> None:
    session = alpha.new_session(workspace="repo")
    (alpha.workspaces / "repo" / "retry.py").write_text("RETRY_ON = (502, 504)\n")
    turn = alpha.submit(session["id"], "what does the retry policy retry?")
    live = alpha.event_json(turn["turn_id"])
    alpha.result(turn["turn_id"])
    durable = [e for e in live if e["kind"] != "token"]
    assert {"queued", "started", "tool_call", "tool_result", "step", "end"} <= {
        e["kind"] for e in durable
    }
    for _ in range(2):
        again = alpha.event_json(turn["turn_id"])
        assert [e for e in again if e["kind"] != "token"] == durable
        assert [e["seq"] for e in again] == sorted({e["seq"] for e in again})


def test_a_first_reader_from_a_later_seq_starts_there(alpha: Tenant) -> None:
    """No reader of this gateway has followed the turn before: it reads from ``after``."""
    session = alpha.new_session()
    turn = alpha.submit(session["id"], "hello")
    deadline = time.monotonic() + 30
    while alpha.http.get(f"/v1/turns/{turn['turn_id']}").json()["status"] not in TERMINAL:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    later = alpha.event_json(turn["turn_id"], after=2)
    assert later and later[0]["seq"] == 3, later
    assert [e["seq"] for e in later] == list(range(3, len(later) + 3))
    assert later[-1]["kind"] == "end"


@pytest.mark.postgres
def test_a_reader_reconnects_to_another_gateway_of_the_fleet(
    gateways: Gateways, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """(The fleet only: embedded gateways each run their own turns, and a second one
    sees another's tokens only from the store, after they commit.)"""
    first = gateways.get("fleet-postgres", request)
    env = deployment_env("fleet-postgres", request, "")
    second = start_gateway(
        env,
        tmp_path,
        tokens=first.tokens,
        extra={"PARLEY_WORKSPACES": str(first.workspaces)},
    )
    try:
        alpha = first.tenant()
        alpha.control.script([STREAM])
        also_alpha = second.tenant(alpha.name)
        session = alpha.new_session()
        turn_id = alpha.submit(session["id"], "stream an essay")["turn_id"]
        seen: list[dict[str, Any]] = []
        with alpha.stream(turn_id) as stream:
            for message in stream.events():
                seen.append(message.json())
                if len(seen) == 6:
                    break
        assert also_alpha.http.get(f"/v1/turns/{turn_id}").json()["status"] == "running"
        seen += [
            m.json()
            for m in also_alpha.events(turn_id, headers={"Last-Event-ID": str(seen[-1]["seq"])})
        ]
        assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
        assert seen[-1]["kind"] == "end"
        assert "".join(e["data"]["text"] for e in seen if e["kind"] == "token") == STREAM_TEXT
    finally:
        second.stop()


def test_a_queued_turns_stream_follows_it_from_queued_to_its_end(alpha: Tenant) -> None:
    session = alpha.new_session()
    gated = gated_turn(alpha, session["id"])
    queued = alpha.submit(session["id"], "wait your turn")
    with alpha.stream(queued["turn_id"]) as stream:
        events = stream.events()
        first = next(events).json()
        assert (first["seq"], first["kind"]) == (1, "queued")
        status = alpha.http.get(f"/v1/turns/{queued['turn_id']}").json()["status"]
        assert status == "queued"
        alpha.control.open_gate()
        rest = [m.json() for m in events]
    assert [e["seq"] for e in rest] == list(range(2, len(rest) + 2))
    assert rest[-1]["kind"] == "end" and rest[-1]["data"]["reply"] == "heard: wait your turn"
    assert alpha.result(gated["turn_id"])["status"] == "finished"


def test_an_idle_stream_gets_keep_alive_comments(alpha: Tenant) -> None:
    session = alpha.new_session()
    turn = alpha.submit(session["id"], "gated and quiet")
    comments: list[float] = []
    events: list[dict[str, Any]] = []
    entered = alpha.control.dir / "gate-entered"
    with alpha.stream(turn["turn_id"]) as stream:
        for message in stream.messages:
            if message.comment is not None:
                assert message.comment == "keep-alive"
                if entered.exists():
                    comments.append(time.monotonic())
                if len(comments) == 6:
                    alpha.control.open_gate()
            else:
                events.append(message.json())
    assert events[-1]["kind"] == "end"
    assert len(comments) >= 6
    gaps = [b - a for a, b in itertools.pairwise(comments[:6])]
    # At least every PARLEY_GATEWAY_KEEPALIVE seconds while nothing else is sent.
    assert statistics.median(gaps) <= KEEPALIVE_SECONDS * 1.5, gaps
    assert max(gaps) <= KEEPALIVE_SECONDS * 3, gaps


def test_a_stream_refuses_bad_positions(alpha: Tenant) -> None:
    session = alpha.new_session()
    turn = alpha.submit(session["id"], "hello")
    alpha.result(turn["turn_id"])
    events = f"/v1/turns/{turn['turn_id']}/events"
    for params in ({"after": "-1"}, {"after": "x"}, {"after": str(2**31)}):
        assert_error(alpha.http.get(events, params=params), 422, "InvalidRequest")
    for header in ("-1", "seven", "1.5"):
        response = alpha.http.get(events, headers={"Last-Event-ID": header})
        assert_error(response, 422, "InvalidRequest")
    # No seq is above 2**31-1: after a larger one there is nothing, as after that one.
    assert alpha.events(turn["turn_id"], headers={"Last-Event-ID": "9" * 20}) == []
    assert alpha.events(turn["turn_id"], after=2**31 - 1) == []


# ------------------------------------------------------------------------ result


def test_result_waits_for_the_end_and_answers_202_while_running(alpha: Tenant) -> None:
    session = alpha.new_session()
    turn = gated_turn(alpha, session["id"])
    result = f"/v1/turns/{turn['turn_id']}/result"
    running = alpha.http.get(result)
    assert running.status_code == 202, running.text
    assert set(running.json()) == DETAIL_FIELDS and running.json()["status"] == "running"
    started = time.monotonic()
    waited = alpha.http.get(result, params={"wait": 0.6})
    assert waited.status_code == 202 and time.monotonic() - started >= 0.6
    for wait in ("61", "-1", "soon"):
        assert_error(alpha.http.get(result, params={"wait": wait}), 422, "InvalidRequest")

    threading.Timer(0.5, alpha.control.open_gate).start()
    started = time.monotonic()
    done = alpha.http.get(result, params={"wait": 60})
    assert done.status_code == 200, done.text
    assert time.monotonic() - started < 30
    assert done.json()["status"] == "finished" and done.json()["reply"] == "ok: gated job"
    again = alpha.http.get(result)
    assert again.status_code == 200 and again.json() == done.json()


# ------------------------------------------------------------------------ steering


def test_say_reaches_the_model_at_the_next_step_and_after_the_end_is_turn_ended(
    alpha: Tenant,
) -> None:
    session = alpha.new_session()
    turn = gated_turn(alpha, session["id"], "gated: bring the docs up to date")
    said = alpha.http.post(f"/v1/turns/{turn['turn_id']}/say", json={"text": "only the docs"})
    assert said.status_code == 202, said.text
    assert said.json() == {"turn_id": turn["turn_id"], "accepted": "say"}
    alpha.control.open_gate()
    done = alpha.result(turn["turn_id"])
    assert done["reply"] == "ok: only the docs" and done["undelivered"] == []

    requests = requests_of(alpha, turn["turn_id"])
    assert len(requests) == 2
    assert alpha.control.user_texts(requests[0], "steer") == []
    assert alpha.control.user_texts(requests[1], "steer") == ["only the docs"]
    events = alpha.event_json(turn["turn_id"])
    steers = [e for e in events if e["kind"] == "steer"]
    assert len(steers) == 1 and steers[0]["data"]["text"] == "only the docs"

    before = snapshot(alpha)
    late = alpha.http.post(f"/v1/turns/{turn['turn_id']}/say", json={"text": "too late"})
    assert_error(late, 409, "TurnEnded")
    stop = alpha.http.post(f"/v1/turns/{turn['turn_id']}/interrupt")
    assert_error(stop, 409, "TurnEnded")
    for body in ({}, {"text": ""}, {"text": "x", "loud": True}, {"text": 3}):
        response = alpha.http.post(f"/v1/turns/{turn['turn_id']}/say", json=body)
        assert_error(response, 422, "InvalidRequest")
    assert snapshot(alpha) == before
    assert len(requests_of(alpha, turn["turn_id"])) == 2


def signals_of(gateway: Gateway, turn_id: str) -> list[tuple[str, Any, bool]]:
    """The signals kept or delivered for a turn: name, payload, delivered."""
    with (
        parley.connect(gateway.env["PARLEY_DATABASE_URL"]) as reader,
        reader.store.engine.connect() as db,
    ):
        rows = db.execute(
            select(tables.signals.c.name, tables.signals.c.payload, tables.signals.c.wait_id)
            .where(tables.signals.c.turn_id == turn_id)
            .order_by(tables.signals.c.sent_at)
        ).all()
    return [(row.name, row.payload, row.wait_id is not None) for row in rows]


def test_a_signal_is_kept_for_the_turn_and_refused_once_it_ended_or_is_not_the_tenants(
    gateway: Gateway, alpha: Tenant, beta: Tenant
) -> None:
    session = alpha.new_session()
    turn = gated_turn(alpha, session["id"])
    path = f"/v1/turns/{turn['turn_id']}/signals"
    # No call waits for it yet (docs/time.md#waiting-for-an-event): it is kept.
    sent = alpha.http.post(path, json={"name": "finance.approved", "payload": {"ok": True}})
    assert sent.status_code == 202, sent.text
    assert sent.json() == {
        "turn_id": turn["turn_id"],
        "name": "finance.approved",
        "delivered": False,
    }
    bare = alpha.http.post(path, json={"name": "ping"})  # a payload is optional: null
    assert bare.status_code == 202, bare.text
    # Bad names and payloads, another tenant's turn, an unknown one: refused, none kept.
    for body in (
        {},
        {"payload": 1},
        {"name": ""},
        {"name": "has space"},
        {"name": "x" * 129},
        {"name": 7},
        {"name": "ok", "extra": 1},
        {"name": "ok", "payload": nested(70)},
        {"name": "ok", "payload": "x" * 100_001},
    ):
        assert_error(alpha.http.post(path, json=body), 422, "InvalidRequest")
    assert_error(beta.http.post(path, json={"name": "ok"}), 404, "TurnNotFound")
    unknown = f"/v1/turns/{unknown_id()}/signals"
    assert_error(alpha.http.post(unknown, json={"name": "ok"}), 404, "TurnNotFound")
    assert signals_of(gateway, turn["turn_id"]) == [
        ("finance.approved", {"ok": True}, False),
        ("ping", None, False),
    ]
    alpha.control.open_gate()
    alpha.result(turn["turn_id"])
    before = snapshot(alpha)
    assert_error(alpha.http.post(path, json={"name": "late"}), 409, "TurnEnded")
    assert snapshot(alpha) == before
    assert len(signals_of(gateway, turn["turn_id"])) == 2


def test_interrupt_cancels_and_resume_continues_the_same_turn_and_run(alpha: Tenant) -> None:
    session = alpha.new_session()
    turn = gated_turn(alpha, session["id"], "gated long job")
    stopped = alpha.http.post(f"/v1/turns/{turn['turn_id']}/interrupt")
    assert stopped.status_code == 202, stopped.text
    assert stopped.json() == {"turn_id": turn["turn_id"], "accepted": "interrupt"}
    alpha.control.open_gate()
    cancelled = alpha.result(turn["turn_id"])
    assert cancelled["status"] == "cancelled" and cancelled["reply"] is None
    assert cancelled["steps"] == 1  # the step in flight committed whole
    seen = alpha.event_json(turn["turn_id"])
    assert seen[-1]["kind"] == "end" and seen[-1]["data"]["outcome"] == "cancelled"

    resumed = alpha.http.post(f"/v1/turns/{turn['turn_id']}/resume")
    assert resumed.status_code == 202, resumed.text
    assert set(resumed.json()) == TURN_FIELDS
    assert (resumed.json()["turn_id"], resumed.json()["run_id"]) == (
        turn["turn_id"],
        turn["run_id"],
    )
    later = alpha.event_json(turn["turn_id"], after=seen[-1]["seq"])
    assert later[0]["seq"] == seen[-1]["seq"] + 1 and later[0]["kind"] == "queued"
    assert [e["seq"] for e in later] == list(range(later[0]["seq"], later[-1]["seq"] + 1))
    assert later[-1]["kind"] == "end" and later[-1]["data"]["outcome"] == "finished"
    finished = alpha.result(turn["turn_id"])
    assert finished["status"] == "finished" and finished["reply"] == "ok: gated long job"
    assert finished["steps"] == 2 and alpha.control.gate_calls == 1
    assert [t["turn_id"] for t in tree_of(alpha, session["id"])] == [turn["turn_id"]]
    assert session_of(alpha, session["id"])["head_turn_id"] == turn["turn_id"]

    before = snapshot(alpha)
    assert_error(alpha.http.post(f"/v1/turns/{turn['turn_id']}/resume"), 409, "Conflict")
    assert_error(alpha.http.post(f"/v1/turns/{turn['turn_id']}/interrupt"), 409, "TurnEnded")
    assert snapshot(alpha) == before


def test_resuming_a_turn_that_a_later_turn_follows_is_409_and_changes_nothing(
    alpha: Tenant,
) -> None:
    session = alpha.new_session()
    turn = gated_turn(alpha, session["id"], "gated long job")
    later = alpha.submit(session["id"], "queued behind it")
    assert alpha.http.post(f"/v1/turns/{turn['turn_id']}/interrupt").status_code == 202
    alpha.control.open_gate()
    assert alpha.result(turn["turn_id"])["status"] == "cancelled"
    assert alpha.result(later["turn_id"])["reply"] == "heard: queued behind it"
    path = [turn["turn_id"], later["turn_id"]]
    assert [t["turn_id"] for t in history_of(alpha, session["id"])] == path

    before = snapshot(alpha)
    refused = assert_error(alpha.http.post(f"/v1/turns/{turn['turn_id']}/resume"), 409, "Conflict")
    assert "branch_from" in refused["error"]["message"]
    assert snapshot(alpha) == before
    assert [t["turn_id"] for t in history_of(alpha, session["id"])] == path


# ------------------------------------------------------------------------ operations


def test_health_readiness_and_the_openapi_document(gateway: Gateway, backend: str) -> None:
    anonymous = gateway.anonymous()
    health = anonymous.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    ready = anonymous.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["status"] == "ok" and ready.json()["checks"]["database"] == "ok"
    if backend.startswith("fleet"):
        assert ready.json()["checks"]["redis"] == "ok"

    document = anonymous.get("/openapi.json")
    assert document.status_code == 200
    spec = document.json()
    assert spec["openapi"].startswith("3.")
    for method, path in ROUTES:
        assert method in spec["paths"].get(path, {}), (method, path)
    schemas = spec["components"]["schemas"]
    event = schemas["Event"]
    kinds = {variant["properties"]["kind"]["const"] for variant in event["oneOf"]}
    assert kinds == {kind.value for kind in EventKind}
    for variant in event["oneOf"]:
        payload = variant["properties"]["data"]["$ref"].rsplit("/", 1)[1]
        assert schemas[payload]["type"] == "object", payload
    stream = spec["paths"]["/v1/turns/{turn_id}/events"]["get"]["responses"]["200"]["content"]
    # Each SSE event (before OpenAPI 3.2's itemSchema, the stream's schema is an event's).
    assert stream["text/event-stream"]["schema"] == {"$ref": "#/components/schemas/ServerSentEvent"}
    frame = schemas["ServerSentEvent"]["properties"]
    assert set(frame) == {"id", "event", "data"}
    assert frame["data"]["contentMediaType"] == "application/json"
    assert frame["data"]["contentSchema"] == {"$ref": "#/components/schemas/Event"}
    for item in spec["paths"].values():
        for operation in item.values():
            for parameter in operation.get("parameters", ()):
                assert "null" not in json.dumps(parameter["schema"]), parameter
    for name in ("Session", "Turn", "TurnDetails", "ErrorBody"):
        assert name in schemas, name
    body = spec["paths"]["/v1/sessions/{session_id}/turns"]["post"]["requestBody"]
    creates = body["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    priority = schemas[creates]["properties"]["priority"]
    assert priority["enum"] == ["interactive", "batch"], priority
    assert priority["default"] == "interactive" and "docs/admission.md" in priority["description"]
    assert "priority" not in schemas[creates].get("required", [])


@pytest.mark.postgres
def test_readiness_is_503_while_redis_does_not_answer(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """(The fleet only: an embedded gateway has no Redis.)  Nothing listens on port 9."""
    env = deployment_env("fleet-postgres", request, "")
    dead = start_gateway(
        env,
        tmp_path,
        tokens=make_tokens(["a"]),
        extra={"PARLEY_REDIS_URL": "redis://127.0.0.1:9/0"},
        ready=False,
    )
    try:
        anonymous = dead.anonymous()
        assert anonymous.get("/healthz").status_code == 200  # alive, not ready
        ready = anonymous.get("/readyz")
        assert ready.status_code == 503, ready.text
        assert ready.json() == {
            "status": "unavailable",
            "checks": {"database": "ok", "redis": "unavailable"},
        }
        assert "Traceback" not in ready.text and "127.0.0.1" not in ready.text
    finally:
        dead.stop()


# ------------------------------------------------------------------------ errors


def test_malformed_json_is_400_and_changes_nothing(gateway: Gateway, alpha: Tenant) -> None:
    session = alpha.new_session()
    turn = alpha.submit(session["id"], "hello")
    alpha.result(turn["turn_id"])
    before = snapshot(alpha)
    for path in (
        "/v1/sessions",
        f"/v1/sessions/{session['id']}/turns",
        f"/v1/sessions/{session['id']}/branch",
        f"/v1/turns/{turn['turn_id']}/say",
    ):
        for content in (
            b'{"prompt": ',
            b"{]",
            b"not json",
            b'{"prompt": "x"} trailing',
            b'{"prompt": "\xff\xfe"}',  # not UTF-8
        ):
            response = alpha.http.post(path, content=content, headers=JSON)
            assert_error(response, 400, "InvalidRequest")
        # Without a token the answer is 401, whatever the body.
        for content in (b"{]", b'"\xff"'):
            anonymous = gateway.anonymous().post(path, content=content, headers=JSON)
            assert_error(anonymous, 401, "Unauthorized")
    assert snapshot(alpha) == before


def nested(levels: int, leaf: Any = None) -> Any:
    """A JSON object ``levels`` deep (itself level 1)."""
    value: Any = {} if leaf is None else leaf
    for _ in range(levels - (leaf is None)):
        value = {"a": value}
    return value


def agui_run(thread_id: str, message_id: str, *extra: dict[str, Any]) -> dict[str, Any]:
    """A RunAgentInput whose newest message is a user message."""
    user = {"id": message_id, "role": "user", "content": "hello"}
    return {"threadId": thread_id, "runId": "r1", "messages": [*extra, user]}


def chat_request(chat_id: str, message_id: str, *extra: dict[str, Any]) -> dict[str, Any]:
    """An AI SDK chat request whose newest message is a user message."""
    user = {"id": message_id, "role": "user", "parts": [{"type": "text", "text": "hello"}]}
    return {"id": chat_id, "messages": [*extra, user], "trigger": "submit-message"}


def test_deeply_nested_json_is_refused_before_anything_is_written(
    gateway: Gateway, alpha: Tenant
) -> None:
    session = alpha.new_session(metadata=nested(64))  # MAX_JSON_DEPTH: kept as given
    assert session["metadata"] == nested(64)
    before = snapshot(alpha)
    # The red team's body: 256 levels of metadata in some 600 bytes; it used to be stored,
    # and to break the tenant's listing from then on.
    red_team = json.dumps({"metadata": nested(256)}, separators=(",", ":")).encode()
    refused = alpha.http.post("/v1/sessions", content=red_team, headers=JSON)
    assert "100 levels" in assert_error(refused, 422, "InvalidRequest")["error"]["message"]
    over = alpha.http.post("/v1/sessions", json={"metadata": nested(65)})
    assert "64 levels" in assert_error(over, 422, "InvalidRequest")["error"]["message"]
    context = alpha.http.post(
        f"/v1/sessions/{session['id']}/turns", json={"prompt": "hi", "context": nested(70)}
    )
    assert_error(context, 422, "InvalidRequest")
    deep_assistant = {"id": "a1", "role": "assistant", "content": nested(300)}
    agui = alpha.http.post("/v1/ag-ui", json=agui_run("deep", "u1", deep_assistant))
    assert_error(agui, 422, "InvalidRequest")
    deep_parts = {"id": "a1", "role": "assistant", "parts": [nested(300)]}
    chat = alpha.http.post("/v1/chat", json=chat_request("deep", "u1", deep_parts))
    assert_error(chat, 422, "InvalidRequest")
    # Deeper than json.loads can parse, and a string's brackets are not nesting.
    for content in (b"[" * 5000 + b"]" * 5000, b'{"metadata": {"a": "' + b"[" * 5000 + b'"}}'):
        response = alpha.http.post("/v1/sessions", content=content, headers=JSON)
        if content.startswith(b"["):
            assert_error(response, 422, "InvalidRequest")
        else:
            assert response.status_code == 201, response.text
            before = snapshot(alpha)
    anonymous = gateway.anonymous().post("/v1/sessions", content=red_team, headers=JSON)
    assert_error(anonymous, 401, "Unauthorized")
    assert snapshot(alpha) == before  # the listing answers, and nothing was written


def test_a_refused_protocol_request_opens_no_session_and_makes_no_workspace(
    alpha: Tenant,
) -> None:
    before = snapshot(alpha)

    def post(path: str, body: dict[str, Any]) -> httpx.Response:
        # json.dumps escapes a lone surrogate, which httpx's own encoder cannot send.
        return alpha.http.post(path, content=json.dumps(body).encode(), headers=JSON)

    nul = post("/v1/ag-ui", agui_run("t-nul", "m\u0000"))
    assert "message id" in assert_error(nul, 422, "InvalidRequest")["error"]["message"]
    nul = post("/v1/chat", chat_request("c-nul", "m\u0000"))
    assert "message id" in assert_error(nul, 422, "InvalidRequest")["error"]["message"]
    for thread_id, message_id in (("t\u0000", "m1"), ("\udfff", "m1"), ("t-lone", "\ud800")):
        agui = post("/v1/ag-ui", agui_run(thread_id, message_id))
        assert_error(agui, 422, "InvalidRequest")
        chat = post("/v1/chat", chat_request(thread_id, message_id))
        assert_error(chat, 422, "InvalidRequest")
    assert snapshot(alpha) == before


NO_SNIFF_NO_STORE = {"x-content-type-options": "nosniff", "cache-control": "no-store"}


def test_every_json_answer_is_nosniff_and_no_store(gateway: Gateway, alpha: Tenant) -> None:
    session = alpha.new_session()
    answers = [
        alpha.http.post("/v1/sessions", json={}),
        alpha.http.get("/v1/sessions"),
        alpha.http.get(f"/v1/sessions/{session['id']}"),
        alpha.http.get(f"/v1/sessions/{unknown_id()}"),  # 404
        alpha.http.get("/v1/no-such-route"),
        alpha.http.post("/v1/sessions", content=b"{]", headers=JSON),  # 400
        alpha.http.post("/v1/sessions", content=b"x", headers={"Content-Type": "text/plain"}),
        alpha.http.post(f"/v1/sessions/{session['id']}/turns", json={"prompt": 5}),  # 422
        alpha.http.post("/v1/responses", json={"input": "hi", "stream": "true"}),  # OpenAI's
        gateway.anonymous().get("/v1/sessions"),  # 401
        gateway.anonymous().get("/healthz"),
        gateway.anonymous().get("/openapi.json"),
    ]
    statuses = [a.status_code for a in answers]
    assert statuses == [201, 200, 200, 404, 404, 400, 415, 422, 400, 401, 200, 200], statuses
    for answer in answers:
        assert answer.headers["content-type"].startswith("application/json"), answer.headers
        assert {n: answer.headers.get(n) for n in NO_SNIFF_NO_STORE} == NO_SNIFF_NO_STORE, (
            answer.request.url,
            answer.headers,
        )
    assert "stream" in answers[8].json()["error"]["message"]
    page = gateway.anonymous().get("/")
    assert page.headers["cache-control"] == "no-cache"  # the page's own, revalidated


def test_a_refused_cors_preflight_is_in_the_error_form(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    env = deployment_env(backend, request, f"sqlite:///{tmp_path / 'parley.db'}")
    origin = "https://app.example"
    cors = start_gateway(
        env,
        tmp_path,
        tokens=make_tokens(["web"]),
        extra={"PARLEY_GATEWAY_CORS_ORIGINS": origin},
    )
    try:
        http = cors.anonymous()

        def preflight(
            from_origin: str, method: str = "POST", asks: str = "authorization, content-type"
        ) -> httpx.Response:
            return http.options(
                "/v1/sessions",
                headers={
                    "Origin": from_origin,
                    "Access-Control-Request-Method": method,
                    "Access-Control-Request-Headers": asks,
                },
            )

        allowed = preflight(origin)
        assert allowed.status_code == 200, allowed.text
        assert allowed.headers["access-control-allow-origin"] == origin
        # A page elsewhere may poll with its ETag (docs/http.md#8-polling-with-etags).
        assert preflight(origin, "GET", "authorization, if-none-match").status_code == 200
        # And submit a turn saying its stream follows (docs/http.md#4-routes).
        assert preflight(origin, "POST", "authorization, content-type, prefer").status_code == 200
        listed = cors.tenant("web").http.get("/v1/sessions", headers={"Origin": origin})
        assert "etag" in listed.headers["access-control-expose-headers"].lower()
        for refused, named in (
            (preflight("https://evil.example"), "origin"),
            (preflight(origin, "PUT"), "method"),  # (no route takes PUT)
        ):
            body = assert_error(refused, 400, "InvalidRequest")
            assert named in body["error"]["message"], body
            assert "PARLEY_GATEWAY_CORS_ORIGINS" in body["error"]["message"], body
            assert refused.headers["x-content-type-options"] == "nosniff"
    finally:
        cors.stop()


def test_every_v1_route_needs_a_known_bearer_token(gateway: Gateway, alpha: Tenant) -> None:
    session = alpha.new_session()
    turn = alpha.submit(session["id"], "hello")
    alpha.result(turn["turn_id"])
    sid, tid = session["id"], turn["turn_id"]
    calls: list[tuple[str, str, Any]] = [
        ("POST", "/v1/sessions", {}),
        ("GET", "/v1/sessions", None),
        ("GET", f"/v1/sessions/{sid}", None),
        ("POST", f"/v1/sessions/{sid}/turns", {"prompt": "sneaky"}),
        ("GET", f"/v1/sessions/{sid}/history", None),
        ("GET", f"/v1/sessions/{sid}/tree", None),
        ("POST", f"/v1/sessions/{sid}/branch", {"turn_id": tid}),
        ("POST", f"/v1/sessions/{sid}/compact", {"strategy": "trim", "keep_turns": 0}),
        ("GET", f"/v1/sessions/{sid}/compactions", None),
        ("DELETE", f"/v1/sessions/{sid}/compactions/{unknown_id()}", None),
        ("GET", f"/v1/turns/{tid}", None),
        ("GET", f"/v1/turns/{tid}/events", None),
        ("GET", f"/v1/turns/{tid}/result", None),
        ("POST", f"/v1/turns/{tid}/say", {"text": "hi"}),
        ("POST", f"/v1/turns/{tid}/interrupt", None),
        ("POST", f"/v1/turns/{tid}/resume", None),
        ("GET", f"/v1/sessions/{unknown_id()}", None),  # 401 before 404
        ("POST", f"/v1/sessions/{sid}/turns", {"prompt": ""}),  # 401 before 422
    ]
    refusals: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer tok-nobody-0000000000000000"},
        {"Authorization": f"Bearer {alpha.token}x"},
        {"Authorization": f"Bearer {alpha.token[:-1]}"},
        {"Authorization": "Bearer"},
        {"Authorization": f"Basic {alpha.token}"},
        {"Authorization": alpha.token},
    ]
    anonymous = gateway.anonymous()
    before = snapshot(alpha)
    for method, path, body in calls:
        for headers in refusals:
            response = anonymous.request(method, path, json=body, headers=headers)
            assert_error(response, 401, "Unauthorized")
            assert response.headers["www-authenticate"].startswith("Bearer"), response.headers
        # The page's ?token= is for the page: the API takes the token from the header.
        response = anonymous.request(method, path, json=body, params={"token": alpha.token})
        assert_error(response, 401, "Unauthorized")
    assert snapshot(alpha) == before
    lower = anonymous.get("/v1/sessions", headers={"Authorization": f"bearer {alpha.token}"})
    assert lower.status_code == 200  # the scheme is case-insensitive (RFC 7235)


def test_unknown_ids_and_routes_are_404_in_the_error_form(alpha: Tenant) -> None:
    session = alpha.new_session()
    turn = alpha.submit(session["id"], "hello")
    alpha.result(turn["turn_id"])
    before = snapshot(alpha)
    # NUL cannot be in PostgreSQL text: such an id is unknown, not a failed query.
    for missing in (unknown_id(), "x" * 40, "not-an-id", "a%00b", "%ED%A0%80"):
        for method, path, body in (
            ("GET", f"/v1/sessions/{missing}", None),
            ("POST", f"/v1/sessions/{missing}/turns", {"prompt": "hello"}),
            ("GET", f"/v1/sessions/{missing}/history", None),
            ("GET", f"/v1/sessions/{missing}/tree", None),
            ("POST", f"/v1/sessions/{missing}/branch", {"turn_id": turn["turn_id"]}),
        ):
            assert_error(alpha.http.request(method, path, json=body), 404, "SessionNotFound")
        for method, path, body in (
            ("GET", f"/v1/turns/{missing}", None),
            ("GET", f"/v1/turns/{missing}/events", None),
            ("GET", f"/v1/turns/{missing}/result", None),
            ("POST", f"/v1/turns/{missing}/say", {"text": "hello"}),
            ("POST", f"/v1/turns/{missing}/interrupt", None),
            ("POST", f"/v1/turns/{missing}/resume", None),
        ):
            assert_error(alpha.http.request(method, path, json=body), 404, "TurnNotFound")
    # The approvals route answers 422 for a call the turn does not have (its feature's
    # choice), and an id no call can have is refused the same way, not a failed query.
    for approval in ("nope", "a%00b", "%ED%A0%80"):
        answer = alpha.http.post(
            f"/v1/turns/{turn['turn_id']}/approvals/{approval}", json={"decision": "approve"}
        )
        assert_error(answer, 422, "InvalidRequest")
    for path in ("/v1/nothing", "/nothing", f"/v1/sessions/{session['id']}/nothing", "/v1"):
        assert_error(alpha.http.get(path), 404, "NotFound")
    wrong_method = alpha.http.delete(f"/v1/sessions/{session['id']}")
    assert_error(wrong_method, 405, "MethodNotAllowed")
    assert snapshot(alpha) == before


def test_invalid_workspaces_are_422_and_make_nothing(alpha: Tenant, tmp_path: Path) -> None:
    alpha.new_session(workspace="existing")
    outside = tmp_path / "outside"
    outside.mkdir()
    (alpha.workspaces / "escape").symlink_to(outside, target_is_directory=True)
    (alpha.workspaces / "afile").write_text("not a directory\n")
    before = snapshot(alpha)
    for name in (
        "..",
        ".",
        "a/b",
        "/abs",
        "/tmp",
        ".hidden",
        ".parley-test",
        "a" * 65,
        "",
        "a b",
        "ä",
        "a\\b",
        "-dash",
        "_under",
        "nul\x00",
        "../escape",
        "escape",  # a symbolic link out of the tenant's directory
        "afile",  # not a directory
    ):
        response = alpha.http.post("/v1/sessions", json={"workspace": name})
        assert_error(response, 422, "InvalidRequest")
    for body in (
        {"workspace": 5},
        {"metadata": [1, 2]},
        {"metadata": "text"},
        {"root": "/etc"},
        {"workspace": "fine", "extra": True},
        {"workspace": "too-big", "metadata": {"pad": "x" * 150_000}},
        {"metadata": {"pad": "x" * 150_000}},
        {"workspace": "nul-value", "metadata": {"a": "\x00"}},
        {"metadata": {"nul\x00key": 1}},
        {"metadata": {"deep": [{"a": ["\x00"]}]}},
    ):
        response = alpha.http.post("/v1/sessions", json=body)
        assert_error(response, 422, "InvalidRequest")
    for raw in (
        b'{"metadata": {"a": "\\ud800"}}',  # a lone surrogate: not UTF-8
        b'{"metadata": {"\\udfff": 1}}',
        b'{"metadata": {"a": NaN}}',  # Python's JSON reader takes it; JSON does not
        b'{"metadata": {"a": Infinity}}',
    ):
        response = alpha.http.post("/v1/sessions", content=raw, headers=JSON)
        assert_error(response, 422, "InvalidRequest")
    assert snapshot(alpha) == before
    assert list(outside.iterdir()) == []


def test_a_body_over_the_limit_is_413_and_changes_nothing(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    env = deployment_env(backend, request, f"sqlite:///{tmp_path / 'parley.db'}")
    tokens = make_tokens(["small"])
    small = start_gateway(
        env,
        tmp_path,
        tokens=tokens,
        tokens_in_file=False,
        extra={"PARLEY_GATEWAY_MAX_BODY": "2048"},
    )
    try:
        tenant = small.tenant("small")
        tenant.control.script([ECHO])
        fits = tenant.http.post("/v1/sessions", json={"metadata": {"pad": "x" * 1900}})
        assert fits.status_code == 201, fits.text
        session = fits.json()
        before = snapshot(tenant)
        over = tenant.http.post("/v1/sessions", json={"metadata": {"pad": "x" * 2100}})
        assert_error(over, 413, "PayloadTooLarge")
        prompt = tenant.http.post(
            f"/v1/sessions/{session['id']}/turns", json={"prompt": "y" * 3000}
        )
        assert_error(prompt, 413, "PayloadTooLarge")

        def chunks(size: int) -> Iterator[bytes]:
            body = json.dumps({"metadata": {"pad": "z" * size}}).encode()
            for start in range(0, len(body), 500):
                yield body[start : start + 500]

        chunked = tenant.http.post("/v1/sessions", content=chunks(5000), headers=JSON)
        assert chunked.request.headers.get("transfer-encoding") == "chunked"
        assert "content-length" not in chunked.request.headers
        assert_error(chunked, 413, "PayloadTooLarge")
        assert snapshot(tenant) == before
        fits_chunked = tenant.http.post("/v1/sessions", content=chunks(1000), headers=JSON)
        assert fits_chunked.status_code == 201, fits_chunked.text
        assert fits_chunked.json()["metadata"] == {"pad": "z" * 1000}
    finally:
        small.stop()


# ------------------------------------------------------------------------ tenants


def test_another_tenants_sessions_and_turns_are_unknown_on_every_route(
    gateway: Gateway, alpha: Tenant, beta: Tenant
) -> None:
    mine = alpha.new_session(workspace="shared")
    (alpha.workspaces / "shared" / "retry.py").write_text("ALPHA_SECRET = 1\n")
    ended = alpha.submit(mine["id"], "hello")
    alpha.result(ended["turn_id"])
    running = gated_turn(alpha, mine["id"])
    theirs = beta.new_session(workspace="shared")  # the same name: a directory of its own
    own_turn = beta.submit(theirs["id"], "hi")
    beta.result(own_turn["turn_id"])
    before = snapshot(alpha)

    def same_as_unknown(method: str, path: str, owned: str, body: Any = None) -> None:
        """Beta's answer about ``owned`` (alpha's id) is byte for byte what an unknown id
        gets, the id aside."""
        missing = unknown_id()
        as_json = None if body is None else json.loads(json.dumps(body).replace("{}", missing))
        expected = beta.http.request(method, path.replace("{}", missing), json=as_json)
        as_json = None if body is None else json.loads(json.dumps(body).replace("{}", owned))
        got = beta.http.request(method, path.replace("{}", owned), json=as_json)
        assert expected.status_code == 404, (path, expected.text)
        assert got.status_code == expected.status_code, (path, got.text)
        assert got.text == expected.text.replace(missing, owned), (path, got.text)
        assert got.headers["content-type"] == expected.headers["content-type"]

    same_as_unknown("GET", "/v1/sessions/{}", mine["id"])
    same_as_unknown("POST", "/v1/sessions/{}/turns", mine["id"], {"prompt": "hijack"})
    same_as_unknown("POST", "/v1/sessions/{}/turns", mine["id"], {"prompt": "x", "request_id": "r"})
    same_as_unknown("GET", "/v1/sessions/{}/history", mine["id"])
    same_as_unknown("GET", "/v1/sessions/{}/tree", mine["id"])
    same_as_unknown("POST", "/v1/sessions/{}/branch", mine["id"], {"turn_id": own_turn["turn_id"]})
    same_as_unknown(
        "POST", f"/v1/sessions/{theirs['id']}/branch", ended["turn_id"], {"turn_id": "{}"}
    )
    same_as_unknown("GET", "/v1/sessions?before={}", mine["id"])
    for turn in (ended, running):
        tid = turn["turn_id"]
        same_as_unknown("GET", "/v1/turns/{}", tid)
        same_as_unknown("GET", "/v1/turns/{}/events", tid)
        same_as_unknown("GET", "/v1/turns/{}/events?after=1", tid)
        same_as_unknown("GET", "/v1/turns/{}/result", tid)
        same_as_unknown("GET", "/v1/turns/{}/result?wait=0.2", tid)
        same_as_unknown("POST", "/v1/turns/{}/say", tid, {"text": "obey beta"})
        same_as_unknown("POST", "/v1/turns/{}/interrupt", tid)
        same_as_unknown("POST", "/v1/turns/{}/resume", tid)

    listed = beta.http.get("/v1/sessions", params={"limit": 200}).json()["sessions"]
    assert [s["id"] for s in listed] == [theirs["id"]]
    assert mine["id"] in {s["id"] for s in alpha.http.get("/v1/sessions").json()["sessions"]}
    assert not (beta.workspaces / "shared" / "retry.py").exists()
    assert snapshot(alpha) == before

    alpha.control.open_gate()
    done = alpha.result(running["turn_id"])  # beta's steer and interrupt never reached it
    assert done["status"] == "finished" and done["reply"] == "ok: gated job"
    assert not [e for e in alpha.event_json(running["turn_id"]) if e["kind"] == "steer"]
    assert [t["turn_id"] for t in tree_of(beta, theirs["id"])] == [own_turn["turn_id"]]


def test_tokens_never_reach_the_logs(gateway: Gateway, alpha: Tenant, beta: Tenant) -> None:
    assert "token" not in gateway.printed  # configured tokens are not printed
    anonymous = gateway.anonymous()
    assert anonymous.get("/", params={"token": alpha.token}).status_code == 200
    assert anonymous.get("/v1/sessions", params={"token": beta.token}).status_code == 401
    assert alpha.http.get("/v1/sessions", params={"token": alpha.token}).status_code == 200
    wrong = anonymous.get("/v1/sessions", headers={"Authorization": "Bearer tok-wrong-1234567890"})
    assert wrong.status_code == 401
    session = alpha.new_session()
    turn = alpha.submit(session["id"], "hello")
    alpha.events(turn["turn_id"], headers={"Authorization": f"Bearer {alpha.token}"})
    deadline = time.monotonic() + 10
    while "GET /v1/sessions 401" not in gateway.logs():  # the access log is written
        assert time.monotonic() < deadline, gateway.logs()
        time.sleep(0.1)
    logs = gateway.logs()
    for token in [*gateway.tokens.values(), "tok-wrong-1234567890"]:
        assert token not in logs
    assert "?token" not in logs and "token=" not in logs


# ------------------------------------------------------------------------ binding


def test_without_tokens_the_gateway_serves_loopback_only_with_a_printed_token(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """(One deployment: binding and the generated token come before any database.)"""
    env = deployment_env("embedded-sqlite", request, f"sqlite:///{tmp_path / 'parley.db'}")
    env = {**env, "PARLEY_WORKSPACES": str(tmp_path / "workspaces")}
    for bind in ("0.0.0.0:0", "[::]:0", "example.invalid:0"):
        refused = subprocess.run(
            [sys.executable, "-m", "parley", "gateway", "--bind", bind],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode != 0, (bind, refused.stdout)
        assert "refusing to bind" in refused.stderr and "PARLEY_GATEWAY_TOKENS" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert "open http" not in refused.stdout
    assert not (tmp_path / "workspaces").exists()  # a refused start keeps no token

    local = start_gateway(env, tmp_path / "local")
    try:
        url = urlsplit(local.printed)
        assert url.hostname == "127.0.0.1"
        (token,) = parse_qs(url.query)["token"]
        assert len(token) >= 16
        anonymous = local.anonymous()
        assert anonymous.get("/", params={"token": token}).status_code == 200
        assert_error(anonymous.get("/v1/sessions"), 401, "Unauthorized")
        authorized = {"Authorization": f"Bearer {token}"}
        created = anonymous.post("/v1/sessions", json={}, headers=authorized)
        assert created.status_code == 201, created.text
        assert (local.workspaces / "local" / created.json()["id"]).is_dir()
        listed = anonymous.get("/v1/sessions", headers=authorized).json()["sessions"]
        assert [s["id"] for s in listed] == [created.json()["id"]]
    finally:
        local.stop()


def printed_token(gateway: Gateway) -> str:
    """The token of the URL the gateway printed."""
    (token,) = parse_qs(urlsplit(gateway.printed).query)["token"]
    return token


def test_the_local_token_is_kept_across_restarts_and_renewed_on_request(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """(One deployment: the token comes before any database.)  A page holds the token it
    was opened with: a restart keeps it; ``--new-token`` replaces it, and the old one is
    refused from then on."""
    env = deployment_env("embedded-sqlite", request, f"sqlite:///{tmp_path / 'parley.db'}")
    kept = tmp_path / "data" / "workspaces" / ".local-token"

    first = start_gateway(env, tmp_path / "data")
    try:
        token = printed_token(first)
        # The URL is the last line printed, after the line saying where the token is.
        printed = first.stdout.read_text().splitlines()
        assert printed[-1] == f"parley gateway: open {first.printed}"
        assert str(kept) in printed[-2]
        session = first.anonymous().post(
            "/v1/sessions", json={}, headers={"Authorization": f"Bearer {token}"}
        )
        assert session.status_code == 201, session.text
    finally:
        first.stop()
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert kept.read_text().strip() == token

    again = start_gateway(env, tmp_path / "data")
    try:
        assert printed_token(again) == token
        page = again.anonymous()
        listed = page.get("/v1/sessions", headers={"Authorization": f"Bearer {token}"})
        assert [s["id"] for s in listed.json()["sessions"]] == [session.json()["id"]]
    finally:
        again.stop()

    renewed = start_gateway(env, tmp_path / "data", arguments=["--new-token"])
    try:
        new = printed_token(renewed)
        assert new != token and kept.read_text().strip() == new
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        page = renewed.anonymous()
        assert_error(
            page.get("/v1/sessions", headers={"Authorization": f"Bearer {token}"}),
            401,
            "Unauthorized",
        )
        assert (
            page.get("/v1/sessions", headers={"Authorization": f"Bearer {new}"}).status_code == 200
        )
    finally:
        renewed.stop()


def test_a_local_token_file_others_may_read_or_new_token_with_tokens_is_refused(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Bad input stops the start with one line and changes nothing: a token file that
    others may read is not served (someone else may hold its token), and ``--new-token``
    with configured tokens has no local token to renew."""
    env = deployment_env("embedded-sqlite", request, f"sqlite:///{tmp_path / 'parley.db'}")
    workspaces = tmp_path / "workspaces"
    kept = workspaces / ".local-token"
    workspaces.mkdir()
    kept.write_text("A" * 32 + "\n")
    kept.chmod(0o644)

    def start(*arguments: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "parley", "gateway", "--bind", "127.0.0.1:0", *arguments],
            env={**env, "PARLEY_WORKSPACES": str(workspaces), **extra},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    readable = start()
    assert readable.returncode == 2, readable.stdout + readable.stderr
    assert "may be read by other users" in readable.stderr and "--new-token" in readable.stderr
    assert len(readable.stderr.strip().splitlines()) == 1, readable.stderr
    assert "A" * 32 not in readable.stderr + readable.stdout
    assert kept.read_text() == "A" * 32 + "\n" and stat.S_IMODE(kept.stat().st_mode) == 0o644

    configured = start("--new-token", PARLEY_GATEWAY_TOKENS="tok-0123456789abcdef=acme")
    assert configured.returncode == 2, configured.stdout + configured.stderr
    assert "--new-token" in configured.stderr and "PARLEY_GATEWAY_TOKENS" in configured.stderr
    assert len(configured.stderr.strip().splitlines()) == 1, configured.stderr
    assert kept.read_text() == "A" * 32 + "\n"
