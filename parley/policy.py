"""The host's boundary for tool calls: path globs per access mode, denied tools, and the
approver that has the last word.  Steers never change any of it (SPEC §2.10)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parley.errors import InvalidRequest
from parley.globs import glob_match
from parley.workspace import relative
from workers.ports import Access, ApprovalRequest, Refusal


@dataclass(frozen=True, kw_only=True)
class Policy:
    """Allow/deny globs (relative to the session root) for reads and writes, the commands
    that may be executed, and tools denied outright.  Deny rules win over allow rules;
    a path outside the root is always refused (rule ``root``).

    The default allows reading and writing anywhere inside the root and executes nothing.
    """

    allow_read: Sequence[str] = ("**",)
    deny_read: Sequence[str] = ()
    allow_write: Sequence[str] = ("**",)
    deny_write: Sequence[str] = ()
    allow_execute: Sequence[str] = ()
    deny_tools: Sequence[str] = ()

    def __post_init__(self) -> None:
        for name in (
            "allow_read",
            "deny_read",
            "allow_write",
            "deny_write",
            "allow_execute",
            "deny_tools",
        ):
            value = getattr(self, name)
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise InvalidRequest(f"Policy.{name} must be a list of glob strings, not {value!r}")
            object.__setattr__(self, name, tuple(value))

    def check(self, tool: str, accesses: Sequence[Access], root: str) -> Refusal | None:
        """None if the call may run, else the refusal naming the rule."""
        if tool in self.deny_tools:
            return Refusal(rule=f"deny_tools:{tool}", reason=f"the tool {tool!r} is denied")
        for access in accesses:
            refusal = self._check_access(access, root)
            if refusal is not None:
                return refusal
        return None

    def _check_access(self, access: Access, root: str) -> Refusal | None:
        if access.mode == "execute":
            if any(glob_match(g, access.path) for g in self.allow_execute):
                return None
            return Refusal(
                rule="allow_execute",
                reason=f"executing {access.path!r} is not allowed by the policy",
            )
        try:
            path = relative(root, access.path)
        except InvalidRequest as exc:
            return Refusal(rule="root", reason=str(exc))
        deny = self.deny_read if access.mode == "read" else self.deny_write
        allow = self.allow_read if access.mode == "read" else self.allow_write
        for pattern in deny:
            if glob_match(pattern, path):
                return Refusal(
                    rule=f"deny_{access.mode}:{pattern}",
                    reason=f"{access.mode} of {path!r} is denied by {pattern!r}",
                )
        if not any(glob_match(pattern, path) for pattern in allow):
            return Refusal(
                rule=f"allow_{access.mode}", reason=f"{access.mode} of {path!r} is not allowed"
            )
        return None


class ApproveAll:
    """An approver that approves every call the policy allowed."""

    def approve(self, request: ApprovalRequest) -> bool:
        """Always true."""
        return True
