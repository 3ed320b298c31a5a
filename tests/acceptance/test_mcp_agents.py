"""The gateway's MCP server offers each declared agent as a tool (docs/protocols.md#4-mcp),
through a real embedded ``parley gateway`` whose host declares a ``researcher`` (which
may call a ``critic``), with the official ``mcp`` client: ``tools/list`` has ``ask`` and
``researcher``; a call of ``researcher`` is a turn that runs as that agent (offered the
researcher's own agents, not the host's), continued by its ``session_id``; a call with
an idempotency key sent twice makes one task.  The A2A Agent Card lists the same agents
as skills."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as mt
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import parley
from tests.support.chaos import chaos_fleet
from tests.support.fleet import REPO
from tests.support.gateway import (
    TENANT,
    Gateway,
    Tenant,
    make_tokens,
    start_fleet_gateway,
    start_gateway,
    wait_ready,
)
from tests.support.hosts import agents_host

RULES: list[dict[str, Any]] = [
    {
        "when": "^delegate",
        "steps": [
            {"tool_calls": [{"name": "researcher", "arguments": {"task": "dig"}}]},
            {"text": "delegated"},
        ],
    },
    {"when": "^slow", "steps": [{"text": "z" * 200, "chunk_chars": 2, "delay_ms": 50}]},
    {"when": ".*", "steps": [{"text": "heard: {last_message}"}]},
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("mcp-agents")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")},
        "PARLEY_DATABASE_URL": f"sqlite:///{directory / 'parley.db'}",
        "PARLEY_HOST": "tests.support.hosts:agents_host",
        "PYTHONPATH": str(REPO),
    }
    started = start_gateway(env, directory, tokens=make_tokens([f"t{n}" for n in range(8)]))
    yield started
    started.stop()


@pytest.fixture
def tenant(gateway: Gateway) -> Tenant:
    fresh = gateway.tenant()
    fresh.control.script(RULES)
    return fresh


@asynccontextmanager
async def connected(url: str, token: str) -> AsyncIterator[ClientSession]:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60, read=120)
    )
    async with (
        http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def text_of(result: mt.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, mt.TextContent))


def test_each_declared_agent_is_a_tool_whose_turns_run_as_that_agent(
    gateway: Gateway, tenant: Tenant
) -> None:
    async def scenario() -> dict[str, Any]:
        async with connected(gateway.url, tenant.token) as session:
            listed = await session.list_tools()
            by_name = {tool.name: tool for tool in listed.tools}
            assert list(by_name) == ["ask", "researcher"]
            researcher = by_name["researcher"]
            assert researcher.description == "Looks one topic up and reports what it found."
            assert researcher.execution is not None
            assert researcher.execution.task_support == "optional"
            assert researcher.input_schema == by_name["ask"].input_schema
            result = await session.call_tool("researcher", {"task": "find the moon"})
            assert not result.is_error and text_of(result) == "heard: find the moon"
            assert result.structured_content is not None
            ids = result.structured_content
            again = await session.call_tool(
                "researcher", {"task": "and the sun", "session_id": ids["session_id"]}
            )
            assert again.structured_content is not None
            assert again.structured_content["session_id"] == ids["session_id"]
            # A session of one agent is not continued as another's.
            with pytest.raises(MCPError) as refused:
                await session.call_tool("ask", {"task": "hello", "session_id": ids["session_id"]})
            assert refused.value.error.code == -32602
            assert "researcher" in refused.value.error.message
            with pytest.raises(MCPError) as unknown:
                await session.call_tool("critic", {"task": "x"})  # not the host's own
            assert unknown.value.error.code == -32602
            return dict(ids)

    ids = asyncio.run(asyncio.wait_for(scenario(), 120))
    # The researcher's turns were offered its own agent (critic), not the host's.
    offered = [r["tools"] for r in tenant.control.requests() if r["turn_id"] == ids["turn_id"]]
    assert offered and "critic" in offered[0] and "researcher" not in offered[0]
    assert agent_of(gateway, ids["session_id"]) == "researcher"


def agent_of(gateway: Gateway, session_id: str) -> str | None:
    """The stored session's agent (read from the gateway's database)."""
    with parley.connect(gateway.env["PARLEY_DATABASE_URL"]) as reader:
        return reader.session(session_id).agent


def test_a_sub_agents_session_is_not_continued_through_its_tool(
    gateway: Gateway, tenant: Tenant
) -> None:
    """A child session (an agent call's) is its parent turn's to run: continuing it
    through the agent's tool is refused, and nothing is added to it."""

    async def scenario() -> str:
        async with connected(gateway.url, tenant.token) as session:
            result = await session.call_tool("ask", {"task": "delegate it"})
            assert text_of(result) == "delegated"
            assert result.structured_content is not None
            turn = tenant.http.get(f"/v1/turns/{result.structured_content['turn_id']}").json()
            [child] = turn["children"]
            with pytest.raises(MCPError) as refused:
                await session.call_tool(
                    "researcher", {"task": "more", "session_id": child["session_id"]}
                )
            assert refused.value.error.code == -32602
            assert "sub-agent" in refused.value.error.message
            return str(child["session_id"])

    child_session = asyncio.run(asyncio.wait_for(scenario(), 120))
    history = tenant.http.get(f"/v1/sessions/{child_session}/history").json()
    assert [t["prompt"] for t in history["turns"]] == ["dig"]


def post(gateway: Gateway, tenant: Tenant, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(
        f"{gateway.url}/mcp",
        json=body,
        headers={**tenant.http.headers, "Accept": "application/json, text/event-stream"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_a_call_sent_again_with_its_request_key_answers_the_task_it_made(
    gateway: Gateway, tenant: Tenant
) -> None:
    """The idempotency a remote parley agent relies on: the same ``tools/call`` (same
    ``_meta["parley/request-key"]``) sent twice, as after a crash between sending and
    storing, is one turn; another key is another."""

    def call(key: str, caller: Tenant = tenant) -> dict[str, Any]:
        params = {
            "name": "researcher",
            "arguments": {"task": "slow research"},
            "task": {"ttl": 60_000},
            "_meta": {"parley/request-key": key},
        }
        body = post(
            gateway, caller, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        )
        assert "result" in body, body
        return dict(body["result"]["task"])

    first, again, other = call("child-1"), call("child-1"), call("child-2")
    assert first["taskId"] == again["taskId"] != other["taskId"]
    stranger = gateway.tenant()
    stranger.control.script(RULES)
    assert call("child-1", stranger)["taskId"] not in (first["taskId"], other["taskId"])
    sessions = tenant.http.get("/v1/sessions").json()["sessions"]
    assert len(sessions) == 2
    assert {agent_of(gateway, s["id"]) for s in sessions} == {"researcher"}
    bad = post(
        gateway,
        tenant,
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "ask",
                "arguments": {"task": "x"},
                "_meta": {"parley/request-key": 7},
            },
        },
    )
    assert bad["error"]["code"] == -32602
    assert len(tenant.http.get("/v1/sessions").json()["sessions"]) == 2  # nothing made


def test_a_request_key_sent_again_with_another_task_is_refused_and_changes_nothing(
    gateway: Gateway, tenant: Tenant
) -> None:
    """A key names one call: sent again with another task (a careless client reusing
    it) it is refused, rather than starting a second turn in the first call's
    conversation, with or without that conversation's ``session_id``."""

    def call(task: str, **arguments: Any) -> dict[str, Any]:
        params = {
            "name": "researcher",
            "arguments": {"task": task, **arguments},
            "task": {"ttl": 60_000},
            "_meta": {"parley/request-key": "reused-key"},
        }
        return post(
            gateway, tenant, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        )

    first = call("the moon")["result"]["task"]["taskId"]
    session_id = tenant.http.get(f"/v1/turns/{first}").json()["session_id"]
    for refused in (call("the sun"), call("the sun", session_id=session_id)):
        assert refused["error"]["code"] == -32602, refused
        assert "reused-key" in refused["error"]["message"]
    assert call("the moon")["result"]["task"]["taskId"] == first  # the same call still is
    tenant.result(first)
    history = tenant.http.get(f"/v1/sessions/{session_id}/history").json()
    assert [t["prompt"] for t in history["turns"]] == ["the moon"]
    assert len(tenant.http.get("/v1/sessions").json()["sessions"]) == 1


def test_a_call_whose_task_is_no_object_is_refused_and_starts_nothing(
    gateway: Gateway, tenant: Tenant
) -> None:
    """``params.task`` is the task's metadata, an object: anything else is refused
    before a turn is queued, rather than read as asking for a task."""
    for task in (5, "yes", [1], True):
        params = {"name": "ask", "arguments": {"task": "hello"}, "task": task}
        body = post(
            gateway, tenant, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        )
        assert body["error"]["code"] == -32602, body
        assert "task" in body["error"]["message"]
    assert tenant.http.get("/v1/sessions").json()["sessions"] == []


def test_a_session_of_an_agent_the_host_does_not_declare_is_refused(tmp_path: Path) -> None:
    """``open_session(agent=...)`` (what the MCP tools open) checks the name against the
    host's agents before anything is stored."""

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with parley.connect(url, host=agents_host(), migrate_schema=True) as client:
        with pytest.raises(parley.errors.InvalidRequest, match="no agent 'oracle'"):
            client.open_session(tmp_path, agent="oracle", tenant="t")
        with pytest.raises(parley.errors.InvalidRequest, match="agent must be"):
            client.open_session(tmp_path, agent="", tenant="t")
        assert client.session_records(tenant="t", limit=10) == []
        nested = client.open_session(tmp_path, agent="researcher/critic")
        assert client.session(nested.id).agent == "researcher/critic"


def test_the_agent_card_lists_the_declared_agents_as_skills(gateway: Gateway) -> None:
    card = httpx.get(f"{gateway.url}/.well-known/agent-card.json", timeout=30).json()
    skills = {skill["id"]: skill for skill in card["skills"]}
    assert list(skills) == ["ask", "researcher"]
    assert skills["researcher"]["description"].startswith(
        "Looks one topic up and reports what it found."
    )


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_fleets_gateway_offers_the_agents_of_the_host_its_environment_names(
    workspace: Path, tmp_path: Path
) -> None:
    """On a fleet the workers hold the host; a gateway whose environment names it too
    (``PARLEY_HOST``) offers its agents, and a call of one runs as that agent on a
    worker."""
    host = "tests.support.hosts:agents_host"
    with chaos_fleet(workspace, pool="prefork", host=host, workers=1) as chaos:
        fleet_gateway = start_fleet_gateway(chaos.fleet, tmp_path / "ws", PARLEY_HOST=host)
        wait_ready(fleet_gateway)
        alpha = fleet_gateway.tenant(TENANT)
        alpha.control.script(RULES)

        async def scenario() -> dict[str, Any]:
            async with connected(fleet_gateway.url, alpha.token) as session:
                listed = await session.list_tools()
                assert [tool.name for tool in listed.tools] == ["ask", "researcher"]
                result = await session.call_tool("researcher", {"task": "on the fleet"})
                assert not result.is_error and text_of(result) == "heard: on the fleet"
                assert result.structured_content is not None
                return dict(result.structured_content)

        ids = asyncio.run(asyncio.wait_for(scenario(), 120))
        assert chaos.client.session(ids["session_id"]).agent == "researcher"
        offered = [r["tools"] for r in alpha.control.requests() if r["turn_id"] == ids["turn_id"]]
        assert offered and "critic" in offered[0] and "researcher" not in offered[0]
