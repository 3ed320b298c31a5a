"""Test-side controls for :mod:`tests.support.hosts` and in-process test doubles."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import parley
from parley.ports.host import ModelReply, ModelRequest
from tests.support.hosts import control_dir
from tests.support.waiting import wait_until


class Control:
    """Writes what ``workspace_host`` does for this test's workspace, and reads back what
    its model was asked."""

    def __init__(self, workspace: Path) -> None:
        self.dir = control_dir(workspace)
        self.dir.mkdir(parents=True, exist_ok=True)

    def script(self, rules: list[dict[str, Any]]) -> None:
        """The rules the model answers with."""
        (self.dir / "script.json").write_text(json.dumps({"rules": rules}))

    def fail_model(self, message: str, *, after: str = "") -> None:
        """Make every model call raise (having streamed ``after`` first, if given)."""
        script = {"fail": message, "fail_after": after, "rules": []}
        (self.dir / "script.json").write_text(json.dumps(script))

    def policy(self, **options: Any) -> None:
        """``parley.Policy`` arguments for every later check."""
        (self.dir / "policy.json").write_text(json.dumps(options))

    def requests(self) -> list[dict[str, Any]]:
        """Every request the model was sent, oldest first."""
        path = self.dir / "requests.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def user_texts(self, request: dict[str, Any], origin: str | None = None) -> list[str]:
        """The user messages of a recorded request (of one origin, if given)."""
        return [
            m["text"]
            for m in request["messages"]
            if m["role"] == "user" and (origin is None or m["origin"] == origin)
        ]

    # --------------------------------------------------------------- the gate tool

    def wait_entered(self, timeout: float = 30, gate: str = "gate") -> None:
        """Block until a step is inside ``wait_for_gate`` (or another ``gate``)."""
        entered = self.dir / f"{gate}-entered"
        wait_until(entered.exists, timeout, what=f"the turn to reach the {gate}")

    def open_gate(self, pid: int | None = None, gate: str = "gate") -> None:
        """Let every ``wait_for_gate`` call return (or only those of process ``pid``)."""
        (self.dir / (f"{gate}-open" if pid is None else f"{gate}-open-{pid}")).touch()

    def entered_by(self, gate: str = "gate") -> set[int]:
        """The processes that have entered the gate."""
        return {int(p.name.rsplit("-", 1)[1]) for p in self.dir.glob(f"{gate}-entered-*")}

    def recorded_calls(self) -> list[int]:
        """The pids that ran ``record_call``, in order."""
        path = self.dir / "record-calls"
        return [int(line) for line in path.read_text().splitlines()] if path.exists() else []

    def recorded_notes(self) -> list[str]:
        """The ``note`` of each ``record_call`` that had one, in order."""
        path = self.dir / "record-notes"
        return path.read_text().splitlines() if path.exists() else []

    def use_openai(self, base_url: str) -> None:
        """Send every later model request to the OpenAI-compatible server at
        ``base_url`` instead of following the script."""
        (self.dir / "openai.json").write_text(json.dumps({"base_url": base_url}))

    def reset_gate(self) -> None:
        """Close the gate again for the next turn."""
        for path in self.dir.glob("gate-*"):
            if path.name != "gate-calls":
                path.unlink()

    @property
    def gate_calls(self) -> int:
        """How many times the gate tool ran, in any process."""
        path = self.dir / "gate-calls"
        return len(path.read_text().splitlines()) if path.exists() else 0


def scripted_host(rules: list[dict[str, Any]], **host_options: Any) -> parley.Host:
    """An in-process host whose model follows ``rules`` (for embedded-only tests)."""
    model = parley.models.ScriptedModel({"rules": rules})
    return parley.Host(model=model, **host_options)


class RecordingModel:
    """Wraps a model and keeps every request it was sent (in-process only)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[ModelRequest] = []
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return str(self.inner.name)

    def stream(self, request: ModelRequest, on_delta: Callable[[str], None]) -> ModelReply:
        with self._lock:
            self.requests.append(request)
        reply: ModelReply = self.inner.stream(request, on_delta)
        return reply

    def validate_tools(self, names: Any) -> None:
        validate = getattr(self.inner, "validate_tools", None)
        if validate is not None:
            validate(names)
