"""What the application supplies to run turns, and how workers load it from the
environment: ``PARLEY_HOST=package.module:attribute`` or ``scripted:path.json``, or, with
no ``PARLEY_HOST``, a default host around the model ``PARLEY_MODEL`` names."""

from __future__ import annotations

import importlib
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING

from parley.engine.agent_loop import AgentLoop
from parley.errors import InvalidRequest, McpError, ParleyError
from parley.mcp.spec import McpServer
from parley.models.scripted import ScriptedModel
from parley.policy import ApproveAll, NarrowedPolicy, Policy
from parley.ports.admission import Limits
from parley.ports.backend import CommittedStep
from parley.ports.budget import ContextBudget
from parley.ports.compaction import Compaction
from parley.ports.driver import SessionDriver
from parley.ports.host import (
    Access,
    ApprovalRequest,
    Approver,
    HookSet,
    Model,
    PolicyPort,
    Tool,
    ToolContext,
    Toolset,
    native_provider_of,
)
from parley.retention import check_retention
from parley.schemas.records import SessionRecord, TaskContract
from parley.settings import Settings
from parley.sub_agents import PATH_SEPARATOR, Agent, AgentTool, checked_agents, checked_tools
from parley.tools import WORKSPACE_TOOLS
from parley.tools.wait import WaitTool
from parley.webhooks import check_webhook_url

if TYPE_CHECKING:
    from parley.mcp.pool import McpPool
    from parley.replay_tools import ReplayAnswers

DEFAULT_TOOL_OUTPUT_LIMIT = 20_000
MCP_SERVER_TOOL = "mcp_server"
"""The tool name a contract's MCP server is checked under (``deny_tools`` can name it)."""


@dataclass(frozen=True, kw_only=True)
class Host:
    """Model, system prompt, tools, MCP servers, policy, approver and hooks: what the
    application supplies to the workers.

    ``model`` defaults to the one ``PARLEY_MODEL`` names (``openai:<model>``,
    ``anthropic:<model>``, ``scripted:<path>``, or a comma-separated fallover list).
    ``mcp_servers`` are started on first use in each process and kept open; their tools
    join ``tools`` under the same policy.  ``hooks`` is a :class:`parley.SessionHooks`
    subclass, or any object with some of ``before_turn``, ``before_commit``,
    ``after_commit`` and ``on_terminal``.  parley is
    not a policy layer: prompts, model choice, authorization, tool admission and
    credentials stay the host's."""

    model: Model = None  # type: ignore[assignment]  # filled from PARLEY_MODEL
    system_prompt: str = "You are a careful assistant working in a code workspace."
    tools: Sequence[Tool] = WORKSPACE_TOOLS
    mcp_servers: Sequence[McpServer] = ()
    policy: PolicyPort = field(default_factory=Policy)
    approver: Approver = field(default_factory=ApproveAll)
    hooks: object | None = None
    tool_output_limit: int = DEFAULT_TOOL_OUTPUT_LIMIT
    context_budget: ContextBudget | None = None
    compaction: Compaction | None = None
    """Compact a session before a turn's first model call once the request would pass
    a share of the model's context window (docs/compaction.md#when)."""
    retention: timedelta | None = None
    """The time to live of sessions that set none of their own, past their newest
    activity: the sweeper (and an embedded client running turns) prunes them after it
    (docs/operations.md "Retention").  None: kept until pruned."""
    webhook_url: str | None = None
    """Where every turn's end is posted (signed), unless its session names its own URL
    (docs/operations.md "Webhooks")."""
    approval_timeout: float | None = None
    """Seconds a call that asked may wait for its answer before it is denied as
    ``timed out`` (None: as long as it takes)."""
    driver: SessionDriver = field(default_factory=AgentLoop)
    """What runs each turn's steps: parley's own loop, or a host's (``parley.SessionDriver``,
    see ``docs/drivers.md``)."""
    limits: Mapping[str, Limits] = field(default_factory=dict)
    """Each model's provider limits by its name (``openai:gpt-4o-mini``: a
    ``parley.Limits``), shared by the whole fleet; ``PARLEY_MODEL_LIMITS`` overrides a
    model named in both.  A model named in neither takes the limits its provider reports
    (docs/admission.md)."""
    agents: Sequence[Agent] = ()
    """Agents the model may hand tasks to, each offered as a tool (``parley.Agent``;
    docs/sub-agents.md): a call runs as a child turn."""
    max_parallel_agents: int = 16
    """How many agent calls of one step run at the same time; the rest wait for a place."""
    max_agent_depth: int = 3
    """How deep children may nest: the top turn is depth 0; a call past it is a tool
    error, not a turn."""
    wait_tool: bool = False
    """Offer the model the built-in ``wait`` tool (``{"event"?, "seconds"?}``): its call
    parks the turn until a signal of that name or the time (docs/time.md#waiting-for-an-event)."""
    replaying: ReplayAnswers | None = field(default=None, init=False, repr=False, compare=False)
    """Set on the host a ``recorded`` replay's turn runs with (:meth:`for_replay`): its
    tools, its MCP servers' and its agents' calls are answered from the recording."""
    _mcp_pool: McpPool | None = field(default=None, init=False, repr=False, compare=False)
    _agent_hosts: dict[tuple[str, ...], Host] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _tree: frozenset[str] | None = field(default=None, repr=False, compare=False)
    """Every tool and agent name of the host's tree, as its top host found them: the
    hosts :meth:`for_agent` derives carry the top host's (``replace`` copies it)."""
    _hook_set: HookSet = field(default_factory=HookSet, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.model is None:
            object.__setattr__(self, "model", model_from_environment())
        tools = checked_tools(self.tools, "Host.tools")
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "agents", checked_agents(self.agents, "Host"))
        self._check_parts()
        if self._tree is None:
            object.__setattr__(self, "_tree", frozenset(_tree_tool_names(self)))
        assert self._tree is not None
        named = (*tools, *self.agent_tools, *self.builtin_tools)
        self._check_model([t.declaration.name for t in named], self._tree)
        self._check_settings()
        if not callable(getattr(self.driver, "drive", None)):
            raise InvalidRequest(
                "Host.driver must have a drive(turn) method (a parley.SessionDriver)"
            )
        servers = tuple(self.mcp_servers)
        if not all(isinstance(s, McpServer) for s in servers):
            raise InvalidRequest("Host.mcp_servers must be parley.mcp.McpServer objects")
        object.__setattr__(self, "mcp_servers", servers)
        object.__setattr__(self, "_hook_set", HookSet.of(self.hooks))

    def _check_parts(self) -> None:
        if not isinstance(self.system_prompt, str):
            raise InvalidRequest("Host.system_prompt must be text")
        if not callable(getattr(self.policy, "check", None)):
            raise InvalidRequest("Host.policy must have a check() method, as parley.Policy does")
        if not callable(getattr(self.approver, "approve", None)):
            raise InvalidRequest("Host.approver must have an approve(request) method")

    def _check_model(self, names: list[str], tree: frozenset[str]) -> None:
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidRequest(f"duplicate tool names: {duplicates}")
        if not callable(getattr(self.model, "stream", None)):
            raise InvalidRequest("Host.model must have a stream(request, on_delta) method")
        validate_tools = getattr(self.model, "validate_tools", None)
        if validate_tools is not None and not self.mcp_servers:
            # With MCP servers the full toolbox is known only once they have started.  A
            # model shared with agents (a script) may call any tool of the tree: each
            # turn refuses a tool it does not offer, as for any call the model makes.
            validate_tools(sorted(tree))

    def _check_settings(self) -> None:
        limit = self.tool_output_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidRequest("tool_output_limit must be a positive integer")
        if self.context_budget is not None and not isinstance(self.context_budget, ContextBudget):
            raise InvalidRequest("Host.context_budget must be a parley.ContextBudget")
        self._check_compaction()
        check_retention(self.retention, "Host.retention")
        check_webhook_url(self.webhook_url, "Host.webhook_url")
        if not isinstance(self.limits, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, Limits) for k, v in self.limits.items()
        ):
            raise InvalidRequest(
                "Host.limits must map model names to parley.Limits, e.g. "
                '{"openai:gpt-4o-mini": parley.Limits(rpm=500, tpm=200_000)}'
            )
        object.__setattr__(self, "limits", dict(self.limits))
        if not isinstance(self.wait_tool, bool):
            raise InvalidRequest("Host.wait_tool must be True or False")
        for name, least in (("max_parallel_agents", 1), ("max_agent_depth", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidRequest(f"Host.{name} must be an integer of at least {least}")
        timeout = self.approval_timeout
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise InvalidRequest("Host.approval_timeout must be a positive number of seconds")

    def _check_compaction(self) -> None:
        compaction = self.compaction
        if compaction is None:
            return
        if not isinstance(compaction, Compaction):
            raise InvalidRequest("Host.compaction must be a parley.Compaction")
        if compaction.limit(self.model.name) is None:
            raise InvalidRequest(
                f"Host.compaction: the context window of {self.model.name!r} is not known; "
                "give it as Compaction(window=tokens)"
            )
        if compaction.strategy == "native" and not native_provider_of(self.model):
            raise InvalidRequest(
                f"Host.compaction: strategy 'native' needs a model whose provider compacts "
                f"natively (Anthropic's); {self.model.name!r} does not"
            )

    @property
    def agent_tools(self) -> tuple[AgentTool, ...]:
        """The tools this host's agents are offered as, after its own tools."""
        return tuple(agent.tool for agent in self.agents)

    @property
    def builtin_tools(self) -> tuple[Tool, ...]:
        """The built-in tools this host offers: ``wait`` with ``wait_tool``."""
        return (WaitTool(),) if self.wait_tool else ()

    def for_agent(self, path: Sequence[str]) -> Host:
        """The host a child turn of the agent at ``path`` runs with (``()``: this one):
        each of the agent's ``None`` settings is its parent's, its policy goes on top of
        its parent's, and it offers its own agents only.  Built once per path and
        process (its MCP servers are kept open, as the host's are).
        :class:`InvalidRequest` for a path this host does not declare."""
        key = tuple(path)
        if not key:
            return self
        known = self._agent_hosts.get(key)
        if known is not None:
            return known
        parent = self.for_agent(key[:-1])
        agent = next((a for a in parent.agents if a.name == key[-1]), None)
        if agent is None:
            raise InvalidRequest(
                f"no agent {PATH_SEPARATOR.join(key)!r}: "
                f"{'/'.join(key[:-1]) or 'the host'} declares {[a.name for a in parent.agents]}"
            )
        derived = replace(
            parent,
            model=agent.model or parent.model,
            system_prompt=(
                agent.system_prompt if agent.system_prompt is not None else parent.system_prompt
            ),
            tools=agent.tools if agent.tools is not None else parent.tools,
            policy=NarrowedPolicy(parent.policy, agent.policy) if agent.policy else parent.policy,
            agents=agent.agents or (),
        )
        self._agent_hosts[key] = derived
        return derived

    def for_replay(
        self,
        session: SessionRecord,
        recorded: Sequence[CommittedStep],
        turn_steps: Sequence[CommittedStep],
        steer: Callable[[str], None],
    ) -> Host:
        """The host a turn of the replay session ``session`` runs with (docs/replay.md):
        the replay's host, model and system prompt where it chose them; in ``recorded``
        mode each tool wrapped to answer a call of the original (``recorded``: all its
        steps) with its recorded result.  The original turn's steers (``turn_steps``)
        are sent through ``steer`` in their places."""
        from parley import replay_tools as rt

        chosen = rt.replay_choice(session.metadata)
        local = rt.local_choice(session.session_id)
        base: Host = local.host if isinstance(local.host, Host) else self
        model = local.model or base.model
        if local.model is None and isinstance(chosen.get("model"), str):
            model = model_from_settings(replace(Settings.from_environment(), model=chosen["model"]))
        places = rt.steers_by_step(turn_steps)
        for text in places.pop(0, ()):
            steer(text)  # before the first step: its boundary takes it
        answers = None
        if chosen.get("tools", "recorded") == "recorded":
            read_only = getattr(base.policy, "read_only_tools", rt.DEFAULT_READ_ONLY_TOOLS)
            answers = rt.ReplayAnswers(rt.RecordedCalls.of(recorded), frozenset(read_only))
        prompt = chosen.get("system_prompt")
        derived = replace(
            base,
            model=rt.SteeringModel(model, places, steer),
            system_prompt=prompt if isinstance(prompt, str) else base.system_prompt,
        )
        object.__setattr__(derived, "replaying", answers)
        # The base host's MCP servers, kept open across turns, serve the replay's too
        # (a pool of its own would start them again for every turn, and never stop).
        object.__setattr__(derived, "_mcp_pool", base._pool())
        return derived

    @property
    def hook_set(self) -> HookSet:
        """The hooks the engine calls, resolved from ``hooks`` once."""
        return self._hook_set

    def toolset(self, contract: TaskContract | None, context: ToolContext) -> Toolset:
        """The tools of one turn: the host's own, its MCP servers' (kept open across
        turns), and those of the MCP servers the turn's contract names (started now, in
        the session root, if the policy and the approver allow starting each, and
        stopped when the turn ends).  Raises :class:`~parley.errors.McpError` if a server
        cannot be started or is refused."""
        # (a recorded wait's call is answered by the signal it got, not waited again)
        stable = (*self._replayed((*self.tools, *self.builtin_tools)), *self.agent_tools)
        stable += self._replayed(self._host_mcp_tools())
        specs = [McpServer.from_json(s) for s in contract.mcp_servers] if contract else []
        if not specs:
            return Toolset(stable=stable)
        specs = [self._admit(spec, context) for spec in specs]
        from parley.mcp.toolbox import open_toolbox

        toolbox = open_toolbox(specs, reserved=[t.declaration.name for t in stable])
        extra = self._replayed(toolbox.tools)
        return Toolset(stable=stable, extra=extra, close=toolbox.close)

    def _replayed(self, tools: Sequence[Tool]) -> tuple[Tool, ...]:
        """``tools`` as this host's turns run them: wrapped in a ``recorded`` replay
        (an agent's calls are answered by the engine: they open no child turn)."""
        if self.replaying is None:
            return tuple(tools)
        return tuple(self.replaying.wrap(t) for t in tools)

    def close(self) -> None:
        """Stop this process's host MCP servers (they start again on next use)."""
        if self._mcp_pool is not None:
            self._mcp_pool.close()

    def _host_mcp_tools(self) -> tuple[Tool, ...]:
        pool = self._pool()
        if pool is None:
            return ()
        named = (*self.tools, *self.agent_tools, *self.builtin_tools)
        return pool.tools(reserved=[t.declaration.name for t in named])

    def _pool(self) -> McpPool | None:
        """The pool of this host's MCP servers (made, not started, on first use); None
        without servers."""
        if not self.mcp_servers:
            return None
        pool = self._mcp_pool
        if pool is None:
            from parley.mcp.pool import McpPool

            pool = McpPool(self.mcp_servers)
            object.__setattr__(self, "_mcp_pool", pool)
        return pool

    def _admit(self, spec: McpServer, context: ToolContext) -> McpServer:
        """A contract comes from whoever submits the turn, so starting its server (a
        program on this machine, or a connection out) must be allowed by the policy
        (``allow_mcp_servers``, matched against its command line or URL) and by the
        approver.  A stdio server runs in the session root with the SDK's minimal
        environment: a submitter may not set ``env`` or ``cwd``, which could turn an
        allowed command into another one (``PATH``, ``LD_PRELOAD``, a hook in a config
        file).  Returns the spec as it will run."""
        where = f"MCP server {spec.name!r} of the turn's contract"
        if spec.command:
            if spec.env or spec.cwd is not None:
                raise McpError(f"{where} may not set env or cwd: it runs in the session root")
            spec = replace(spec, cwd=context.root)
        target = shlex.join(spec.command) if spec.command else str(spec.url)
        access = Access(mode="mcp_server", path=target)
        refusal = self.policy.check(MCP_SERVER_TOOL, [access], context.root)
        if refusal is not None:
            raise McpError(f"{where} is refused by policy rule {refusal.rule}: {refusal.reason}")
        request = ApprovalRequest(
            session_id=context.session_id,
            turn_id=context.turn_id,
            tool=MCP_SERVER_TOOL,
            arguments=spec.to_json(),
            accesses=(access,),
        )
        if not self.approver.approve(request):
            raise McpError(f"{where} was declined by the host's approver")
        return spec


def _tree_tool_names(host: Host) -> set[str]:
    """The names of every tool and agent the host's turns and its agents' offer."""
    names = {t.declaration.name for t in (*host.tools, *host.builtin_tools)}

    def visit(agents: Sequence[Agent], inherited: Sequence[Tool]) -> None:
        for agent in agents:
            names.add(agent.name)
            tools = agent.tools if agent.tools is not None else inherited
            names.update(t.declaration.name for t in tools)
            visit(agent.agents or (), tools)

    visit(host.agents, host.tools)
    return names


def model_from_environment(env: Mapping[str, str] | None = None) -> Model:
    """The model ``PARLEY_MODEL`` names (in ``env``, else the process's environment,
    read now); a clear error when it is not set."""
    return model_from_settings(Settings.from_environment(*([] if env is None else [env])))


def model_from_settings(settings: Settings) -> Model:
    """The model ``settings``' ``PARLEY_MODEL`` names; a clear error when it is not set."""
    if not settings.model:
        raise InvalidRequest(
            "no model: pass Host(model=...) or set PARLEY_MODEL "
            "(openai:<model>, anthropic:<model> or scripted:<path.json>)"
        )
    from parley.models.selection import model_from_spec

    return model_from_spec(settings.model, settings.credentials)


def load_host(spec: str) -> Host:
    """Build the host named by ``spec``: ``package.module:attribute`` (a Host, or a
    function returning one) or ``scripted:path/to/script.json``."""
    if not isinstance(spec, str):
        raise InvalidRequest(f"a host is named by a string, not {spec!r}")
    if spec.startswith("scripted:"):
        return Host(model=ScriptedModel(spec.removeprefix("scripted:")))
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidRequest(
            f"PARLEY_HOST {spec!r} must be 'package.module:attribute' or 'scripted:path.json'"
        )
    target = _import_target(spec, module_name, attribute)
    host = target
    if callable(target) and not isinstance(target, Host):
        try:
            host = target()
        except ParleyError:
            raise  # the factory's own account (a missing key, a bad script, …)
        except Exception as exc:
            raise InvalidRequest(
                f"cannot load host {spec!r}: calling it failed: {type(exc).__name__}: {exc}"
            ) from exc
    if not isinstance(host, Host):
        raise InvalidRequest(f"{spec!r} is a {type(host).__name__}, not a parley.Host")
    return host


def _import_target(spec: str, module_name: str, attribute: str) -> object:
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise InvalidRequest(f"cannot load host {spec!r}: {exc}") from exc
    except ParleyError:
        raise
    except Exception as exc:  # the module itself failed as it was imported
        raise InvalidRequest(
            f"cannot load host {spec!r}: importing {module_name} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def host_from_environment(env: Mapping[str, str] | None = None) -> Host | None:
    """The host ``PARLEY_HOST`` or ``PARLEY_MODEL`` names (in ``env``, else the process's
    environment, read now): :func:`host_from_settings`."""
    return host_from_settings(Settings.from_environment(*([] if env is None else [env])))


def host_from_settings(settings: Settings) -> Host | None:
    """The host ``PARLEY_HOST`` names, else a default host around ``PARLEY_MODEL``'s
    model, else None (a client that only reads)."""
    if settings.host:
        return load_host(settings.host)
    if settings.model:
        return Host(model=model_from_settings(settings))
    return None
