"""The host the soak's workers load (``PARLEY_HOST=tests.soak.host:soak_host``): a scripted
model whose rules give each kind of turn the soak mixes its shape, and two tools that
append to a ledger file, so the checker can prove no tool call ran again after its step
committed.

The ledger (``$PARLEY_SOAK_DIR/ledger.jsonl``) gets one JSON line per call, written with
one ``write`` on a descriptor opened ``O_APPEND``: lines from every thread of every worker
process land whole, and a SIGKILL cannot tear one (the kernel has it once ``write``
returns)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import parley
from parley.models import ScriptedModel
from parley.ports.host import ToolContext
from parley.tools import FunctionTool

LEDGER = "ledger"
APPROVED_LEDGER = "approved_ledger"
"""The tool a person must approve: the policy asks about every call of it."""

INTERRUPT_STEPS = 6
"""How many tool steps an interrupted turn would take if nobody stopped it."""


def _stream(text: str, delay_ms: int) -> dict[str, Any]:
    return {"text": text, "chunk_chars": 8, "delay_ms": delay_ms}


def _ledger_step(
    mark: str, *, tool: str = LEDGER, text: str = "", delay_ms: int = 0
) -> dict[str, Any]:
    return {
        "text": text,
        "chunk_chars": 8,
        "delay_ms": delay_ms,
        "tool_calls": [{"name": tool, "arguments": {"mark": mark}}],
    }


SCRIPT: dict[str, Any] = {
    "rules": [
        # A one-step reply, streamed in a few tokens.
        {"when": "^reply ", "steps": [_stream("Here is the answer to {prompt}.", 15)]},
        # A turn of tool steps: two ledger calls, then the answer.
        {
            "when": "^tools ",
            "steps": [
                _ledger_step("t0", text="Let me look.", delay_ms=10),
                _ledger_step("t1"),
                _stream("Both calls are done.", 10),
            ],
        },
        # A call a person approves (or denies), then the answer.
        {
            "when": "^approve ",
            "steps": [
                _ledger_step("a0", tool=APPROVED_LEDGER, text="This needs a yes."),
                _stream("The approved call is done.", 10),
            ],
        },
        # Streams for about a second before its boundary, so a say lands during the
        # stream; the next step answers with what it heard.
        {
            "when": "^steer ",
            "steps": [
                _ledger_step("s0", text="Thinking about it at some length now. " * 3, delay_ms=60),
                _stream("heard: {last_message}", 10),
            ],
        },
        # Many slow tool steps: an interrupt stops it between two, a resume goes on.
        {
            "when": "^interrupt ",
            "steps": [
                *(
                    _ledger_step(f"i{n}", text="Working, step by step.", delay_ms=40)
                    for n in range(INTERRUPT_STEPS)
                ),
                _stream("All steps are done.", 10),
            ],
        },
        # A batch line (and anything else): one short step.
        {"when": ".*", "steps": [_stream("Done: {prompt}", 5)]},
    ]
}


def ledger_path() -> Path:
    """Where the ledger is: ``$PARLEY_SOAK_DIR/ledger.jsonl``."""
    return Path(os.environ["PARLEY_SOAK_DIR"]) / "ledger.jsonl"


def _append(arguments: dict[str, Any], context: ToolContext, tool: str) -> str:
    line = {
        "turn_id": context.turn_id,
        "mark": arguments.get("mark"),
        "tool": tool,
        "at": time.time(),
        "pid": os.getpid(),
    }
    descriptor = os.open(ledger_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, (json.dumps(line) + "\n").encode())
    finally:
        os.close(descriptor)
    return f"noted {line['mark']}"


_PARAMETERS = {"type": "object", "properties": {"mark": {"type": "string"}}}

LEDGER_TOOL = FunctionTool(
    name=LEDGER,
    description="Notes in the soak's ledger that this call ran.",
    parameters=_PARAMETERS,
    function=lambda arguments, context: _append(arguments, context, LEDGER),
)
APPROVED_LEDGER_TOOL = FunctionTool(
    name=APPROVED_LEDGER,
    description="Notes in the soak's ledger that this call ran, once a person approved it.",
    parameters=_PARAMETERS,
    function=lambda arguments, context: _append(arguments, context, APPROVED_LEDGER),
)


def soak_host() -> parley.Host:
    """The soak's host: its script, its two ledger tools, a policy that asks about every
    call of ``approved_ledger``."""
    return parley.Host(
        model=ScriptedModel(SCRIPT, name="soak"),
        tools=[LEDGER_TOOL, APPROVED_LEDGER_TOOL],
        policy=parley.Policy(ask_tools=[APPROVED_LEDGER]),
    )
