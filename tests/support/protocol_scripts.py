"""The scripted turns the MCP and A2A protocol tests run: a streamed reply, a slow one to
cancel, a call the policy asks about (an approval through the protocol's input-required
state), and an echo for the rest."""

from __future__ import annotations

from typing import Any

STREAM_TEXT = "".join(f"word{i} " for i in range(30))
STREAM: dict[str, Any] = {
    "when": "^stream",
    "steps": [{"text": STREAM_TEXT, "chunk_chars": 6, "delay_ms": 20}],
}
SLOW: dict[str, Any] = {
    "when": "^slow",
    "steps": [{"text": "".join(f"s{i} " for i in range(400)), "chunk_chars": 3, "delay_ms": 50}],
}
RECORD: dict[str, Any] = {
    "when": "^record",
    "steps": [{"tool_calls": [{"name": "record_call", "arguments": {}}]}, {"text": "recorded."}],
}
ECHO: dict[str, Any] = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
RULES = [STREAM, SLOW, RECORD, ECHO]
