"""What the application supplies to run turns, and how workers load it from the
environment: ``PARLEY_HOST=package.module:attribute`` or ``scripted:path.json``, or, with
no ``PARLEY_HOST``, a default host around the model ``PARLEY_MODEL`` names."""

from __future__ import annotations

import importlib
import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING

from parley.errors import InvalidRequest, McpError, ParleyError
from parley.mcp.spec import McpServer
from parley.models.scripted import ScriptedModel
from parley.policy import ApproveAll, Policy
from parley.retention import check_retention
from parley.tools import WORKSPACE_TOOLS
from parley.webhooks import check_webhook_url
from schemas.records import TaskContract
from workers.engine.agent_loop import AgentLoop
from workers.ports.admission import Limits
from workers.ports.budget import ContextBudget
from workers.ports.driver import SessionDriver
from workers.ports.host import (
    Access,
    ApprovalRequest,
    Approver,
    HookSet,
    Model,
    PolicyPort,
    Tool,
    ToolContext,
    Toolset,
)

if TYPE_CHECKING:
    from parley.mcp.pool import McpPool

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
    _mcp_pool: McpPool | None = field(default=None, init=False, repr=False, compare=False)
    _hook_set: HookSet = field(default_factory=HookSet, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.model is None:
            object.__setattr__(self, "model", model_from_environment())
        tools = self._checked_tools()
        object.__setattr__(self, "tools", tools)
        self._check_parts()
        self._check_model([t.declaration.name for t in tools])
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

    def _checked_tools(self) -> tuple[Tool, ...]:
        if isinstance(self.tools, (str, bytes)) or not isinstance(self.tools, Iterable):
            raise InvalidRequest("Host.tools must be a list of tools (@parley.tool functions)")
        tools = tuple(self.tools)
        for tool in tools:
            if not all(callable(getattr(tool, m, None)) for m in ("run", "parse", "accesses")):
                raise InvalidRequest(
                    f"Host.tools: {tool!r} is not a tool; decorate the function with @parley.tool"
                )
        return tools

    def _check_parts(self) -> None:
        if not isinstance(self.system_prompt, str):
            raise InvalidRequest("Host.system_prompt must be text")
        if not callable(getattr(self.policy, "check", None)):
            raise InvalidRequest("Host.policy must have a check() method, as parley.Policy does")
        if not callable(getattr(self.approver, "approve", None)):
            raise InvalidRequest("Host.approver must have an approve(request) method")

    def _check_model(self, names: list[str]) -> None:
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidRequest(f"duplicate tool names: {duplicates}")
        if not callable(getattr(self.model, "stream", None)):
            raise InvalidRequest("Host.model must have a stream(request, on_delta) method")
        validate_tools = getattr(self.model, "validate_tools", None)
        if validate_tools is not None and not self.mcp_servers:
            # With MCP servers the full toolbox is known only once they have started.
            validate_tools(names)

    def _check_settings(self) -> None:
        limit = self.tool_output_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidRequest("tool_output_limit must be a positive integer")
        if self.context_budget is not None and not isinstance(self.context_budget, ContextBudget):
            raise InvalidRequest("Host.context_budget must be a parley.ContextBudget")
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
        timeout = self.approval_timeout
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise InvalidRequest("Host.approval_timeout must be a positive number of seconds")

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
        stable = (*self.tools, *self._host_mcp_tools())
        specs = [McpServer.from_json(s) for s in contract.mcp_servers] if contract else []
        if not specs:
            return Toolset(stable=stable)
        specs = [self._admit(spec, context) for spec in specs]
        from parley.mcp.toolbox import open_toolbox

        toolbox = open_toolbox(specs, reserved=[t.declaration.name for t in stable])
        return Toolset(stable=stable, extra=tuple(toolbox.tools), close=toolbox.close)

    def close(self) -> None:
        """Stop this process's host MCP servers (they start again on next use)."""
        if self._mcp_pool is not None:
            self._mcp_pool.close()

    def _host_mcp_tools(self) -> tuple[Tool, ...]:
        if not self.mcp_servers:
            return ()
        pool = self._mcp_pool
        if pool is None:
            from parley.mcp.pool import McpPool

            pool = McpPool(self.mcp_servers)
            object.__setattr__(self, "_mcp_pool", pool)
        return pool.tools(reserved=[t.declaration.name for t in self.tools])

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


def model_from_environment(env: Mapping[str, str] = os.environ) -> Model:
    """The model ``PARLEY_MODEL`` names; a clear error when it is not set."""
    spec = env.get("PARLEY_MODEL", "").strip()
    if not spec:
        raise InvalidRequest(
            "no model: pass Host(model=...) or set PARLEY_MODEL "
            "(openai:<model>, anthropic:<model> or scripted:<path.json>)"
        )
    from parley.models.selection import model_from_spec

    return model_from_spec(spec, env)


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


def host_from_environment(env: Mapping[str, str] = os.environ) -> Host | None:
    """The host ``PARLEY_HOST`` names, else a default host around ``PARLEY_MODEL``'s
    model, else None (a client that only reads)."""
    if env.get("PARLEY_HOST"):
        return load_host(env["PARLEY_HOST"])
    if env.get("PARLEY_MODEL", "").strip():
        return Host(model=model_from_environment(env))
    return None
