"""``parley.Agent.remote`` (docs/sub-agents.md#8-remote-agents): what it declares, and a
clear error for each bad argument, before anything is sent anywhere."""

from __future__ import annotations

from typing import Any

import pytest

import parley
from parley.errors import InvalidRequest
from parley.ports.host import ModelRequest
from parley.remote_agents import RemoteAgentModel
from parley.schemas.messages import Prefix, UserMessage
from tests.providers.sink import RecordingSink


def test_a_remote_agent_is_an_agent_whose_model_is_the_remote_service() -> None:
    agent = parley.Agent.remote(
        "oracle", "http://127.0.0.1:9/", "a2a", description="Answers.", token="tok"
    )
    assert agent.tool.declaration.name == "oracle"
    assert agent.tools == ()  # the remote side has its own
    assert isinstance(agent.model, RemoteAgentModel)
    assert agent.model.headers == {"Authorization": "Bearer tok"}
    assert agent.model.name == "a2a:http://127.0.0.1:9/"


def test_a_remote_mcp_agent_names_the_tool_it_gives_its_task() -> None:
    agent = parley.Agent.remote(
        "oracle", "http://127.0.0.1:9/mcp", "mcp", description="Answers.", tool="research"
    )
    assert isinstance(agent.model, RemoteAgentModel)
    assert agent.model.tool == "research" and agent.model.name == "mcp:http://127.0.0.1:9/mcp"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"url": "ftp://x"}, "http"),
        ({"url": 3}, "http"),
        ({"protocol": "smtp"}, "protocol"),
        ({"token": ""}, "token"),
        ({"headers": {"x": 1}}, "headers"),
        ({"poll_seconds": 0}, "poll_seconds"),
        ({"tool": "ask"}, "tool"),  # an A2A agent has no tools
        ({"protocol": "mcp", "tool": ""}, "tool"),
        ({"description": " "}, "description"),
        ({"name": "no spaces"}, "name"),
    ],
)
def test_bad_arguments_are_refused_clearly(arguments: dict[str, Any], message: str) -> None:
    given: dict[str, Any] = {
        "name": "oracle",
        "url": "http://127.0.0.1:9/",
        "description": "Answers.",
        **arguments,
    }
    with pytest.raises(InvalidRequest, match=message):
        parley.Agent.remote(**given)


def test_a_remote_agent_runs_only_as_a_child_turn() -> None:
    model = RemoteAgentModel(url="http://127.0.0.1:9/")
    request = ModelRequest(
        prefix=Prefix(system_prompt="", tools=()), messages=(UserMessage(text="hi"),)
    )
    with pytest.raises(InvalidRequest, match="child turn"):
        model.stream(request, RecordingSink())
