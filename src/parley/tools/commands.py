"""The built-in ``run_command`` tool: run one program, by argv, in the session root.

Never through a shell: the argv goes to ``exec`` as is, so ``;``, ``|``, ``$(…)`` and
globs are plain characters of an argument.  The call's access is
``Access(mode="execute", path=shlex.join(argv))``: the default :class:`parley.Policy`
executes nothing, and ``allow_execute`` globs name the command lines a host permits
(``["pytest", "pytest **", "git status"]``).  Allowing an interpreter (``python **``,
``sh **``) allows everything it can do: the root confines the working directory, not the
process.

The tool is not in ``WORKSPACE_TOOLS``: a host adds it (``tools=[*WORKSPACE_TOOLS,
run_command]``) and allows commands in its policy, two deliberate steps, so a host whose
own policy does not know ``execute`` accesses never runs a program by accident.

Bounded: a timeout (default 30 s, at most :data:`MAX_TIMEOUT`), after which the whole
process group (the command and anything it started) is killed; output capture (stdout
and stderr merged, first and last part kept, the cut marked); no stdin.  The command's
environment is a small allow-list of the worker's (``PATH``, ``HOME``, locale, …), not
all of it, so credentials in the worker's environment do not reach a command the model
chose; :func:`command_tool` builds a variant with another environment or limits.
POSIX only (process groups).
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from parley.errors import InvalidRequest
from parley.ports.host import Access, ToolContext
from parley.tools.base import FunctionTool
from parley.workspace import confine, relative

DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 600.0
OUTPUT_LIMIT = 16_000
KILL_GRACE_SECONDS = 2.0
PASSED_ENVIRONMENT = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
)


def command_line(argv: list[str]) -> str:
    """What the policy matches for an argv: the shell-quoted command line, so
    ``["ls", "a b"]`` is ``ls 'a b'`` and no argument can pose as two."""
    return shlex.join(argv)


class _Capture:
    """Drains a pipe to its end, keeping the first and the last ``limit // 2`` bytes."""

    def __init__(self, stream: io.BufferedReader, limit: int) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self._half = max(1, limit // 2)
        self._stream = stream
        # Draining to the end (even past the cap) keeps a chatty command from blocking
        # on a full pipe; a thread because the main thread waits on the timeout.
        self._thread = threading.Thread(target=self._drain, name="run_command-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while chunk := self._stream.read1(65536):
                self.total += len(chunk)
                room = self._half - len(self.head)
                if room > 0:
                    self.head += chunk[:room]
                    chunk = chunk[room:]
                if chunk:
                    self.tail += chunk
                    if len(self.tail) > 2 * self._half:
                        del self.tail[: len(self.tail) - self._half]
        except (OSError, ValueError):
            pass  # the pipe broke: what was read is what there is
        finally:
            self._stream.close()

    def join(self, timeout: float) -> bool:
        """Wait for the end of the output; False if something still holds the pipe."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def text(self) -> str:
        """The captured output, with a marker where the middle was cut."""
        tail = bytes(self.tail[-self._half :]) if self.tail else b""
        omitted = self.total - len(self.head) - len(tail)
        if omitted <= 0:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", errors="replace")
        return (
            bytes(self.head).decode("utf-8", errors="replace")
            + f"\n[… output truncated: {omitted} of {self.total} bytes omitted …]\n"
            + tail.decode("utf-8", errors="replace")
        )


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    # Gone already is fine: the point is that nothing of the group is left.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@dataclass(frozen=True)
class _CommandRunner:
    """What ``run_command`` does with one call's arguments, under a variant's settings."""

    default_timeout: float
    output_limit: int
    environment: dict[str, str] | None  # None: the worker's allow-listed variables

    def __call__(self, arguments: dict[str, Any], context: ToolContext) -> str:
        argv: list[str] = arguments["argv"]
        timeout = float(arguments.get("timeout") or self.default_timeout)
        cwd = confine(context.root, arguments.get("cwd") or ".")
        if not cwd.is_dir():
            raise InvalidRequest(f"run_command: cwd {arguments.get('cwd')!r} is not a directory")
        started = time.monotonic()
        process = self._start(argv, cwd)
        capture = _Capture(cast(io.BufferedReader, process.stdout), self.output_limit)
        timed_out = _wait_and_reap(process, capture, timeout)
        elapsed = time.monotonic() - started
        where = relative(context.root, arguments.get("cwd") or ".")
        header = f"$ {command_line(argv)}" + ("" if where == "." else f"  (in {where})")
        if timed_out:
            status = f"[timed out after {timeout:g} s; the process group was killed]"
        elif process.returncode < 0:
            status = f"[killed by signal {-process.returncode} after {elapsed:.1f} s]"
        else:
            status = f"[exit code {process.returncode}]"
        output = capture.text()
        # The status goes first so that no later cap (the host's tool_output_limit) can
        # cut it off.
        return "\n".join(part for part in (status, header, output.rstrip("\n")) if part)

    def _start(self, argv: list[str], cwd: Path) -> subprocess.Popen[bytes]:
        if self.environment is None:
            env = {k: os.environ[k] for k in PASSED_ENVIRONMENT if k in os.environ}
        else:
            env = self.environment
        try:
            return subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a kill reaches its children
                shell=False,
            )
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"command not found: {argv[0]!r}") from exc
        except PermissionError as exc:
            raise PermissionError(f"cannot execute {argv[0]!r}: permission denied") from exc


def _wait_and_reap(process: subprocess.Popen[bytes], capture: _Capture, timeout: float) -> bool:
    """Wait for the command up to ``timeout`` (then TERM, then KILL its group); whether it
    timed out."""
    timed_out = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=KILL_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid, signal.SIGKILL)
            process.wait()
    finally:
        # Nothing the call started outlives it (a step may be redone after a crash,
        # and a stray server would hold the pipe open): end the rest of the group.
        _kill_group(process.pid, signal.SIGKILL)
        # The reader closes the pipe at its end.  Only a process that left the group
        # (setsid) can still hold it open; the daemon reader then ends when it does.
        capture.join(KILL_GRACE_SECONDS)
    return timed_out


def _parameters(default_timeout: float, max_timeout: float) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "argv": {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "minItems": 1,
                "description": 'the program and its arguments, e.g. ["pytest", "-q"]',
            },
            "cwd": {
                "type": "string",
                "description": "working directory relative to the root (default: the root)",
            },
            "timeout": {
                "type": "number",
                "minimum": 1,
                "maximum": max_timeout,
                "description": f"seconds before the command is killed "
                f"(default {default_timeout:g})",
            },
        },
        "required": ["argv"],
        "additionalProperties": False,
    }


def _access(arguments: dict[str, Any]) -> tuple[Access, ...]:
    return (Access(mode="execute", path=command_line(arguments["argv"])),)


def command_tool(
    *,
    name: str = "run_command",
    environment: Mapping[str, str] | None = None,
    default_timeout: float = DEFAULT_TIMEOUT,
    max_timeout: float = MAX_TIMEOUT,
    output_limit: int = OUTPUT_LIMIT,
) -> FunctionTool:
    """A ``run_command`` tool with other settings: ``environment`` replaces the default
    allow-list (pass ``os.environ`` to inherit everything), and the limits.  The host's
    policy still decides which command lines run."""
    if not 0 < default_timeout <= max_timeout:
        raise InvalidRequest("command_tool: need 0 < default_timeout <= max_timeout")
    if output_limit < 2:
        raise InvalidRequest("command_tool: output_limit must be at least 2 bytes")
    runner = _CommandRunner(
        default_timeout=default_timeout,
        output_limit=output_limit,
        environment=None if environment is None else dict(environment),
    )
    return FunctionTool(
        name=name,
        description=(
            "Run one program in the workspace, without a shell: argv[0] is the program, "
            "the rest its arguments, exactly as given (no pipes, redirections, globs or "
            "variables). Reports the exit code and the combined stdout and stderr. Only "
            "command lines the host's policy allows can run."
        ),
        parameters=_parameters(default_timeout, max_timeout),
        function=runner,
        access=_access,
    )


run_command = command_tool()
