"""The host's boundary for tool calls: path globs per access mode, denied tools, and the
approver that has the last word.  Steers never change any of it: steering is text, not
authorization."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from parley.errors import InvalidRequest
from parley.globs import glob_match
from parley.ports.host import Access, ApprovalRequest, Ask, PolicyPort, Refusal
from parley.workspace import confine, relative

GLOB_CHARS = ("*", "?")
_NAMED_RULES = {
    "execute": ("allow_execute", "executing"),
    "mcp": ("allow_mcp", "calling the MCP tool"),
    "mcp_server": ("allow_mcp_servers", "starting the MCP server"),
}
"""Access modes judged by one allow-list of globs each (not by path rules)."""
MAX_GLOB_FILES = 50_000


@dataclass(frozen=True, kw_only=True)
class Policy:
    """Allow/deny globs (relative to the session root) for reads and writes, the commands
    that may be executed, and tools denied outright.  Deny rules win over allow rules;
    a path outside the root is always refused (rule ``root``).

    The default allows reading and writing anywhere inside the root, executes nothing,
    calls no MCP tool and starts no MCP server a contract names.

    An ``execute`` access names a command line (``shlex.join`` of the argv for
    ``run_command``); ``allow_execute`` globs match it in the same dialect as paths, so
    ``*`` stops at a ``/`` and ``**`` does not: ``["pytest", "pytest **", "git status"]``.

    An ``mcp`` access names a server's tool as ``<server>/<tool>`` (``allow_mcp``:
    ``["github/*", "search/query"]``); an ``mcp_server`` access names the command line or
    URL of a server a turn's contract asks to start (``allow_mcp_servers``).  Each has its
    own rule so that no glob meant for one kind of thing admits another.

    A ``read`` access whose path holds ``*`` or ``?`` (``search_files`` declares one) is a
    glob: it reads every file below the root that matches it, and each of those that
    exists now is judged like a read of that file (files reachable only through a symlink
    out of the root are skipped: no confined tool reads them).  A glob over more than
    ``MAX_GLOB_FILES`` files is refused when anything could be denied.

    ``guard_git`` (on by default, whatever the write rules) refuses writes into a ``.git``
    directory or file: a hook or a config line such as ``core.fsmonitor`` written there
    would run with the next git command, so ``allow_execute=["git status"]`` would grant
    any code.  An allowed command that runs the workspace's own code (``pytest``,
    ``make``) runs whatever the model wrote: see ``docs/agents.md`` on ``run_command``.
    """

    allow_read: Sequence[str] = ("**",)
    deny_read: Sequence[str] = ()
    allow_write: Sequence[str] = ("**",)
    deny_write: Sequence[str] = ()
    allow_execute: Sequence[str] = ()
    allow_mcp: Sequence[str] = ()
    allow_mcp_servers: Sequence[str] = ()
    deny_tools: Sequence[str] = ()
    guard_git: bool = True
    ask_read: Sequence[str] = ()
    ask_write: Sequence[str] = ()
    ask_execute: Sequence[str] = ()
    ask_tools: Sequence[str] = ()
    ask_mcp: Sequence[str] = ()
    read_only_tools: Sequence[str] = ("read_file", "list_files", "search_files")
    """Tools that only read: a ``recorded`` replay runs such a call when the original
    made none like it, and answers any other unmatched call without running it
    (docs/replay.md)."""

    def __post_init__(self) -> None:
        for name in (
            "allow_read",
            "deny_read",
            "allow_write",
            "deny_write",
            "allow_execute",
            "allow_mcp",
            "allow_mcp_servers",
            "deny_tools",
            "ask_read",
            "ask_write",
            "ask_execute",
            "ask_tools",
            "ask_mcp",
            "read_only_tools",
        ):
            value = getattr(self, name)
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise InvalidRequest(f"Policy.{name} must be a list of glob strings, not {value!r}")
            object.__setattr__(self, name, tuple(value))
        if not isinstance(self.guard_git, bool):
            raise InvalidRequest(f"Policy.guard_git must be True or False, not {self.guard_git!r}")

    def check(self, tool: str, accesses: Sequence[Access], root: str) -> Refusal | Ask | None:
        """None if the call may run, the refusal naming the rule, or :class:`Ask` naming
        the ``ask_*`` rule that wants a person's answer first.  A refusal wins over an
        ask: every access is judged by the other rules before any ask rule is looked at.
        An ``ask_execute`` or ``ask_mcp`` glob also admits what it matches (asking is a
        way of allowing), as ``allow_execute`` and ``allow_mcp`` do."""
        if tool in self.deny_tools:
            return Refusal(rule=f"deny_tools:{tool}", reason=f"the tool {tool!r} is denied")
        for access in accesses:
            refusal = self._check_access(access, root)
            if refusal is not None:
                return refusal
        return self._asks(tool, accesses, root)

    def _asks(self, tool: str, accesses: Sequence[Access], root: str) -> Ask | None:
        """The first ask rule the call matches, if any."""
        if tool in self.ask_tools:
            return Ask(rule=f"ask_tools:{tool}", reason=f"the tool {tool!r} asks first")
        for access in accesses:
            globs: Sequence[str] = getattr(self, f"ask_{access.mode}", ())
            path = access.path
            if access.mode in ("read", "write"):
                try:
                    path = relative(root, access.path)
                except InvalidRequest:
                    continue  # refused above already
            for pattern in globs:
                if glob_match(pattern, path):
                    return Ask(
                        rule=f"ask_{access.mode}:{pattern}",
                        reason=f"{access.mode} of {path!r} asks first ({pattern!r})",
                    )
        return None

    def _check_access(self, access: Access, root: str) -> Refusal | None:
        allowed = _NAMED_RULES.get(access.mode)
        if allowed is not None:
            rule, verb = allowed
            asking: Sequence[str] = getattr(self, f"ask_{access.mode}", ())
            if any(glob_match(g, access.path) for g in (*getattr(self, rule), *asking)):
                return None
            return Refusal(rule=rule, reason=f"{verb} {access.path!r} is not allowed by the policy")
        if access.mode == "read" and any(c in access.path for c in GLOB_CHARS):
            if os.path.lexists(os.path.join(root, access.path)):
                # Also a name that exists as written (a symlink called `s?`, say): a tool
                # that opens it literally reads where it leads, which the glob's walk,
                # following no symlinked directory, would not see.
                refusal = self._check_path("read", access.path, root)
                if refusal is not None:
                    return refusal
            return self._check_read_glob(access.path, root)
        return self._check_path(access.mode, access.path, root)

    def _check_path(self, mode: str, given: str, root: str) -> Refusal | None:
        try:
            path = relative(root, given)
        except InvalidRequest as exc:
            return Refusal(rule="root", reason=str(exc))
        return self._judge(mode, path)

    def _judge(self, mode: str, path: str) -> Refusal | None:
        """The rules for ``path``, already confined and relative to the root."""
        if mode == "write" and self.guard_git and _in_git_directory(path):
            return Refusal(
                rule="guard_git",
                reason=f"write of {path!r} is refused: git runs what its config and hooks "
                "name, so any allowed git command would run it",
            )
        deny = self.deny_read if mode == "read" else self.deny_write
        allow = self.allow_read if mode == "read" else self.allow_write
        for pattern in deny:
            if glob_match(pattern, path):
                return Refusal(
                    rule=f"deny_{mode}:{pattern}",
                    reason=f"{mode} of {path!r} is denied by {pattern!r}",
                )
        if not any(glob_match(pattern, path) for pattern in allow):
            return Refusal(rule=f"allow_{mode}", reason=f"{mode} of {path!r} is not allowed")
        return None

    def _check_read_glob(self, given: str, root: str) -> Refusal | None:
        """Judge a read of every existing file matching the glob ``given``."""
        segments = [s for s in given.split("/") if s not in ("", ".")]
        if given.startswith("/") or ".." in segments:
            return Refusal(rule="root", reason=f"the glob {given!r} leaves the session root")
        prefix = _literal_prefix(segments)
        try:
            start = confine(root, prefix or ".")
        except InvalidRequest as exc:
            return Refusal(rule="root", reason=str(exc))
        if not self.deny_read and "**" in self.allow_read:
            return None  # every file inside the root is readable: nothing to enumerate
        for real in _glob_matches(root, start, prefix, "/".join(segments)):
            if real is None:
                return Refusal(
                    rule="read_glob_limit",
                    reason=f"the read of {given!r} covers more than {MAX_GLOB_FILES} "
                    "files to check; narrow it",
                )
            refusal = self._judge("read", real)
            if refusal is not None:
                return refusal
        return None


def _literal_prefix(segments: list[str]) -> str:
    """The glob's leading segments that hold no glob character."""
    literal: list[str] = []
    for segment in segments:
        if any(c in segment for c in GLOB_CHARS):
            break
        literal.append(segment)
    return "/".join(literal)


def _glob_matches(root: str, start: Path, prefix: str, pattern: str) -> Iterator[str | None]:
    """The real name (relative to the root) of each file under ``start`` that ``pattern``
    matches; None once more than :data:`MAX_GLOB_FILES` files were walked."""
    base = confine(root, ".")
    walked = 0
    # A file is matched under the name the call used (through the glob's literal
    # prefix, which may be a symlinked directory) and judged under its real name.
    # os.walk from the resolved start follows no symlinked directory, so the real
    # name is the walked one, unless the file itself is a symlink.
    for directory, subdirs, files in os.walk(start):
        subdirs.sort()
        below = os.path.relpath(directory, start).replace(os.sep, "/")
        real_directory = os.path.relpath(directory, base).replace(os.sep, "/")
        for name in sorted(files):
            walked += 1
            if walked > MAX_GLOB_FILES:
                yield None
                return
            path = "/".join(p for p in (prefix, below, name) if p not in ("", "."))
            if not glob_match(pattern, path):
                continue
            if os.path.islink(os.path.join(directory, name)):
                try:
                    yield relative(root, path)
                except InvalidRequest:
                    continue  # out of the root: no confined tool reads it
            else:
                yield name if real_directory == "." else f"{real_directory}/{name}"


def _in_git_directory(path: str) -> bool:
    return ".git" in path.split("/")


@dataclass(frozen=True)
class NarrowedPolicy:
    """A child's policy: its parent's with the child's own on top (docs/sub-agents.md).
    A call runs only if both let it; either's refusal refuses it (the parent's is
    named first), and either's ask asks.  A child can narrow its parent, never widen it."""

    parent: PolicyPort
    own: PolicyPort

    def check(self, tool: str, accesses: Sequence[Access], root: str) -> Refusal | Ask | None:
        """The parent's refusal, else the child's own, else either's ask, else None."""
        outer = self.parent.check(tool, accesses, root)
        if isinstance(outer, Refusal):
            return outer
        inner = self.own.check(tool, accesses, root)
        if isinstance(inner, Refusal):
            return inner
        return outer or inner


class ApproveAll:
    """An approver that approves every call the policy allowed (calls the policy asks
    about still wait for a person)."""

    def approve(self, request: ApprovalRequest) -> bool:
        """Always true."""
        return True


class AskAlways:
    """An approver that has a person answer every call the policy allowed."""

    def approve(self, request: ApprovalRequest) -> Ask:
        """Always :class:`Ask`."""
        return Ask(rule="approver", reason="the host asks a person about every call")
