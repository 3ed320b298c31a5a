"""Sub-agents as a host declares them (docs/sub-agents.md): ``parley.Agent`` and
``Host(agents=...)`` checked when built, each agent offered as a tool taking
``{"task": string}``, the host a child runs with (inheriting what it leaves ``None``),
and a child's policy that can only narrow its parent's."""

from __future__ import annotations

import pytest

import parley
from parley.errors import InvalidRequest
from parley.models import ScriptedModel
from parley.policy import NarrowedPolicy
from parley.ports.host import Access, Ask, Refusal
from parley.sub_agents import AGENT_PARAMETERS, agent_path
from parley.tools import read_file, run_command, write_file

ROOT = "/srv/root"


def _model(name: str = "scripted") -> ScriptedModel:
    return ScriptedModel({"rules": [{"when": ".*", "steps": [{"text": "ok"}]}]}, name=name)


def _host(**settings: object) -> parley.Host:
    return parley.Host(model=_model(), **settings)  # type: ignore[arg-type]


def test_each_agent_is_offered_as_a_tool_taking_a_task() -> None:
    researcher = parley.Agent("researcher", "Finds sources on a question.")
    host = _host(agents=[researcher])
    (offered,) = host.agent_tools
    declaration = offered.declaration
    assert declaration.name == "researcher"
    assert declaration.description == "Finds sources on a question."
    assert declaration.parameters == AGENT_PARAMETERS
    assert declaration.parameters["required"] == ["task"]
    assert declaration.parameters["properties"]["task"]["type"] == "string"
    assert offered.parse('{"task": "find three papers"}') == {"task": "find three papers"}
    assert offered.accesses({"task": "x"}) == ()
    assert host.max_parallel_agents == 16
    assert host.max_agent_depth == 3


@pytest.mark.parametrize(
    "arguments",
    [
        "",
        "{}",
        '{"task": ""}',
        '{"task": "   "}',
        '{"task": 3}',
        '{"task": "a", "b": 1}',
        "[1]",
        "{",
    ],
)
def test_a_call_without_one_task_is_refused(arguments: str) -> None:
    offered = parley.Agent("researcher", "Finds sources.").tool
    with pytest.raises(InvalidRequest):
        offered.parse(arguments)


def test_an_agent_call_never_runs_in_the_calling_process() -> None:
    offered = parley.Agent("researcher", "Finds sources.").tool
    with pytest.raises(InvalidRequest, match="child turns"):
        offered.run({"task": "x"}, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: parley.Agent("has space", "d"), "must match"),
        (lambda: parley.Agent("", "d"), "must match"),
        (lambda: parley.Agent("a", ""), "description"),
        (lambda: parley.Agent("a", "d", system_prompt=3), "system_prompt"),  # type: ignore[arg-type]
        (lambda: parley.Agent("a", "d", model="gpt"), "model"),  # type: ignore[arg-type]
        (lambda: parley.Agent("a", "d", policy=object()), "policy"),  # type: ignore[arg-type]
        (lambda: parley.Agent("a", "d", contract={}), "contract"),  # type: ignore[arg-type]
        (lambda: parley.Agent("a", "d", tools="read_file"), "tools"),  # type: ignore[arg-type]
        (lambda: parley.Agent("a", "d", tools=[print]), "not a tool"),  # type: ignore[list-item]
        (lambda: parley.Agent("a", "d", agents=["b"]), "parley.Agent"),  # type: ignore[list-item]
        (
            lambda: parley.Agent("a", "d", agents=[parley.Agent("b", "x"), parley.Agent("b", "y")]),
            "duplicate agent names",
        ),
    ],
)
def test_a_bad_agent_is_refused_when_declared(make: object, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        make()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"agents": [parley.Agent("read_file", "d")]}, "duplicate tool names"),
        ({"agents": "researcher"}, "parley.Agent"),
        ({"agents": [parley.Agent("a", "d"), parley.Agent("a", "e")]}, "duplicate agent"),
        ({"max_parallel_agents": 0}, "max_parallel_agents"),
        ({"max_parallel_agents": True}, "max_parallel_agents"),
        ({"max_agent_depth": -1}, "max_agent_depth"),
        ({"max_agent_depth": 1.5}, "max_agent_depth"),
    ],
)
def test_a_bad_host_setting_is_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        _host(**settings)


def test_a_child_host_inherits_what_its_agent_leaves_unset() -> None:
    plain = parley.Agent("plain", "Inherits everything.")
    host = _host(
        system_prompt="parent prompt", tools=[read_file, write_file], agents=[plain], retention=None
    )
    child = host.for_agent(("plain",))
    assert child.model is host.model
    assert child.system_prompt == "parent prompt"
    assert child.tools == (read_file, write_file)
    assert child.policy is host.policy
    assert child.agents == ()  # its own agents only: none
    assert child.max_agent_depth == host.max_agent_depth
    assert host.for_agent(()) is host
    assert host.for_agent(("plain",)) is child  # built once per path


def test_a_child_host_takes_what_its_agent_sets() -> None:
    critic_model = _model("critic-model")
    critic = parley.Agent("critic", "Reviews a draft.", model=critic_model, tools=[])
    writer = parley.Agent(
        "writer",
        "Writes a draft.",
        system_prompt="You write.",
        tools=[write_file],
        agents=[critic],
    )
    host = _host(agents=[writer])
    child = host.for_agent(("writer",))
    assert child.system_prompt == "You write."
    assert child.tools == (write_file,)
    assert [t.declaration.name for t in child.agent_tools] == ["critic"]
    grandchild = host.for_agent(agent_path("writer/critic"))
    assert grandchild.model is critic_model
    assert grandchild.system_prompt == "You write."  # its parent's, the writer's
    assert grandchild.tools == ()
    assert grandchild.agent_tools == ()


@pytest.mark.parametrize("path", [("nobody",), ("writer", "nobody"), ("writer", "writer")])
def test_an_undeclared_agent_path_is_refused(path: tuple[str, ...]) -> None:
    host = _host(agents=[parley.Agent("writer", "Writes.")])
    with pytest.raises(InvalidRequest, match="no agent"):
        host.for_agent(path)


def test_a_policy_names_agents_like_tools() -> None:
    policy = parley.Policy(deny_tools=["researcher"], ask_tools=["critic"])
    refused = policy.check("researcher", [], ROOT)
    assert isinstance(refused, Refusal)
    assert refused.rule == "deny_tools:researcher"
    asked = policy.check("critic", [], ROOT)
    assert isinstance(asked, Ask)
    assert asked.rule == "ask_tools:critic"


def test_a_child_policy_only_narrows_its_parents() -> None:
    parent = parley.Policy(allow_write=["src/**"], allow_execute=["pytest"])
    # The child's own policy allows more than its parent: writes anywhere, any command.
    wider = parley.Policy(allow_write=["**"], allow_execute=["*", "* **"], deny_tools=["search"])
    child = NarrowedPolicy(parent, wider)
    outside = [Access(mode="write", path="docs/a.md")]
    assert isinstance(child.check("write_file", outside, ROOT), Refusal)
    assert isinstance(
        child.check("run_command", [Access(mode="execute", path="make")], ROOT), Refusal
    )
    inside = [Access(mode="write", path="src/a.py")]
    assert child.check("write_file", inside, ROOT) is None
    assert child.check("run_command", [Access(mode="execute", path="pytest")], ROOT) is None
    # What the parent allows, the child's own policy may still refuse or ask about.
    assert isinstance(child.check("search", [], ROOT), Refusal)
    asking = NarrowedPolicy(parent, parley.Policy(ask_write=["src/**"]))
    assert isinstance(asking.check("write_file", inside, ROOT), Ask)
    # And a parent's ask stays an ask under a child that allows.
    asked_above = NarrowedPolicy(parley.Policy(ask_tools=["write_file"]), parley.Policy())
    assert isinstance(asked_above.check("write_file", inside, ROOT), Ask)


def test_an_agents_own_policy_goes_on_top_of_its_parents() -> None:
    agent = parley.Agent("tester", "Runs tests.", policy=parley.Policy(allow_execute=["*", "* **"]))
    host = _host(
        tools=[read_file, run_command],
        agents=[agent],
        policy=parley.Policy(allow_execute=["pytest"]),
    )
    child = host.for_agent(("tester",))
    assert isinstance(child.policy, NarrowedPolicy)
    assert isinstance(
        child.policy.check("run_command", [Access(mode="execute", path="rm -rf x")], ROOT), Refusal
    )
    assert child.policy.check("run_command", [Access(mode="execute", path="pytest")], ROOT) is None


def test_a_script_shared_with_agents_may_call_any_tool_of_the_tree() -> None:
    def calling(*names: str) -> ScriptedModel:
        steps = [{"tool_calls": [{"name": n, "arguments": {}} for n in names]}]
        return ScriptedModel({"rules": [{"when": ".*", "steps": steps}]})

    helper = parley.Agent("helper", "Writes.", tools=[write_file])
    model = calling("helper", "write_file", "read_file")
    host = parley.Host(model=model, tools=[read_file], agents=[helper])
    assert host.for_agent(("helper",)).model is model  # built, its tools the agent's
    with pytest.raises(InvalidRequest, match="unknown tool"):
        parley.Host(model=calling("helper", "nowhere"), tools=[read_file], agents=[helper])
