"""The contract's check: a shell command run in the session root after the model stops."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

OUTPUT_TAIL = 4000


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """Whether the check passed, and the tail of what it printed."""

    passed: bool
    exit_code: int | None  # None: it timed out, or could not start
    output: str

    def feedback(self) -> str:
        """The message the model gets when the check failed."""
        code = "did not finish" if self.exit_code is None else f"exited {self.exit_code}"
        return f"The check failed ({code}). Its output:\n{self.output}"


def run_contract_check(command: str, root: str, timeout: float) -> CheckResult:
    """Run ``command`` through the shell in ``root``; stdout and stderr are merged.

    The command is the host's or the operator's, never the model's, so a shell is what the
    contract promises (pipes, ``&&``)."""
    try:
        completed = subprocess.run(
            command,
            shell=True,
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode("utf-8", "replace")
        output += f"\n[timed out after {timeout:g} s]"
        return CheckResult(passed=False, exit_code=None, output=output[-OUTPUT_TAIL:])
    except (OSError, ValueError) as exc:
        # The session root is gone, or the machine is out of processes: a check that
        # cannot run has not passed, and says why (rather than failing the turn and
        # throwing away the answer it was to judge).
        return CheckResult(passed=False, exit_code=None, output=f"the check could not start: {exc}")
    output = completed.stdout.decode("utf-8", "replace")
    return CheckResult(
        passed=completed.returncode == 0,
        exit_code=completed.returncode,
        output=output[-OUTPUT_TAIL:],
    )
