"""The scripted model (docs/agents.md#the-scripted-model): answers from a JSON script
instead of a network.

Stateless and deterministic: the answer depends on the request alone, so any worker
process — including one that took over after a crash — gives the same answer.  The rule
is the first whose ``when`` regex matches the turn's prompt; the step is the number of
assistant messages after that prompt (the rule's last step repeats once exhausted).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.errors import InvalidRequest
from parley.models.completion import estimate_usage
from parley.ports.host import DeltaSink, ModelReply, ModelRequest
from parley.schemas.messages import AssistantMessage, ToolCall, UserMessage
from parley.schemas.records import Usage

DEFAULT_CHUNK_CHARS = 16
MAX_DELAY_MS = 60_000
"""A scripted delay between chunks is at most a minute (a script stands in for a model)."""
PLACEHOLDER = re.compile(r"\{(prompt|last_message)\}")


@dataclass(frozen=True, kw_only=True)
class ScriptedCall:
    """A tool call a scripted step makes; ``arguments`` is sent verbatim if a string."""

    name: str
    arguments: dict[str, Any] | str


@dataclass(frozen=True, kw_only=True)
class ScriptedStep:
    """One scripted answer."""

    text: str = ""
    tool_calls: tuple[ScriptedCall, ...] = ()
    chunk_chars: int = DEFAULT_CHUNK_CHARS
    delay_ms: float = 0.0
    usage: Usage | None = None


@dataclass(frozen=True, kw_only=True)
class ScriptedRule:
    """A regex over the turn's prompt and the steps it answers with."""

    when: re.Pattern[str]
    steps: tuple[ScriptedStep, ...]


class ScriptedModel:
    """A model that follows a script (a parsed JSON object, or a path to one)."""

    def __init__(self, script: dict[str, Any] | str | Path, *, name: str = "scripted") -> None:
        self._name = name
        self.rules = _parse_script(_load(script))

    @property
    def name(self) -> str:
        """The label stored with each step."""
        return self._name

    def tool_names(self) -> set[str]:
        """Every tool the script calls."""
        return {c.name for r in self.rules for s in r.steps for c in s.tool_calls}

    def validate_tools(self, available: Collection[str]) -> None:
        """Refuse a script that calls a tool the host does not have."""
        unknown = sorted(self.tool_names() - set(available))
        if unknown:
            raise InvalidRequest(
                f"the script calls unknown tool(s) {unknown}; the host has {sorted(available)}"
            )

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        """Answer with the scripted step for this request, streaming its text in chunks."""
        prompt, index, last_message = _position(request)
        rule = next((r for r in self.rules if r.when.search(prompt)), None)
        if rule is None:
            raise InvalidRequest(f"no script rule matches the prompt {prompt[:80]!r}")
        step = rule.steps[min(index, len(rule.steps) - 1)]
        # One pass, so text substituted in is never substituted again.
        values = {"prompt": prompt, "last_message": last_message}
        text = PLACEHOLDER.sub(lambda match: values[match.group(1)], step.text)
        for start in range(0, len(text), step.chunk_chars):
            if step.delay_ms and start:
                time.sleep(step.delay_ms / 1000)
            on_delta(text[start : start + step.chunk_chars])
        calls = tuple(
            ToolCall(
                id=f"call_{index}_{position}",
                name=call.name,
                arguments=call.arguments
                if isinstance(call.arguments, str)
                else json.dumps(call.arguments, sort_keys=True),
            )
            for position, call in enumerate(step.tool_calls)
        )
        usage = step.usage or estimate_usage(request, text, calls)
        return ModelReply(text=text, tool_calls=calls, usage=usage, model=self._name)


def _position(request: ModelRequest) -> tuple[str, int, str]:
    """The turn's prompt, how many assistant messages follow it, the newest user text."""
    messages = request.messages
    start = max(
        (i for i, m in enumerate(messages) if isinstance(m, UserMessage) and m.origin == "prompt"),
        default=None,
    )
    if start is None:
        raise InvalidRequest("the request has no prompt")
    prompt = messages[start]
    assert isinstance(prompt, UserMessage)
    index = sum(1 for m in messages[start + 1 :] if isinstance(m, AssistantMessage))
    last = next(m for m in reversed(messages) if isinstance(m, UserMessage))
    return prompt.text, index, last.text


def _load(script: dict[str, Any] | str | Path) -> Any:
    if isinstance(script, dict):
        return script
    if not isinstance(script, str | Path) or not str(script):
        raise InvalidRequest(
            f"a script is its parsed JSON (a dict) or the path of a JSON file, not {script!r}"
        )
    path = Path(script)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidRequest(f"cannot read script {str(path)!r}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"script {str(path)!r} is not UTF-8: {exc.reason}") from exc
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"script {str(path)!r} is not valid JSON: {exc}") from exc


def _parse_script(data: Any) -> tuple[ScriptedRule, ...]:
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list) or not data["rules"]:
        raise InvalidRequest('a script is an object with a non-empty "rules" list')
    return tuple(_parse_rule(rule, n) for n, rule in enumerate(data["rules"]))


def _parse_rule(rule: Any, n: int) -> ScriptedRule:
    where = f"rules[{n}]"
    if not isinstance(rule, dict) or not isinstance(rule.get("when"), str):
        raise InvalidRequest(f'{where}: needs a "when" regex string')
    unknown = set(rule) - {"when", "steps"}
    if unknown:
        raise InvalidRequest(f"{where}: unknown keys {sorted(unknown)}")
    try:
        when = re.compile(rule["when"])
    except re.error as exc:
        raise InvalidRequest(f"{where}.when: bad regex: {exc}") from exc
    steps = rule.get("steps")
    if not isinstance(steps, list) or not steps:
        raise InvalidRequest(f'{where}: needs a non-empty "steps" list')
    return ScriptedRule(
        when=when, steps=tuple(_parse_step(s, f"{where}.steps[{i}]") for i, s in enumerate(steps))
    )


def _parse_step(step: Any, where: str) -> ScriptedStep:
    if not isinstance(step, dict):
        raise InvalidRequest(f"{where}: a step is an object")
    unknown = set(step) - {"text", "tool_calls", "chunk_chars", "delay_ms", "usage"}
    if unknown:
        raise InvalidRequest(f"{where}: unknown keys {sorted(unknown)}")
    text = step.get("text", "")
    chunk = step.get("chunk_chars", DEFAULT_CHUNK_CHARS)
    delay = step.get("delay_ms", 0)
    if not isinstance(text, str):
        raise InvalidRequest(f"{where}.text: a string")
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise InvalidRequest(f"{where}.chunk_chars: a positive integer")
    if (
        not isinstance(delay, int | float)
        or isinstance(delay, bool)
        or not 0 <= delay <= MAX_DELAY_MS  # (NaN fails both)
    ):
        raise InvalidRequest(f"{where}.delay_ms: a number of milliseconds, 0 to {MAX_DELAY_MS}")
    calls = _parse_calls(step.get("tool_calls", []), where)
    usage = _parse_usage(step["usage"], where) if "usage" in step else None
    return ScriptedStep(
        text=text, tool_calls=tuple(calls), chunk_chars=chunk, delay_ms=float(delay), usage=usage
    )


def _parse_calls(raw_calls: Any, where: str) -> list[ScriptedCall]:
    if not isinstance(raw_calls, list):
        raise InvalidRequest(f"{where}.tool_calls: a list")
    calls = []
    for i, call in enumerate(raw_calls):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            raise InvalidRequest(f"{where}.tool_calls[{i}]: needs a tool name")
        if set(call) - {"name", "arguments"}:
            raise InvalidRequest(
                f"{where}.tool_calls[{i}]: unknown keys {sorted(set(call) - {'name', 'arguments'})}"
            )
        arguments = call.get("arguments", {})
        if not isinstance(arguments, dict | str):
            raise InvalidRequest(f"{where}.tool_calls[{i}].arguments: an object or a raw string")
        calls.append(ScriptedCall(name=call["name"], arguments=arguments))
    return calls


def _parse_usage(raw_usage: Any, where: str) -> Usage:
    counts = ("input_tokens", "output_tokens", "cached_tokens")
    if (
        not isinstance(raw_usage, dict)
        or not all(
            isinstance(raw_usage.get(k, 0), int)
            and not isinstance(raw_usage.get(k, 0), bool)
            and raw_usage.get(k, 0) >= 0
            for k in counts
        )
        or set(raw_usage) - set(counts)
    ):
        raise InvalidRequest(f"{where}.usage: an object of non-negative token counts {counts}")
    return Usage.from_json(raw_usage)
