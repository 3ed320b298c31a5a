"""Sub-agents over HTTP (docs/sub-agents.md#one-stream-for-the-tree), on every back end:
``GET /v1/turns/{id}/events?children=1`` is the turn's tree as Server-Sent Events, each
event's ``path`` in its data and its cursor as its ``id``; a reader that reconnects with
``Last-Event-ID`` gets the rest exactly once, also after the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parley.schemas.events import EventKind
from tests.acceptance.conftest import host_fleet
from tests.acceptance.test_gateway import assert_error
from tests.acceptance.test_sub_agents import ECHO, RULES, call
from tests.support.deployments import ALL, on_deployments
from tests.support.fleet import Fleet
from tests.support.gateway import Tenant, deployment_env, make_tokens, start_gateway
from tests.support.sse import SseMessage, sse_messages
from tests.support.waiting import wait_until

pytestmark = on_deployments(*ALL)

AGENTS_HOST = "tests.support.hosts:agents_host"
agents_fleet = host_fleet(AGENTS_HOST)


@pytest.fixture
def alpha(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tenant]:
    """A tenant of a gateway whose turns run on the agents host (in the gateway, or on
    the fleet of workers that hold it)."""
    if backend.startswith("fleet"):
        pool: Fleet = request.getfixturevalue("agents_fleet")
        env = pool.env()
        env.pop("PARLEY_HOST")
    else:
        env = deployment_env(backend, request, f"sqlite:///{tmp_path / 'parley.db'}")
        env["PARLEY_HOST"] = AGENTS_HOST
    gateway = start_gateway(env, tmp_path / "gateway", tokens=make_tokens(["alpha"]))
    try:
        yield gateway.tenant("alpha")
    finally:
        gateway.stop()


def tree_events(
    alpha: Tenant, turn_id: str, last_id: str | None = None, stop_after: int | None = None
) -> list[SseMessage]:
    """The tree's events from ``last_id`` (as ``Last-Event-ID``), until the stream ends
    or ``stop_after`` came (then the reader hangs up)."""
    headers = {} if last_id is None else {"Last-Event-ID": last_id}
    seen: list[SseMessage] = []
    with alpha.http.stream(
        "GET", f"/v1/turns/{turn_id}/events", params={"children": 1}, headers=headers
    ) as response:
        assert response.status_code == 200, response.read()
        for message in sse_messages(response.iter_lines()):
            if message.comment is not None:
                continue
            seen.append(message)
            if len(seen) == stop_after:
                break
    return seen


def key(message: SseMessage) -> tuple[str, int]:
    data = message.json()
    return str(data["turn_id"]), int(data["seq"])


def stored(message: SseMessage) -> bool:
    return EventKind(message.json()["kind"]).durable


def test_the_tree_over_sse_resumes_with_last_event_id_exactly_once(alpha: Tenant) -> None:
    alpha.control.script(RULES)
    session = alpha.new_session()
    turn_id = alpha.submit(session["id"], "fan out over the tree")["turn_id"]
    first = tree_events(alpha, turn_id, stop_after=8)  # a reader goes away half-way
    assert len(first) == 8
    rest = tree_events(alpha, turn_id, last_id=first[-1].id)
    seen = first + rest
    keys = [key(m) for m in seen]
    assert len(keys) == len(set(keys))  # each event once
    result = alpha.result(turn_id, wait=60)
    assert result["status"] == "finished", result
    children = {c["turn_id"]: c for c in result["children"]}
    assert {t for t, _ in keys} == {turn_id, *children}
    for message in seen:
        data: dict[str, Any] = message.json()
        assert message.event == data["kind"] and message.id
        if data["turn_id"] == turn_id:
            assert data["path"] == []
        else:
            child = children[data["turn_id"]]
            where = {
                "agent": "researcher",
                "call_id": child["call_id"],
                "turn_id": child["turn_id"],
            }
            assert data["path"] == [where]
    for turn in {turn_id, *children}:
        # Every durable event of every turn, in its own seq order, as the plain stream has it.
        durable = [key(m)[1] for m in seen if key(m)[0] == turn and stored(m)]
        assert durable == [key(m)[1] for m in alpha.events(turn) if stored(m)]
    # Every turn's end came (the turns' last events interleave as they come: a child's
    # end may reach the stream after its parent's, whose step waited for it).
    ends = [key(m)[0] for m in seen if m.event == "end"]
    assert sorted(ends) == sorted({turn_id, *children})
    # From the last id, after the end: nothing more, and the stream closes.
    assert tree_events(alpha, turn_id, last_id=seen[-1].id) == []
    # From the start again, after the end: the stored events, each once.
    again = [key(m) for m in tree_events(alpha, turn_id)]
    assert len(again) == len(set(again)) and set(again) <= set(keys)


def test_a_tree_stream_refuses_what_is_not_its_cursor(alpha: Tenant) -> None:
    alpha.control.script(RULES)
    session = alpha.new_session()
    turn_id = alpha.submit(session["id"], "hello")["turn_id"]
    alpha.result(turn_id)
    events = f"/v1/turns/{turn_id}/events"
    tree = {"children": 1}
    for header in ("notacursor", "12", "a b"):
        response = alpha.http.get(events, params=tree, headers={"Last-Event-ID": header})
        assert_error(response, 422, "InvalidRequest")
    assert_error(alpha.http.get(events, params={**tree, "after": 2}), 422, "InvalidRequest")
    # A cursor is no seq: a plain stream refuses it as before.
    [last] = tree_events(alpha, turn_id)[-1:]
    response = alpha.http.get(events, headers={"Last-Event-ID": str(last.id)})
    assert_error(response, 422, "InvalidRequest")
    other = alpha.submit(session["id"], "hello again")["turn_id"]
    alpha.result(other)
    response = alpha.http.get(
        f"/v1/turns/{other}/events", params=tree, headers={"Last-Event-ID": str(last.id)}
    )
    assert_error(response, 422, "InvalidRequest")  # another turn's cursor


def test_a_turns_approvals_and_usage_over_http_cover_its_descendants(alpha: Tenant) -> None:
    asking = {
        "when": "^asks",
        "steps": [
            {"tool_calls": [{"name": "record_call", "arguments": {"note": "child"}}]},
            {"text": "recorded {prompt}"},
        ],
    }
    both = {
        "when": "^delegate",
        "steps": [
            {"tool_calls": [call("researcher", "asks one"), call("researcher", "asks two")]},
            {"text": "delegated"},
        ],
    }
    alpha.control.script([both, asking, ECHO])
    alpha.control.policy(ask_tools=["record_call"])
    session = alpha.new_session()
    turn_id = alpha.submit(session["id"], "delegate both asks")["turn_id"]

    def pending() -> list[dict[str, Any]]:
        response = alpha.http.get(f"/v1/turns/{turn_id}")
        assert response.status_code == 200, response.text
        listed: list[dict[str, Any]] = response.json()["pending_approvals"]
        return listed

    wait_until(lambda: len(pending()) == 2, 60, what="both children's calls to ask")
    children = {c["call_id"]: c for c in alpha.http.get(f"/v1/turns/{turn_id}").json()["children"]}
    listed = pending()
    assert [a["path"] for a in listed] == [
        [{"agent": "researcher", "call_id": a_call, "turn_id": children[a_call]["turn_id"]}]
        for a_call in ("call_0_0", "call_0_1")
    ]
    assert [a["turn_id"] for a in listed] == [children[c]["turn_id"] for c in children]
    # The child's own listing has it, with an empty path (its own).
    own = alpha.http.get(f"/v1/turns/{listed[1]['turn_id']}").json()["pending_approvals"]
    assert [(a["approval_id"], a["path"]) for a in own] == [(listed[1]["approval_id"], [])]
    # One answered through the parent's route, the other through the child's.
    first = alpha.http.post(
        f"/v1/turns/{turn_id}/approvals/{listed[0]['approval_id']}", json={"decision": "approve"}
    )
    assert first.status_code == 200, first.text
    assert first.json()["decision"] == "approved"
    second = alpha.http.post(
        f"/v1/turns/{listed[1]['turn_id']}/approvals/{listed[1]['approval_id']}",
        json={"decision": "approve"},
    )
    assert second.status_code == 200, second.text
    again = alpha.http.post(
        f"/v1/turns/{turn_id}/approvals/{listed[0]['approval_id']}", json={"decision": "deny"}
    )
    assert again.status_code == 409, again.text
    result = alpha.result(turn_id, wait=60)
    assert result["status"] == "finished", result
    assert alpha.control.recorded_notes() == ["child", "child"]  # each call ran once
    details = alpha.http.get(f"/v1/turns/{turn_id}").json()
    assert details["pending_approvals"] == []
    usage = details["usage"]
    descendants = 0
    for child in details["children"]:
        seen = alpha.http.get(f"/v1/turns/{child['turn_id']}").json()["usage"]
        assert set(seen) == {"input_tokens", "output_tokens"}  # no children: its own only
        descendants += seen["input_tokens"] + seen["output_tokens"]
    assert descendants > 0
    assert usage["total"] == usage["input_tokens"] + usage["output_tokens"] + descendants
