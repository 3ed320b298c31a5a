"""MCP servers in real turns: a host's servers join its toolbox (in the frozen prefix,
under the policy, kept open across turns); a contract's servers serve one turn only, once
the policy allows starting them; a server that cannot start fails the turn at its start
with a clear error; a malformed server in a contract is refused before anything is stored."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.errors import InvalidRequest
from parley.mcp import McpServer
from parley.schemas.events import EventKind
from tests.support.helpers import RecordingModel

SERVER_SCRIPT = str(Path(__file__).resolve().parents[1] / "support" / "mcp_server.py")
STDIO = McpServer.stdio("calc", [sys.executable, SERVER_SCRIPT, "stdio"], timeout=20)
RULES = [
    {
        "when": "^add",
        "steps": [
            {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
            {"text": "summed"},
        ],
    },
    {
        "when": "^pid",
        "steps": [{"tool_calls": [{"name": "pid", "arguments": {}}]}, {"text": "pid noted"}],
    },
    {"when": ".*", "steps": [{"text": "plain"}]},
]


class ContractToolsModel(RecordingModel):
    """The script calls tools only a contract's server offers: the host cannot check its
    tool names when it is built."""

    validate_tools = None  # type: ignore[assignment]


def make_client(tmp_path: Path, **host_options: Any) -> tuple[parley.Client, RecordingModel]:
    model = ContractToolsModel(parley.models.ScriptedModel({"rules": RULES}))
    host = parley.Host(model=model, **host_options)
    return parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host=host), model


def tool_results(client: parley.Client, turn_id: str) -> list[dict[str, Any]]:
    events = list(client.attach(turn_id).events())
    return [e.data for e in events if e.kind is EventKind.TOOL_RESULT]


def test_host_servers_join_the_toolbox_and_stay_open(tmp_path: Path) -> None:
    client, model = make_client(
        tmp_path, mcp_servers=[STDIO], policy=parley.Policy(allow_mcp=["calc/*"])
    )
    with client:
        session = client.open_session(str(tmp_path))
        result = session.turn("add two numbers")
        assert [r["content"] for r in tool_results(client, result.turn_id)] == ["5"]
        declared = [t.name for t in model.requests[0].prefix.tools]
        assert {"read_file", "add", "echo", "pid"} <= set(declared)
        first = session.turn("pid please")
        second = session.turn("pid again")
        pids = [tool_results(client, r.turn_id)[0]["content"] for r in (first, second)]
        assert pids[0] == pids[1], "the host's server was restarted between turns"
        client.host.close()  # type: ignore[union-attr]


def test_the_policy_governs_mcp_tools(tmp_path: Path) -> None:
    client, _ = make_client(tmp_path, mcp_servers=[STDIO])  # default policy: execute nothing
    with client:
        result = client.open_session(str(tmp_path)).turn("add two numbers")
        [refused] = tool_results(client, result.turn_id)
        assert refused["refusal"] == "allow_mcp"
        client.host.close()  # type: ignore[union-attr]


def test_a_contract_server_serves_its_turn_only_and_needs_the_policy(tmp_path: Path) -> None:
    command_line = " ".join([sys.executable, SERVER_SCRIPT, "stdio"])
    policy = parley.Policy(allow_mcp=["**"], allow_mcp_servers=[command_line])
    client, model = make_client(tmp_path, policy=policy)
    with client:
        session = client.open_session(str(tmp_path))
        contract = parley.TaskContract(mcp_servers=[STDIO])
        result = session.turn("add two numbers", contract=contract)
        assert [r["content"] for r in tool_results(client, result.turn_id)] == ["5"]
        request = model.requests[-1]
        names = [t.name for t in request.prefix.tools]
        # The turn's tools come after the host's: the frozen part is unchanged.
        assert names.index("add") > names.index("read_file")
        plain = session.turn("add again, without the contract")
        [missing] = tool_results(client, plain.turn_id)
        assert missing["is_error"] and "unknown tool 'add'" in missing["content"]
        assert "add" not in [t.name for t in model.requests[-1].prefix.tools]

    other = tmp_path / "default-policy"
    other.mkdir()
    refusing, _ = make_client(other)  # the default policy starts no contract server
    with refusing:
        session = refusing.open_session(str(tmp_path))
        ended = session.turn("add", contract=parley.TaskContract(mcp_servers=[STDIO]))
        assert ended.outcome == parley.TurnStatus.FAILED
        assert "McpError" in (ended.error or "") and "refused by policy rule" in (ended.error or "")


def test_a_server_that_cannot_start_fails_the_turn_at_its_start(tmp_path: Path) -> None:
    broken = McpServer.stdio("broken", [sys.executable, "-c", "import sys; sys.exit(3)"])
    client, model = make_client(tmp_path, mcp_servers=[broken])
    with client:
        result = client.open_session(str(tmp_path)).turn("add two numbers")
        assert result.outcome == parley.TurnStatus.FAILED
        assert "McpError" in (result.error or "") and "broken" in (result.error or "")
        assert model.requests == [], "the model was called although the toolbox never opened"


def test_a_malformed_contract_server_is_refused_before_anything_is_stored(
    tmp_path: Path,
) -> None:
    client, _ = make_client(tmp_path)
    with client:
        session = client.open_session(str(tmp_path))
        with pytest.raises(InvalidRequest):
            session.submit(
                "x", contract=parley.TaskContract(mcp_servers=[{"name": "no-transport"}])
            )
        with pytest.raises(InvalidRequest):
            parley.TaskContract(mcp_servers="not a list")  # type: ignore[arg-type]
        assert session.tree() == []


@pytest.mark.parametrize(
    "options", [{"env": {"PATH": "/tmp/evil"}}, {"cwd": "/"}], ids=["env", "cwd"]
)
def test_a_contract_server_may_not_change_its_environment_or_directory(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    """An allowed command line must not become another program through the variables or
    the directory it runs with."""
    command_line = " ".join([sys.executable, SERVER_SCRIPT, "stdio"])
    policy = parley.Policy(allow_mcp=["**"], allow_mcp_servers=[command_line])
    client, model = make_client(tmp_path, policy=policy)
    spec = McpServer.stdio("calc", [sys.executable, SERVER_SCRIPT, "stdio"], **options)
    with client:
        ended = client.open_session(str(tmp_path)).turn(
            "add", contract=parley.TaskContract(mcp_servers=[spec])
        )
        assert ended.outcome == parley.TurnStatus.FAILED
        assert "may not set env or cwd" in (ended.error or "")
        assert model.requests == []


def test_the_approver_has_the_last_word_on_a_contract_server(tmp_path: Path) -> None:
    class Declines:
        def __init__(self) -> None:
            self.asked: list[parley.ApprovalRequest] = []

        def approve(self, request: parley.ApprovalRequest) -> bool:
            self.asked.append(request)
            return False

    approver = Declines()
    command_line = " ".join([sys.executable, SERVER_SCRIPT, "stdio"])
    policy = parley.Policy(allow_mcp=["**"], allow_mcp_servers=[command_line])
    client, _ = make_client(tmp_path, policy=policy, approver=approver)
    with client:
        ended = client.open_session(str(tmp_path)).turn(
            "add", contract=parley.TaskContract(mcp_servers=[STDIO])
        )
        assert ended.outcome == parley.TurnStatus.FAILED
        assert "declined by the host's approver" in (ended.error or "")
        [asked] = approver.asked
        assert asked.tool == "mcp_server" and asked.accesses[0].mode == "mcp_server"
