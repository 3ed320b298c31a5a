"""Sub-agents as a host declares them (docs/sub-agents.md): ``parley.Agent``, the tool
each is offered to the model as (arguments ``{"task": string}``), and the path that names
an agent among its host's and their own agents.

An agent's call is never run in the calling process: the engine makes it a child turn
that any worker runs with the agent's host (:meth:`parley.Host.for_agent`).  What is
declared here is what the model is offered, what the policy judges, and what a child
turn runs with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

__all__ = [
    "AGENT_PARAMETERS",
    "PATH_SEPARATOR",
    "Agent",
    "AgentTool",
    "agent_path",
    "checked_agents",
    "checked_tools",
    "is_agent_tool",
]

from parley.errors import InvalidRequest
from parley.ports.host import (
    AGENT_PATH_SEPARATOR,
    Access,
    Model,
    PolicyPort,
    Tool,
    ToolContext,
    agent_path,
)
from parley.remote_agents import RemoteAgentModel
from parley.schemas.messages import ToolDeclaration
from parley.schemas.records import TaskContract
from parley.tools.base import TOOL_NAME, decode_arguments

AGENT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {
            "type": "string",
            "description": "The work to hand to this agent, stated in full: it sees "
            "nothing of this conversation but this text.",
        }
    },
    "required": ["task"],
    "additionalProperties": False,
}
"""The arguments every agent is called with: the task, as text."""

PATH_SEPARATOR = AGENT_PATH_SEPARATOR


@dataclass(frozen=True)
class Agent:
    """An agent the model may hand a task to: offered as a tool named ``name``,
    described by ``description``; each call runs as a child turn.  ``system_prompt``,
    ``model``, ``tools`` and ``contract`` left ``None`` are the parent's; ``policy`` is
    applied on top of the parent's (it can only narrow it); ``agents`` are the ones this
    agent may call in turn (None: none)."""

    name: str
    description: str
    _: KW_ONLY
    system_prompt: str | None = None
    model: Model | None = None
    tools: Sequence[Tool] | None = None
    policy: PolicyPort | None = None
    contract: TaskContract | None = None
    agents: Sequence[Agent] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not TOOL_NAME.fullmatch(self.name):
            raise InvalidRequest(
                f"Agent name {self.name!r} must match {TOOL_NAME.pattern} (it is a tool name)"
            )
        if not isinstance(self.description, str) or not self.description.strip():
            raise InvalidRequest(f"Agent {self.name!r}: description must be non-empty text")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise InvalidRequest(f"Agent {self.name!r}: system_prompt must be text or None")
        if self.model is not None and not callable(getattr(self.model, "stream", None)):
            raise InvalidRequest(f"Agent {self.name!r}: model must have a stream() method")
        if self.policy is not None and not callable(getattr(self.policy, "check", None)):
            raise InvalidRequest(f"Agent {self.name!r}: policy must have a check() method")
        if self.contract is not None and not isinstance(self.contract, TaskContract):
            raise InvalidRequest(f"Agent {self.name!r}: contract must be a parley.TaskContract")
        if self.tools is not None:
            object.__setattr__(self, "tools", checked_tools(self.tools, f"Agent {self.name!r}"))
        if self.agents is not None:
            object.__setattr__(self, "agents", checked_agents(self.agents, f"Agent {self.name!r}"))

    @classmethod
    def remote(
        cls,
        name: str,
        url: str,
        protocol: str = "a2a",
        *,
        description: str,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        poll_seconds: float = 2.0,
        tool: str | None = None,
    ) -> Agent:
        """An agent another service runs (docs/sub-agents.md#8-remote-agents): each call
        is a child turn that sends its task to the ``protocol`` agent at ``url`` (with
        ``token`` as a bearer token, and ``headers``) and answers with the remote
        task's reply; the parent waits for it holding nothing, as for any agent.  Over
        ``"mcp"``, ``url`` is the server's endpoint (``https://host/mcp``) and ``tool``
        the tool given the task (default ``ask``, a parley gateway's agent)."""
        if token is not None and (not isinstance(token, str) or not token):
            raise InvalidRequest(f"Agent {name!r}: token must be non-empty text or None")
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        model = RemoteAgentModel(
            url=url,
            protocol=protocol,  # type: ignore[arg-type]  # checked by the model
            headers=sent,
            poll_seconds=poll_seconds,
            tool=tool,
        )
        return cls(name, description, model=model, tools=(), system_prompt="")

    @property
    def tool(self) -> AgentTool:
        """The tool this agent is offered to the model as."""
        return AgentTool(self)


@dataclass(frozen=True)
class AgentTool:
    """The tool an :class:`Agent` is offered as.  The engine makes each call a child
    turn; nothing runs it in the calling process (``run`` refuses)."""

    agent: Agent

    @property
    def declaration(self) -> ToolDeclaration:
        """What the model sees: the agent's name and description, and the task."""
        return ToolDeclaration(
            name=self.agent.name, description=self.agent.description, parameters=AGENT_PARAMETERS
        )

    def parse(self, arguments: str) -> dict[str, Any]:
        """The call's task, checked: a JSON object with one non-empty ``task`` string."""
        value = decode_arguments(arguments, self.agent.name)
        if not isinstance(value, dict) or set(value) != {"task"}:
            raise InvalidRequest(f"{self.agent.name}: arguments must be exactly {{'task': text}}")
        task = value["task"]
        if not isinstance(task, str) or not task.strip():
            raise InvalidRequest(f"{self.agent.name}: task must be non-empty text")
        return {"task": task}

    def accesses(self, arguments: dict[str, Any]) -> Sequence[Access]:
        """None: what a child touches is judged call by call in its own turn."""
        return ()

    def run(self, arguments: dict[str, Any], context: ToolContext) -> str:
        """Never called: an agent's call is a child turn, which the engine creates."""
        raise InvalidRequest(f"{self.agent.name} is an agent: its calls run as child turns")


def is_agent_tool(tool: object) -> bool:
    """Whether ``tool`` is an agent's (its calls are child turns, not runs)."""
    return isinstance(tool, AgentTool)


def checked_tools(tools: object, where: str) -> tuple[Tool, ...]:
    """``tools`` as a tuple of tools, or :class:`InvalidRequest` naming ``where``."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Iterable):
        raise InvalidRequest(f"{where}: tools must be a list of tools (@parley.tool functions)")
    checked = tuple(tools)
    for tool in checked:
        if not all(callable(getattr(tool, m, None)) for m in ("run", "parse", "accesses")):
            raise InvalidRequest(
                f"{where}: {tool!r} is not a tool; decorate the function with @parley.tool"
            )
    return checked


def checked_agents(agents: object, where: str) -> tuple[Agent, ...]:
    """``agents`` as a tuple of :class:`Agent` with distinct names, or
    :class:`InvalidRequest` naming ``where``."""
    if isinstance(agents, (str, bytes)) or not isinstance(agents, Iterable):
        raise InvalidRequest(f"{where}: agents must be a list of parley.Agent")
    checked = tuple(agents)
    if not all(isinstance(a, Agent) for a in checked):
        raise InvalidRequest(f"{where}: agents must be parley.Agent objects")
    names = [a.name for a in checked]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidRequest(f"{where}: duplicate agent names: {duplicates}")
    return checked
