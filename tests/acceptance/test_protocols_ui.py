"""SPEC §6 "Protocols for existing UIs", with the stock clients in Node: ``@ag-ui/client``'s
``HttpAgent`` against ``POST /v1/ag-ui``, and the ``ai`` package's
``DefaultChatTransport`` and ``readUIMessageStream`` against ``POST /v1/chat`` and
``GET /v1/chat/{id}/stream``.

The clients are the versions ``tests/package.json`` pins (``npm ci --prefix tests``
installs them; ``.ci/run`` does).  Without them these tests fail, never skip.  The
scripts under ``tests/node/`` read a scenario on stdin and answer one JSON line.

The first tests need no gateway: they feed what the projections make of a turn straight
to the stock clients, for the cases a live turn cannot be steered into on demand (a
restarted step, a replay into messages the client holds).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from parley.gateway.agui_projection import AgUiRun
from parley.gateway.aisdk_projection import UiMessageStream
from schemas.events import (
    Ended,
    Event,
    EventPayload,
    Refused,
    Steered,
    StepCommitted,
    StepRestarted,
    Token,
    ToolAnswered,
    ToolCalled,
)
from schemas.messages import ToolCall

TESTS = Path(__file__).resolve().parents[1]
NODE = TESTS / "node"
CLIENTS = ("@ag-ui/client", "ai")
NODE_TIMEOUT = 90


@pytest.fixture(autouse=True)
def stock_clients() -> None:
    """The pinned clients must be installed: a missing one fails the test, loudly."""
    missing = [name for name in CLIENTS if not (TESTS / "node_modules" / name).is_dir()]
    if missing:
        pytest.fail(f"{missing} not installed: run `npm ci --prefix tests` (as .ci/run does)")


def node(script: str, scenario: dict[str, Any], *, timeout: float = NODE_TIMEOUT) -> Any:
    """Run ``tests/node/<script>`` on ``scenario``; its answer."""
    done = subprocess.run(
        ["node", str(NODE / script)],
        input=json.dumps(scenario),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=TESTS,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return answer_of(done.stdout, done.stderr)


def answer_of(stdout: str, stderr: str) -> Any:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"no answer from the script; stderr:\n{stderr}"
    return json.loads(lines[-1])


# ---------------------------------------------------------------- no gateway

TURN = "11111111-2222-3333-4444-555555555555"
USER = {"id": "u1", "role": "user", "content": "hello"}


def events_of(*payloads: EventPayload) -> list[Event]:
    return [Event.of(TURN, seq, p) for seq, p in enumerate(payloads, 1)]


def agui_events(events: list[Event], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    run = AgUiRun(
        thread_id="thread",
        run_id="run",
        session_id="session",
        turn_id=TURN,
        input_messages=messages,
    )
    out = run.opening()
    for event in events:
        out += run.feed(event)
    return out + run.close()


CALL = ToolCall(id="call_0_0", name="read_file", arguments='{"path": "a.txt"}')
RESTARTED = events_of(
    Token(step=0, text="I will "),
    ToolCalled(step=0, call_id="call_0_0", name="read_file", arguments=CALL.arguments),
    ToolAnswered(step=0, call_id="call_0_0", name="read_file", content="A"),
    # The worker died before the step committed: another redoes it.
    StepRestarted(step=0, reason="resumed"),
    Token(step=0, text="Reading "),
    Token(step=0, text="it."),
    ToolCalled(step=0, call_id="call_0_0", name="read_file", arguments=CALL.arguments),
    ToolAnswered(step=0, call_id="call_0_0", name="read_file", content="A"),
    StepCommitted(step=0, text="Reading it.", tool_calls=(CALL,)),
    Token(step=1, text="partial "),
    StepRestarted(step=1, reason="diverged"),
    Token(step=1, text="It says A."),
    StepCommitted(step=1, text="It says A."),
    Ended(outcome="finished", reply="It says A."),
)


def test_a_stock_agui_client_drops_a_restarted_steps_text_and_tool_call() -> None:
    events = agui_events(RESTARTED, [USER])
    got = node("offline.mjs", {"protocol": "ag-ui", "events": events, "messages": [USER]})
    assert got["error"] is None
    assert got["warnings"] == []
    messages = got["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert [m.get("content") for m in messages if m["role"] == "assistant"] == [
        "Reading it.",
        "It says A.",
    ]
    assert len(messages[1]["toolCalls"]) == 1
    assert got["result"] == {"outcome": "finished", "reply": "It says A."}
    # A replay of the same turn into what the client now holds changes nothing.
    again = agui_events(RESTARTED, messages)
    replayed = node("offline.mjs", {"protocol": "ag-ui", "events": again, "messages": messages})
    assert replayed["warnings"] == []
    assert replayed["messages"] == messages


def test_a_stock_ai_sdk_client_builds_the_message_and_can_hide_retracted_text() -> None:
    stream = UiMessageStream(session_id="session", turn_id=TURN)
    chunks = stream.opening()
    extra = events_of(
        Steered(position=1, text="be brief"),
        ToolCalled(step=2, call_id="c", name="write_file", arguments="{}"),
        Refused(call_id="c", tool="write_file", rule="deny_write", reason="no"),
        ToolAnswered(step=2, call_id="c", name="write_file", content="refused", is_error=True),
        StepCommitted(step=2, text=""),
    )
    for event in [*RESTARTED[:-1], *extra, RESTARTED[-1]]:
        chunks += stream.feed(event)
    chunks += stream.close()
    got = node("offline.mjs", {"protocol": "ai-sdk", "chunks": chunks})
    assert got["errors"] == [] and got["warnings"] == []
    message = got["message"]
    assert message["id"] == TURN
    assert message["metadata"]["parley"]["outcome"] == "finished"
    parts = message["parts"]
    hidden = {
        text_id
        for part in parts
        if part["type"] == "data-parley-step-restarted"
        for text_id in part["data"]["textIds"]
    }
    shown = [
        part["text"]
        for part in parts
        if part["type"] == "text" and part["providerMetadata"]["parley"]["textId"] not in hidden
    ]
    assert shown == ["Reading it.", "It says A."]
    assert sum(part["type"] == "step-start" for part in parts) == 3
    read = [p for p in parts if p["type"] == "tool-read_file"]
    assert [(p["state"], p["input"], p["output"]) for p in read] == [
        ("output-available", {"path": "a.txt"}, "A")
    ]
    write = next(p for p in parts if p["type"] == "tool-write_file")
    assert (write["state"], write["errorText"]) == ("output-error", "refused")
    assert [p["data"]["text"] for p in parts if p["type"] == "data-parley-steer"] == ["be brief"]
    assert [p["data"]["rule"] for p in parts if p["type"] == "data-parley-refusal"] == [
        "deny_write"
    ]
