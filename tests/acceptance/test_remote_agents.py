"""Remote agents (docs/sub-agents.md#8-remote-agents) with real processes: a parley agent on
a fleet of its own whose remote sub-agent (over A2A, and over MCP) is served by a second
parley gateway on loopback (embedded, on its own database).  The parent's worker is
SIGKILLed while the remote task runs; a new worker takes the child's run over and sends
the task again, which the remote side recognises (A2A: the message id is the stored child
turn's; MCP: the call's idempotency key is): the remote side received the task once, and
the parent ends once with its answer.  A cancel of the parent cancels the remote task."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as mt
import pytest
from a2a.client.client import ClientConfig
from a2a.client.client_factory import ClientFactory
from a2a.types import a2a_pb2 as pb
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

import parley
from parley.schemas.events import EventKind
from parley.schemas.records import TurnStatus, Waiting
from tests.support.chaos import Chaos, chaos_fleet
from tests.support.gateway import Gateway, Tenant, make_tokens, start_gateway
from tests.support.helpers import Control
from tests.support.hosts import workspace_host
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

HOST = "tests.support.hosts:remote_agents_host"
REMOTE_RULES: list[dict[str, Any]] = [
    {
        "when": "^what is the answer",
        "steps": [
            {
                "tool_calls": [
                    {"name": "record_call", "arguments": {"note": "received"}},
                    {"name": "wait_for_gate", "arguments": {}},
                ]
            },
            {"text": "forty-two"},
        ],
    }
]
PARENT_RULES: list[dict[str, Any]] = [
    {"when": "^meanwhile", "steps": [{"text": "done meanwhile"}]},
    {
        "when": "^ask the oracle",
        "steps": [
            {"tool_calls": [{"name": "oracle", "arguments": {"task": "what is the answer?"}}]},
            {"text": "the oracle said so"},
        ],
    },
]


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[tuple[Gateway, Tenant]]:
    """The remote service: a second parley gateway, embedded on a SQLite database."""
    env = {
        "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'remote.db'}",
        "PARLEY_HOST": "tests.support.hosts:workspace_host",
    }
    gateway = start_gateway(
        {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        tmp_path / "remote",
        tokens=make_tokens(["far"]),
    )
    try:
        tenant = gateway.tenant("far")
        tenant.control.script(REMOTE_RULES)
        yield gateway, tenant
    finally:
        gateway.stop()


@pytest.fixture(params=["a2a", "mcp"])
def protocol(request: pytest.FixtureRequest) -> str:
    """The protocol the parent reaches its remote agent over."""
    return str(request.param)


@pytest.fixture
def parent(
    workspace: Path,
    remote: tuple[Gateway, Tenant],
    protocol: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Chaos]:
    """The parent's fleet (one worker), whose host declares the remote ``oracle``."""
    gateway, tenant = remote
    monkeypatch.setenv("PARLEY_TEST_REMOTE_PROTOCOL", protocol)
    monkeypatch.setenv("PARLEY_TEST_REMOTE_URL", gateway.url)
    monkeypatch.setenv("PARLEY_TEST_REMOTE_TOKEN", tenant.token)
    with chaos_fleet(workspace, pool="prefork", host=HOST, workers=1) as chaos:
        chaos.control.script(PARENT_RULES)
        yield chaos


def remote_states(gateway: Gateway, token: str, protocol: str) -> list[str]:
    """The state of every task of the remote tenant (a fresh one), through the official
    client of ``protocol``: A2A's names (``TASK_STATE_COMPLETED``), MCP's (``completed``)."""
    if protocol == "a2a":
        return [pb.TaskState.Name(t.status.state) for t in remote_tasks(gateway, token)]
    return [task.status for task in mcp_tasks(gateway, token)]


def mcp_tasks(gateway: Gateway, token: str) -> list[mt.Task]:
    """Every task of the remote tenant, through ``mcp``'s ``ClientSession``."""

    async def listed() -> list[mt.Task]:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        async with (
            http,
            streamable_http_client(f"{gateway.url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            answer = await session.send_request(mt.ListTasksRequest(), mt.ListTasksResult)
            return list(answer.tasks)

    return asyncio.run(listed())


def remote_tasks(gateway: Gateway, token: str) -> list[pb.Task]:
    """Every task of the remote tenant (a fresh one), through ``a2a-sdk``'s client."""

    async def listed() -> list[pb.Task]:
        http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        client = await ClientFactory(ClientConfig(httpx_client=http)).create_from_url(gateway.url)
        try:
            answer = await client.list_tasks(pb.ListTasksRequest(include_artifacts=True))
            return list(answer.tasks)
        finally:
            await client.close()
            await http.aclose()

    return asyncio.run(listed())


@pytest.mark.timeout(240)
def test_a_killed_parent_worker_neither_resends_the_task_nor_loses_its_answer(
    parent: Chaos, remote: tuple[Gateway, Tenant], protocol: str
) -> None:
    gateway, tenant = remote
    handle = parent.client.open_session(parent.workspace).submit("ask the oracle")
    wait_until(lambda: tenant.control.gate_calls == 1, 90, what="the remote task at its gate")
    record = handle.record()
    assert record.status is TurnStatus.WAITING and record.waiting_for is Waiting.AGENTS
    parent.kill_workers()  # while the remote task runs
    parent.start_worker()
    tenant.control.open_gate()
    result = handle.wait(180)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert result.reply == "the oracle said so"
    [child] = parent.client.store.children_of_step(result.run_id, 0).values()
    assert child.status is TurnStatus.FINISHED and child.reply == "forty-two"
    # The child was driven twice (the takeover sent its task again) ...
    starts = [
        e for e in parent.client.store.events_after(child.turn_id, 0) if e.kind is EventKind.STARTED
    ]
    assert [e.data["attempt"] for e in starts] == [1, 2]
    # ... and the remote side received the task once: one task, one run of its tool.
    states = remote_states(gateway, tenant.token, protocol)
    assert states in (["TASK_STATE_COMPLETED"], ["completed"])
    assert tenant.control.recorded_notes() == ["received"]
    ends = [
        e for e in parent.client.store.events_after(result.turn_id, 0) if e.kind is EventKind.END
    ]
    assert len(ends) == 1  # the parent ended once


@pytest.mark.timeout(240)
def test_the_child_holds_no_worker_slot_while_the_remote_task_runs(
    parent: Chaos, remote: tuple[Gateway, Tenant], protocol: str
) -> None:
    """The parent's fleet has one worker slot.  While the remote task waits at its gate,
    the child looks at it now and then and lets go of the slot between looks (its run
    deferred: a ``throttled`` event, reason ``pending``), so another session's turn runs
    and ends on that slot meanwhile; then the gate opens and the parent ends."""
    gateway, tenant = remote
    handle = parent.client.open_session(parent.workspace).submit("ask the oracle")
    wait_until(lambda: tenant.control.gate_calls == 1, 90, what="the remote task at its gate")
    other = parent.client.open_session(parent.workspace).submit("meanwhile")
    done = other.wait(60)
    assert done.outcome is TurnStatus.FINISHED and done.reply == "done meanwhile"
    assert remote_states(gateway, tenant.token, protocol) in (["TASK_STATE_WORKING"], ["working"])
    tenant.control.open_gate()
    result = handle.wait(120)
    assert result.outcome is TurnStatus.FINISHED, result.error
    [child] = parent.client.store.children_of_step(result.run_id, 0).values()
    events = parent.client.store.events_after(child.turn_id, 0)
    pending = [e for e in events if e.kind is EventKind.THROTTLED]
    assert pending and all(e.data["reason"] == "pending" for e in pending)


@pytest.mark.timeout(240)
def test_a_cancel_of_the_parent_cancels_the_remote_task(
    parent: Chaos, remote: tuple[Gateway, Tenant], protocol: str
) -> None:
    gateway, tenant = remote
    handle = parent.client.open_session(parent.workspace).submit("ask the oracle")
    wait_until(lambda: tenant.control.gate_calls == 1, 90, what="the remote task at its gate")
    handle.interrupt()
    result = handle.wait(120)
    assert result.outcome is TurnStatus.CANCELLED, result.error
    [child] = parent.client.store.children_of_step(result.run_id, 0).values()
    assert child.status is TurnStatus.CANCELLED

    def remote_cancelled() -> bool:
        states = remote_states(gateway, tenant.token, protocol)
        return states in (["TASK_STATE_CANCELED"], ["cancelled"])

    wait_until(remote_cancelled, 60, what="the remote task cancelled")
    tenant.control.open_gate()


def test_an_unreachable_remote_agent_fails_its_call_and_the_parent_goes_on(
    workspace: Path, control: Control, tmp_path: Path, protocol: str
) -> None:
    """Embedded: a remote agent whose card (or MCP endpoint) nobody serves fails its
    child turn, and the parent's model hears the call's result name the failure."""
    oracle = parley.Agent.remote(
        "oracle",
        "http://127.0.0.1:9/" + ("mcp" if protocol == "mcp" else ""),
        protocol,
        description="Answers one question, nowhere.",
    )
    control.script(PARENT_RULES)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with parley.connect(url, host=workspace_host(agents=[oracle]), migrate_schema=True) as client:
        result = client.open_session(workspace).turn("ask the oracle", timeout=60)
        assert result.outcome is TurnStatus.FINISHED, result.error
        [child] = client.store.children_of_step(result.run_id, 0).values()
        assert child.status is TurnStatus.FAILED
        requests = [r for r in control.requests() if r["turn_id"] == result.turn_id]
        [shown] = [m for m in requests[-1]["messages"] if m["role"] == "tool"]
        assert shown["is_error"] is True
        assert shown["content"].startswith(
            "failed: model failed: RemoteAgentError: the remote agent at http://127.0.0.1:9/"
        )
