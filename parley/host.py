"""What the application supplies to run turns, and how workers load it from the
environment (``PARLEY_HOST=package.module:attribute`` or ``scripted:path.json``)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from parley.errors import InvalidRequest
from parley.models.scripted import ScriptedModel
from parley.policy import ApproveAll, Policy
from parley.tools import WORKSPACE_TOOLS
from workers.budget import ContextBudget
from workers.ports import Approver, Model, Tool
from workers.ports import Policy as PolicyPort

DEFAULT_TOOL_OUTPUT_LIMIT = 20_000


@dataclass(frozen=True, kw_only=True)
class Host:
    """Model, system prompt, tools, policy, approver and hooks (SPEC §4).

    ``hooks`` is any object with some of ``before_turn``, ``before_commit``,
    ``after_commit`` and ``on_terminal``.  parley is not a policy layer: prompts, model
    choice, authorization, tool admission and credentials stay the host's."""

    model: Model
    system_prompt: str = "You are a careful assistant working in a code workspace."
    tools: Sequence[Tool] = WORKSPACE_TOOLS
    policy: PolicyPort = field(default_factory=Policy)
    approver: Approver = field(default_factory=ApproveAll)
    hooks: object | None = None
    tool_output_limit: int = DEFAULT_TOOL_OUTPUT_LIMIT
    context_budget: ContextBudget | None = None

    def __post_init__(self) -> None:
        tools = tuple(self.tools)
        object.__setattr__(self, "tools", tools)
        names = [t.declaration.name for t in tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidRequest(f"duplicate tool names: {duplicates}")
        if not callable(getattr(self.model, "stream", None)):
            raise InvalidRequest("Host.model must have a stream(request, on_delta) method")
        validate_tools = getattr(self.model, "validate_tools", None)
        if validate_tools is not None:
            validate_tools(names)
        if self.tool_output_limit < 1:
            raise InvalidRequest("tool_output_limit must be positive")
        if self.context_budget is not None and not isinstance(self.context_budget, ContextBudget):
            raise InvalidRequest("Host.context_budget must be a parley.ContextBudget")


def load_host(spec: str) -> Host:
    """Build the host named by ``spec``: ``package.module:attribute`` (a Host, or a
    function returning one) or ``scripted:path/to/script.json``."""
    if spec.startswith("scripted:"):
        return Host(model=ScriptedModel(spec.removeprefix("scripted:")))
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidRequest(
            f"PARLEY_HOST {spec!r} must be 'package.module:attribute' or 'scripted:path.json'"
        )
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise InvalidRequest(f"cannot load host {spec!r}: {exc}") from exc
    host = target() if callable(target) and not isinstance(target, Host) else target
    if not isinstance(host, Host):
        raise InvalidRequest(f"{spec!r} is a {type(host).__name__}, not a parley.Host")
    return host
