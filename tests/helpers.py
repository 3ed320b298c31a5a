"""Test doubles that are real implementations: hosts from scripts, gated tools, and
recording models."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import parley
from parley.tools import FunctionTool
from workers.ports import ModelReply, ModelRequest, ToolContext


def scripted_host(rules: list[dict[str, Any]], **host_options: Any) -> parley.Host:
    """A host whose model follows ``rules``."""
    tools = host_options.pop("tools", None)
    model = parley.models.ScriptedModel({"rules": rules})
    if tools is None:
        return parley.Host(model=model, **host_options)
    return parley.Host(model=model, tools=tools, **host_options)


class Gate:
    """A tool that blocks until the test opens it, so a test can act while a step's tool
    round is in flight (between the model call and the step commit)."""

    def __init__(self, name: str = "wait_for_gate") -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.calls = 0
        self.tool = FunctionTool(
            name=name,
            description="Blocks until released by the test.",
            parameters={"type": "object", "properties": {}},
            function=self._run,
        )

    def _run(self, _arguments: dict[str, Any], _context: ToolContext) -> str:
        self.calls += 1
        self.entered.set()
        if not self.opened.wait(30):
            raise TimeoutError("the test never opened the gate")
        return "gate opened"

    def wait_entered(self) -> None:
        """Block until a step is inside the tool."""
        assert self.entered.wait(30), "the turn never reached the gate"


class RecordingModel:
    """Wraps a model and keeps every request it was sent."""

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
