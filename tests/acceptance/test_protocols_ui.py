"""docs/protocols.md, with the stock clients in Node: ``@ag-ui/client``'s
``HttpAgent`` against ``POST /v1/ag-ui``, and the ``ai`` package's
``DefaultChatTransport`` and ``readUIMessageStream`` against ``POST /v1/chat`` and
``GET /v1/chat/{id}/stream``.

The clients are the versions ``tests/package.json`` pins (``npm ci --prefix tests``
installs them; ``.ci/run`` does).  Without them these tests fail, never skip.  The
scripts under ``tests/node/`` read a scenario on stdin and answer one JSON line.

The first tests need no gateway: they feed what the projections make of a turn straight
to the stock clients, for cases a live turn reaches only by chance (a crash mid-step).
The rest run each protocol through a real gateway process (``tests/support/gateway.py``) on the
embedded SQLite deployment and on the fleet.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from parley.gateway.projections.agui import AgUiRun
from parley.gateway.projections.aisdk import UiMessageStream
from parley.schemas.events import (
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
from parley.schemas.messages import ToolCall
from tests.acceptance.conftest import host_fleet
from tests.acceptance.test_sub_agents import RULES as SUB_AGENT_RULES
from tests.support.fleet import Fleet
from tests.support.gateway import (
    Gateway,
    Gateways,
    Tenant,
    deployment_env,
    make_tokens,
    scripted_tenant,
    start_gateway,
)
from tests.support.waiting import wait_until

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


@pytest.fixture(autouse=True)
def node_runs() -> Iterator[None]:
    """Kill any script a failed test left running."""
    yield
    while NodeRun.running:
        run = NodeRun.running.pop()
        run.process.kill()
        run.process.communicate()


def node(script: str, scenario: dict[str, Any], *, timeout: float = NODE_TIMEOUT) -> Any:
    """Run ``tests/node/<script>`` on ``scenario``; its answer."""
    return NodeRun(script, scenario).answer(timeout)


class NodeRun:
    """A Node script running in the background (while the test acts on the turn); one
    the test did not wait for is killed after it (``node_runs``)."""

    running: ClassVar[list[NodeRun]] = []

    def __init__(self, script: str, scenario: dict[str, Any]) -> None:
        with tempfile.TemporaryFile("w+") as given:
            given.write(json.dumps(scenario))
            given.seek(0)
            self.process = subprocess.Popen(
                ["node", str(NODE / script)],
                stdin=given,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=TESTS,
            )
        NodeRun.running.append(self)

    def answer(self, timeout: float = NODE_TIMEOUT) -> Any:
        """The script's answer, once it has ended."""
        try:
            stdout, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            stdout, stderr = self.process.communicate()
            NodeRun.running.remove(self)
            raise AssertionError(f"the script did not end:\n{stdout}\n{stderr}") from None
        NodeRun.running.remove(self)
        assert self.process.returncode == 0, stderr
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


READ_A: list[EventPayload] = [
    ToolCalled(step=0, call_id="call_0_0", name="read_file", arguments=CALL.arguments),
    ToolAnswered(step=0, call_id="call_0_0", name="read_file", content="A"),
]
TWICE_RESTARTED = events_of(
    Token(step=0, text="Reading it."),
    *READ_A,
    StepRestarted(step=0, reason="resumed"),  # the worker died while the tool ran
    Token(step=0, text="Read"),
    StepRestarted(step=0, reason="failed"),  # the redo's stream failed
    Token(step=0, text="Reading it."),
    *READ_A,
    StepCommitted(step=0, text="Reading it.", tool_calls=(CALL,)),
    Token(step=1, text="It says A."),
    StepCommitted(step=1, text="It says A."),
    Ended(outcome="finished", reply="It says A."),
)


def test_a_stock_agui_client_replaying_a_step_restarted_twice_holds_each_message_once() -> None:
    events = agui_events(TWICE_RESTARTED, [USER])
    got = node("offline.mjs", {"protocol": "ag-ui", "events": events, "messages": [USER]})
    assert got["error"] is None and got["warnings"] == []
    messages = got["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    # The same turn replayed into what the client holds (its message sent again).
    again = agui_events(TWICE_RESTARTED, messages)
    replayed = node("offline.mjs", {"protocol": "ag-ui", "events": again, "messages": messages})
    assert replayed["error"] is None and replayed["warnings"] == []
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


# ---------------------------------------------------------------- through a gateway

DEPLOYMENTS = ["embedded-sqlite", pytest.param("fleet-postgres", marks=pytest.mark.postgres)]
ECHO: dict[str, Any] = {
    "when": ".*",
    "steps": [{"text": "heard: {last_message}", "chunk_chars": 3}],
}
TOOL: dict[str, Any] = {
    "when": "^tool",
    "steps": [
        {"text": "Let me look.", "tool_calls": [{"name": "list_files", "arguments": {}}]},
        {"text": "Found nothing.", "chunk_chars": 4},
    ],
}
STEERED: dict[str, Any] = {
    "when": "^steered",
    "steps": [
        {"tool_calls": [{"name": "wait_for_gate", "arguments": {}}]},
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "secrets/k", "content": "x"}}
            ]
        },
        {"text": "heard: {last_message}"},
    ],
}
GATED: dict[str, Any] = {
    "when": "^gated",
    "steps": [
        {"text": "Before the gate.", "tool_calls": [{"name": "wait_for_gate", "arguments": {}}]},
        {"text": "After the gate.", "chunk_chars": 5},
    ],
}
ASKING: dict[str, Any] = {
    "when": "^record",
    "steps": [
        {"text": "Recording.", "tool_calls": [{"name": "record_call", "arguments": {"note": "a"}}]},
        {"text": "done: {last_message}"},
    ],
}
KEEPALIVE_SECONDS = 0.3
PAUSED_REPLY = "Before the pause, after it."
PAUSED: dict[str, Any] = {
    "when": "^pause",
    # A silence of several keep-alives, mid-text.
    "steps": [{"text": PAUSED_REPLY, "chunk_chars": 17, "delay_ms": KEEPALIVE_SECONDS * 5000}],
}
RULES: list[dict[str, Any]] = [TOOL, STEERED, GATED, ASKING, PAUSED, ECHO]
ASK = {"ask_tools": ["record_call"]}


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    pool = Gateways(
        tmp_path_factory.mktemp("ui-gateways"),
        extra={"PARLEY_GATEWAY_KEEPALIVE": str(KEEPALIVE_SECONDS)},
    )
    yield pool
    pool.stop()


@pytest.fixture(params=DEPLOYMENTS)
def gateway(gateways: Gateways, request: pytest.FixtureRequest) -> Gateway:
    """The gateway of one deployment (each test's tenants are fresh)."""
    deployment: str = request.param
    return gateways.get(deployment, request)


@pytest.fixture
def alice(gateway: Gateway) -> Tenant:
    return scripted_tenant(gateway, RULES)


def agui(gateway: Gateway, tenant: Tenant, thread_id: str, *prompts: str | None) -> dict[str, Any]:
    """The scenario of ``tests/node/agui.mjs``: one HttpAgent, a run per prompt (None:
    a run with no new user message)."""
    return {
        "url": gateway.url,
        "token": tenant.token,
        "threadId": thread_id,
        "runs": [{"prompt": prompt} for prompt in prompts],
    }


def when_asked(directory: Path, name: str, timeout: float = 30) -> None:
    """Wait until a script asks the test to act (``ask`` in ``tests/node/common.mjs``)."""
    wait_until((directory / f"{name}.asked").exists, timeout, what=f"the script to ask {name}")


def go_on(directory: Path, name: str) -> None:
    """Let the script go on."""
    (directory / f"{name}.done").touch()


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def customs(events: list[dict[str, Any]], name: str) -> list[Any]:
    return [e["value"] for e in events if e["type"] == "CUSTOM" and e["name"] == name]


def turn_of(run: dict[str, Any]) -> str:
    """The turn an AG-UI run is (``RUN_STARTED``'s ``metadata.parley.turnId``)."""
    started = run["events"][0]
    assert started["type"] == "RUN_STARTED", started
    return str(started["metadata"]["parley"]["turnId"])


def sessions_of(tenant: Tenant) -> list[dict[str, Any]]:
    response = tenant.http.get("/v1/sessions")
    assert response.status_code == 200, response.text
    sessions: list[dict[str, Any]] = response.json()["sessions"]
    return sessions


def running_turn(tenant: Tenant, timeout: float = 30) -> str:
    """The id of the tenant's one running turn, found over the native API."""
    deadline = time.monotonic() + timeout
    while True:
        for session in sessions_of(tenant):
            tree = tenant.http.get(f"/v1/sessions/{session['id']}/tree").json()["turns"]
            running = [str(t["turn_id"]) for t in tree if t["status"] == "running"]
            if running:
                return running[-1]
        assert time.monotonic() < deadline, "no turn of the tenant ever ran"
        time.sleep(0.05)


def test_agui_a_reply_and_a_thread_continued_across_runs(gateway: Gateway, alice: Tenant) -> None:
    got = node("agui.mjs", agui(gateway, alice, "thread-1", "hello", "again"))
    assert got["warnings"] == []
    first, second = got["runs"]
    assert first["error"] is None
    assert kinds(first["events"])[0] == "RUN_STARTED"
    assert kinds(first["events"])[-1] == "RUN_FINISHED"
    assert [m["content"] for m in first["newMessages"]] == ["heard: hello"]
    assert first["result"] == {"outcome": "finished", "reply": "heard: hello"}
    assert [m["content"] for m in second["newMessages"]] == ["heard: again"]
    # One session for the thread, whose second turn hangs under the first: the model
    # saw the stored history with the second prompt.
    [session] = sessions_of(alice)
    history = alice.http.get(f"/v1/sessions/{session['id']}/history").json()["turns"]
    assert [t["prompt"] for t in history] == ["hello", "again"]
    assert [t["turn_id"] for t in history] == [turn_of(first), turn_of(second)]
    last = alice.control.requests()[-1]
    assert alice.control.user_texts(last) == ["hello", "again"]
    # One log, several views: the same turn over the native event stream.
    native = alice.event_json(turn_of(second))
    assert "".join(e["data"]["text"] for e in native if e["kind"] == "token") == "heard: again"


def test_agui_a_tool_round(gateway: Gateway, alice: Tenant) -> None:
    got = node("agui.mjs", agui(gateway, alice, "thread-tool", "tool please"))
    assert got["warnings"] == []
    [run] = got["runs"]
    events = run["events"]
    assert kinds(events)[:10] == [
        "RUN_STARTED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "STEP_FINISHED",
    ]
    start = events[5]
    assert start["toolCallName"] == "list_files"
    result = events[8]
    assert result["toolCallId"] == start["toolCallId"]
    assert result["content"] == "(no files)"
    messages = run["newMessages"]
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    assert messages[0]["toolCalls"][0]["function"]["name"] == "list_files"
    assert messages[1]["toolCallId"] == start["toolCallId"]
    assert messages[2]["content"] == "Found nothing."


def test_agui_a_native_steer_and_a_refusal_arrive_as_custom_events(
    gateway: Gateway, alice: Tenant
) -> None:
    alice.control.policy(deny_write=["secrets/**"])
    running = NodeRun("agui.mjs", agui(gateway, alice, "thread-steer", "steered run"))
    alice.control.wait_entered()
    turn_id = running_turn(alice)
    said = alice.http.post(f"/v1/turns/{turn_id}/say", json={"text": "only the docs"})
    assert said.status_code == 202, said.text
    alice.control.open_gate()
    got = running.answer()
    assert got["warnings"] == []
    [run] = got["runs"]
    assert turn_of(run) == turn_id
    assert customs(run["events"], "parley.steer") == [{"position": 1, "text": "only the docs"}]
    [refusal] = customs(run["events"], "parley.refusal")
    assert (refusal["tool"], refusal["rule"]) == ("write_file", "deny_write:secrets/**")
    assert run["newMessages"][-1]["content"] == "heard: only the docs"
    assert run["result"]["reply"] == "heard: only the docs"


def test_agui_a_failed_turn_is_run_error_and_its_retracted_text_is_dropped(
    gateway: Gateway, alice: Tenant
) -> None:
    alice.control.fail_model("the model is down", after="provisional words")
    failed = node("agui.mjs", agui(gateway, alice, "thread-fail", "hello"))
    assert failed["warnings"] == []
    [run] = failed["runs"]
    assert kinds(run["events"])[-1] == "RUN_ERROR"
    assert run["events"][-1]["code"] == "failed"
    assert "the model is down" in run["events"][-1]["message"]
    [restart] = customs(run["events"], "parley.step_restarted")
    assert restart["reason"] == "failed"
    # The stock client dropped the provisional text the failed step streamed.
    assert [m["role"] for m in failed["messages"]] == ["user"]
    # Resumed natively, the turn goes on; the same thread run again with no new message
    # replays that turn, from its failure to its reply, into the agent's messages.
    alice.control.script(RULES)
    resumed = alice.http.post(f"/v1/turns/{turn_of(run)}/resume")
    assert resumed.status_code == 202, resumed.text
    alice.result(turn_of(run))
    scenario = agui(gateway, alice, "thread-fail", None)
    scenario["messages"] = failed["messages"]
    again = node("agui.mjs", scenario)
    assert again["warnings"] == []
    [replay] = again["runs"]
    assert turn_of(replay) == turn_of(run)
    assert kinds(replay["events"])[-1] == "RUN_FINISHED"
    assert [m.get("content") for m in again["messages"]] == ["hello", "heard: hello"]


def test_agui_a_thread_id_of_two_tenants_is_two_sessions(gateway: Gateway, alice: Tenant) -> None:
    bob = gateway.tenant()
    bob.control.script(RULES)
    node("agui.mjs", agui(gateway, alice, "shared-name", "from alice"))
    got = node("agui.mjs", agui(gateway, bob, "shared-name", "from bob"))
    [run] = got["runs"]
    assert run["newMessages"][-1]["content"] == "heard: from bob"
    [mine], [theirs] = sessions_of(alice), sessions_of(bob)
    assert mine["id"] != theirs["id"]
    assert bob.control.user_texts(bob.control.requests()[-1]) == ["from bob"]
    # Each tenant's thread goes on in its own session.
    node("agui.mjs", agui(gateway, bob, "shared-name", "bob again"))
    assert [s["id"] for s in sessions_of(bob)] == [theirs["id"]]
    assert len(sessions_of(alice)) == 1


def test_agui_a_run_on_a_busy_thread_waits_for_the_running_turn(
    gateway: Gateway, alice: Tenant
) -> None:
    first = NodeRun("agui.mjs", agui(gateway, alice, "thread-busy", "gated run"))
    alice.control.wait_entered()
    second = NodeRun("agui.mjs", agui(gateway, alice, "thread-busy", "meanwhile"))
    [session] = sessions_of(alice)
    deadline = time.monotonic() + 30
    while len(alice.http.get(f"/v1/sessions/{session['id']}/tree").json()["turns"]) < 2:
        assert time.monotonic() < deadline, "the second run never queued its turn"
        time.sleep(0.02)
    alice.control.open_gate()  # the second run streams its queued turn meanwhile
    one, two = first.answer()["runs"][0], second.answer()["runs"][0]
    assert one["newMessages"][-1]["content"] == "After the gate."
    assert two["newMessages"][-1]["content"] == "heard: meanwhile"
    history = alice.http.get(f"/v1/sessions/{session['id']}/history").json()["turns"]
    assert [t["turn_id"] for t in history] == [turn_of(one), turn_of(two)]


def test_agui_an_approval_is_an_interrupt_and_a_resume_answers_it(
    gateway: Gateway, alice: Tenant, tmp_path: Path
) -> None:
    alice.control.policy(**ASK)
    scenario = agui(gateway, alice, "thread-ask", "record this")
    scenario["runs"].append(
        {"prompt": None, "resume": {"status": "resolved"}, "askBefore": "interrupted"}
    )
    scenario["rendezvous"] = str(tmp_path)
    running = NodeRun("agui.mjs", scenario)
    when_asked(tmp_path, "interrupted")
    [session] = sessions_of(alice)
    [waiting] = alice.http.get(f"/v1/sessions/{session['id']}/tree").json()["turns"]
    assert waiting["status"] == "waiting"  # the turn waits, holding no worker
    assert alice.control.recorded_calls() == []  # nothing of its step ran
    go_on(tmp_path, "interrupted")
    got = running.answer()
    assert got["warnings"] == []
    asked, resumed = got["runs"]
    # The first run ends with AG-UI's interrupt outcome: the turn waits, holding no worker.
    finished = asked["events"][-1]
    assert finished["type"] == "RUN_FINISHED"
    [interrupt] = finished["outcome"]["interrupts"]
    assert finished["outcome"]["type"] == "interrupt"
    assert interrupt["reason"] == "tool_approval"
    assert interrupt["metadata"]["parley"]["tool"] == "record_call"
    [requested] = customs(asked["events"], "parley.approval_requested")
    assert requested["approvalId"] == interrupt["id"]
    assert interrupt["toolCallId"] == requested["toolCallId"]
    assert waiting["turn_id"] == turn_of(asked)
    # The next run's resume entry approves it: the same turn goes on, and the call runs once.
    assert turn_of(resumed) == turn_of(asked)
    assert resumed["error"] is None and resumed["pendingInterrupts"] == []
    [answered] = customs(resumed["events"], "parley.approval_answered")
    assert answered == {"approvalId": interrupt["id"], "decision": "approved", "reason": None}
    assert resumed["result"] == {"outcome": "finished", "reply": "done: record this"}
    assert len(alice.control.recorded_calls()) == 1
    roles = [(m["role"], m.get("content")) for m in got["messages"]]
    assert roles == [
        ("user", "record this"),
        ("assistant", "Recording."),
        ("tool", "recorded"),
        ("assistant", "done: record this"),
    ]
    # Answered already, the same resume again is refused in AG-UI's terms by the client
    # (no interrupt pends), and in the gateway's if sent anyway with another answer.
    again = alice.http.post(
        "/v1/ag-ui",
        json={
            "threadId": "thread-ask",
            "runId": "r",
            "messages": [],
            "resume": [{"interruptId": interrupt["id"], "status": "cancelled"}],
        },
    )
    assert again.status_code == 409, again.text


@pytest.mark.parametrize("path", ["/v1/ag-ui", "/v1/chat"])
def test_an_idle_protocol_stream_keeps_alive_in_lf_lines(
    gateway: Gateway, alice: Tenant, path: str
) -> None:
    user = {"id": "m", "role": "user"}
    body = (
        {"threadId": "idle", "runId": "r", "messages": [{**user, "content": "gated idle"}]}
        if path == "/v1/ag-ui"
        else {"id": "idle", "messages": [{**user, "parts": [{"type": "text", "text": "gated"}]}]}
    )
    raw = b""
    with alice.http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for chunk in response.iter_bytes():
            raw += chunk
            if b": keep-alive" in raw and not alice.control.dir.joinpath("gate-open").exists():
                alice.control.open_gate()  # idle at the gate, kept alive: now let it end
    # AG-UI's client splits events on "\n\n" only: no line may end in CR.
    assert b"\r" not in raw
    frames = [f for f in raw.decode().split("\n\n") if f]
    assert frames[0].startswith("data: ")
    assert ": keep-alive" in frames
    last = [f for f in frames if f.startswith("data: ")][-1]
    if path == "/v1/chat":
        assert last == "data: [DONE]"
    else:
        assert '"type":"RUN_FINISHED"' in last


def test_the_stock_clients_read_a_stream_silent_for_longer_than_the_keep_alive(
    gateway: Gateway, alice: Tenant
) -> None:
    """A turn quiet mid-text for several keep-alives (a slow model, tool or approval):
    ``HttpAgent.runAgent()`` and the AI SDK's transport each read across the silence to
    the reply, with nothing amiss."""
    got = node("agui.mjs", agui(gateway, alice, "thread-pause", "pause a while"))
    assert got["warnings"] == []
    [run] = got["runs"]
    assert kinds(run["events"])[-1] == "RUN_FINISHED"
    assert run["newMessages"][-1]["content"] == PAUSED_REPLY
    [result] = chat(gateway, alice, "chat-pause", {"send": "pause again"})
    assert result["error"] is None
    assert [p["text"] for p in result["message"]["parts"] if p["type"] == "text"] == [PAUSED_REPLY]
    assert result["chunks"][-1]["type"] == "finish"


def test_agui_bad_input_is_refused_and_changes_nothing(gateway: Gateway, alice: Tenant) -> None:
    # The stock client with no user message: its run rejects with the 422.
    got = node("agui.mjs", agui(gateway, alice, "thread-bad", None))
    [run] = got["runs"]
    assert run["error"]["status"] == 422
    assert run["error"]["payload"]["error"]["type"] == "InvalidRequest"
    base = {"threadId": "thread-bad", "runId": "r"}
    user = {"id": "m", "role": "user", "content": "hi"}
    for body, status in [
        ({**base, "messages": [{"id": "a", "role": "assistant", "content": "x"}]}, 422),
        ({"runId": "r", "messages": [user]}, 422),
        ({**base, "messages": [{"id": "m", "role": "user", "content": "  "}]}, 422),
        ({**base, "messages": [{"id": "m", "role": "nobody", "content": "x"}]}, 422),
        (
            {
                **base,
                "messages": [
                    {
                        "id": "m",
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "value": "u"}}],
                    }
                ],
            },
            422,
        ),
        ({**base, "messages": [user], "resume": [{"interruptId": "i", "status": "maybe"}]}, 422),
        # A resume for a thread that never ran: nothing to answer.
        ({**base, "messages": [user], "resume": [{"interruptId": "i", "status": "resolved"}]}, 404),
    ]:
        response = alice.http.post("/v1/ag-ui", json=body)
        assert response.status_code == status, (body, response.text)
        named = "InvalidRequest" if status == 422 else "SessionNotFound"
        assert response.json()["error"]["type"] == named
    malformed = alice.http.post(
        "/v1/ag-ui", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert malformed.status_code == 400
    assert (
        gateway.anonymous().post("/v1/ag-ui", json={**base, "messages": [user]}).status_code == 401
    )
    assert sessions_of(alice) == []


def chat(gateway: Gateway, tenant: Tenant, chat_id: str, *steps: dict[str, Any]) -> list[Any]:
    """Run ``tests/node/aisdk.mjs``; the result of each step."""
    got = node("aisdk.mjs", chat_scenario(gateway, tenant, chat_id, *steps))
    assert got["warnings"] == []
    results: list[Any] = got["results"]
    return results


def chat_scenario(
    gateway: Gateway, tenant: Tenant, chat_id: str, *steps: dict[str, Any]
) -> dict[str, Any]:
    return {"url": gateway.url, "token": tenant.token, "chatId": chat_id, "steps": list(steps)}


def part_types(message: dict[str, Any]) -> list[str]:
    return [p["type"] for p in message["parts"]]


def test_chat_text_parts_tool_parts_and_steps(gateway: Gateway, alice: Tenant) -> None:
    tooled, plain = chat(gateway, alice, "chat-1", {"send": "tool please"}, {"send": "thanks"})
    assert tooled["error"] is None
    message = tooled["message"]
    assert part_types(message) == ["step-start", "text", "tool-list_files", "step-start", "text"]
    texts = [p["text"] for p in message["parts"] if p["type"] == "text"]
    assert texts == ["Let me look.", "Found nothing."]
    tool = message["parts"][2]
    assert (tool["state"], tool["input"], tool["output"]) == ("output-available", {}, "(no files)")
    chunk_kinds = [c["type"] for c in tooled["chunks"]]
    assert chunk_kinds[0] == "start" and chunk_kinds[-1] == "finish"
    assert {"tool-input-available", "tool-output-available", "finish-step"} <= set(chunk_kinds)
    assert tooled["chunks"][-1]["finishReason"] == "stop"
    turn_id = message["id"]
    assert message["metadata"]["parley"]["turnId"] == turn_id
    # The second message continues the chat's session.
    assert [p["text"] for p in plain["message"]["parts"] if p["type"] == "text"] == [
        "heard: thanks"
    ]
    [session] = sessions_of(alice)
    history = alice.http.get(f"/v1/sessions/{session['id']}/history").json()["turns"]
    assert [t["turn_id"] for t in history] == [turn_id, plain["message"]["id"]]


def test_chat_reconnect_resumes_a_running_turn_after_a_dropped_connection(
    gateway: Gateway, alice: Tenant, tmp_path: Path
) -> None:
    scenario = chat_scenario(
        gateway,
        alice,
        "chat-resume",
        {"send": "gated chat", "dropAfter": "tool-input-available"},
        {"reconnect": True, "ask": "reconnected"},
        {"reconnect": True},
    )
    scenario["rendezvous"] = str(tmp_path)
    running = NodeRun("aisdk.mjs", scenario)
    deadline = time.monotonic() + 30
    while not (tmp_path / "reconnected.asked").exists():
        assert time.monotonic() < deadline, "the client never reconnected"
        time.sleep(0.02)
    # Dropped and reconnected while the turn waits at the gate: now it goes on.
    assert running_turn(alice)
    alice.control.open_gate()
    (tmp_path / "reconnected.done").touch()
    got = running.answer()
    assert got["warnings"] == []
    dropped, resumed, after = got["results"]
    assert dropped["dropped"]
    assert "finish" not in [c["type"] for c in dropped["chunks"]]
    assert resumed["error"] is None
    message = resumed["message"]
    # The replay from the turn's start: every part once, the rest followed live.
    assert part_types(message) == ["step-start", "text", "tool-wait_for_gate", "step-start", "text"]
    assert [p["text"] for p in message["parts"] if p["type"] == "text"] == [
        "Before the gate.",
        "After the gate.",
    ]
    assert message["parts"][2]["state"] == "output-available"
    assert message["id"] == dropped["chunks"][0]["messageId"]
    assert resumed["chunks"][-1]["type"] == "finish"
    # Nothing runs any more: 204, which the transport reads as no stream.
    assert after == {"noContent": True}
    nothing = alice.http.get("/v1/chat/never-used/stream")
    assert nothing.status_code == 204
    assert len(sessions_of(alice)) == 1  # the look-up created nothing


def test_chat_regenerate_branches_above_the_replaced_answer(
    gateway: Gateway, alice: Tenant
) -> None:
    first, second, again = chat(
        gateway, alice, "chat-regen", {"send": "one"}, {"send": "two"}, {"regenerate": True}
    )
    assert again["message"]["id"] != second["message"]["id"]
    [session] = sessions_of(alice)
    history = alice.http.get(f"/v1/sessions/{session['id']}/history").json()["turns"]
    assert [t["turn_id"] for t in history] == [first["message"]["id"], again["message"]["id"]]
    tree = alice.http.get(f"/v1/sessions/{session['id']}/tree").json()["turns"]
    assert len(tree) == 3  # the replaced answer stays in the tree


def test_chat_a_failed_turn_is_an_error_chunk(gateway: Gateway, alice: Tenant) -> None:
    alice.control.fail_model("the model is down")
    [failed] = chat(gateway, alice, "chat-fail", {"send": "hello"})
    assert "the model is down" in failed["error"]["message"]
    assert [c["type"] for c in failed["chunks"]][-2:] == ["error", "finish"]
    assert failed["chunks"][-1]["finishReason"] == "error"


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "denied"])
def test_chat_an_approval_request_and_the_apps_answer(
    gateway: Gateway, alice: Tenant, approved: bool, tmp_path: Path
) -> None:
    alice.control.policy(**ASK)
    scenario = chat_scenario(
        gateway,
        alice,
        f"chat-ask-{approved}",
        {"send": "record this"},
        {"answer": {"approved": approved, "reason": "not today"}, "askBefore": "asked"},
    )
    scenario["rendezvous"] = str(tmp_path)
    running = NodeRun("aisdk.mjs", scenario)
    when_asked(tmp_path, "asked")
    assert alice.control.recorded_calls() == []  # nothing of the waiting step ran
    stream = alice.http.get(f"/v1/chat/chat-ask-{approved}/stream")  # reconnect meanwhile
    assert stream.status_code == 200
    assert '"type":"tool-approval-request"' in stream.text
    assert '"finishReason":"tool-calls"' in stream.text
    go_on(tmp_path, "asked")
    got = running.answer()
    assert got["warnings"] == []
    asked, responded = got["results"]
    waiting = asked["message"]
    assert part_types(waiting) == ["step-start", "text", "tool-record_call"]
    tool = waiting["parts"][2]
    assert tool["state"] == "approval-requested"
    assert tool["input"] == {"note": "a"}
    assert asked["chunks"][-1]["finishReason"] == "tool-calls"
    assert waiting["metadata"]["parley"]["outcome"] == "waiting"
    # The SDK would send the answer on its own (sendAutomaticallyWhen).
    assert responded["complete"] and responded["error"] is None
    message = responded["message"]
    assert message["id"] == waiting["id"]  # the same message goes on
    done = [p for p in message["parts"] if p["type"] == "tool-record_call"]
    assert len(done) == 1
    texts = [p["text"] for p in message["parts"] if p["type"] == "text"]
    assert texts == ["Recording.", "done: record this"]
    assert message["metadata"]["parley"]["outcome"] == "finished"
    if approved:
        assert (done[0]["state"], done[0]["output"]) == ("output-available", "recorded")
        assert len(alice.control.recorded_calls()) == 1
    else:
        assert done[0]["state"] == "output-denied"
        assert alice.control.recorded_calls() == []
        denial = alice.control.requests()[-1]["messages"]
        assert any("not today" in str(m) for m in denial if m["role"] == "tool")


def test_chat_bad_input_is_refused_and_changes_nothing(gateway: Gateway, alice: Tenant) -> None:
    [empty, assistant_only] = chat(
        gateway,
        alice,
        "chat-bad",
        {"sendRaw": {"messages": []}},
        {
            "sendRaw": {
                "messages": [
                    {"id": "a", "role": "assistant", "parts": [{"type": "text", "text": "x"}]}
                ]
            }
        },
    )
    for refused in (empty, assistant_only):
        # The transport throws the response's body: the gateway's error form.
        assert json.loads(refused["error"]["message"])["error"]["type"] == "InvalidRequest"
    user = {"id": "u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    file_part = {"type": "file", "mediaType": "image/png", "url": "data:,"}
    for body in [
        {"messages": [user]},
        {"id": "chat-bad", "messages": [{**user, "parts": [file_part]}]},
        {"id": "chat-bad", "messages": [user], "trigger": "explode"},
        {"id": "chat-bad", "messages": "hi"},
    ]:
        response = alice.http.post("/v1/chat", json=body)
        assert response.status_code == 422, (body, response.text)
    malformed = alice.http.post(
        "/v1/chat", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert malformed.status_code == 400
    assert sessions_of(alice) == []


AGENTS_HOST = "tests.support.hosts:agents_host"
agents_fleet = host_fleet(AGENTS_HOST)


@pytest.fixture(params=DEPLOYMENTS)
def agents_gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Gateway]:
    """A gateway whose turns run with a host that declares agents (a researcher, which
    may call a critic: ``tests.support.hosts.agents_host``): in the gateway, or on a
    fleet of workers that hold it."""
    if request.param.startswith("fleet"):
        pool: Fleet = request.getfixturevalue("agents_fleet")
        env = pool.env()
        env.pop("PARLEY_HOST")
    else:
        env = deployment_env(request.param, request, f"sqlite:///{tmp_path / 'parley.db'}")
        env["PARLEY_HOST"] = AGENTS_HOST
    gateway = start_gateway(env, tmp_path / "gateway", tokens=make_tokens(["alpha"]))
    yield gateway
    gateway.stop()


def test_agui_children_are_subagents_of_the_parents_run(agents_gateway: Gateway) -> None:
    """docs/sub-agents.md#7-seen: a turn that fans out streams each child as an AG-UI
    subagent of its run (SUBAGENT_STARTED tied to the call, the child's messages and
    steps carrying its subagentRunId, SUBAGENT_FINISHED with its reply), a grandchild
    under its parent's subagent, all of it accepted by the stock client's verifier."""
    tenant = agents_gateway.tenant("alpha")
    tenant.control.script(SUB_AGENT_RULES)
    scenario = {
        "url": agents_gateway.url,
        "token": tenant.token,
        "threadId": "thread-agents",
        "runs": [{"prompt": "fan out over three topics"}, {"prompt": "nest the work"}],
    }
    got = node("agui.mjs", scenario)
    assert got["warnings"] == []
    fan, nest = got["runs"]
    assert fan["error"] is None and nest["error"] is None, (fan["error"], nest["error"])
    events = fan["events"]
    assert kinds(events)[-1] == "RUN_FINISHED"
    assert fan["result"] == {"outcome": "finished", "reply": "all three reported"}
    parent = turn_of(fan)
    children = {c["turn_id"]: c for c in tenant.http.get(f"/v1/turns/{parent}").json()["children"]}
    started = [e for e in events if e["type"] == "SUBAGENT_STARTED"]
    assert [e["subagentRunId"] for e in started] == [
        c["turn_id"] for c in sorted(children.values(), key=lambda c: c["call_id"])
    ]
    for event in started:
        child = children[event["subagentRunId"]]
        assert event["name"] == "researcher"
        assert event["parentToolCallId"] == f"{parent}:{child['call_id']}"
        assert "parentSubagentRunId" not in event
        assert event["metadata"]["parley"]["sessionId"] == child["session_id"]
    for child_id in children:
        mine = [e for e in events if e.get("subagentRunId") == child_id]
        # Opened, its step and text, then finished with its reply, in that order.
        assert kinds(mine)[0] == "SUBAGENT_STARTED" and kinds(mine)[-1] == "SUBAGENT_FINISHED"
        assert "STEP_STARTED" in kinds(mine) and "STEP_FINISHED" in kinds(mine)
        text = "".join(e["delta"] for e in mine if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert text in ("found topic alpha", "found topic beta", "found topic gamma")
        assert mine[-1]["result"] == {"outcome": "finished", "reply": text}
        assert events.index(mine[-1]) < len(events) - 1  # before the parent's RUN_FINISHED
    # The parent's own events carry no attribution, and the client keeps each child's
    # message with its subagent.
    assert all("subagentRunId" not in e for e in events if e["type"] == "RUN_FINISHED")
    held = [m for m in fan["newMessages"] if m.get("subagentRunId") in children]
    assert sorted(m["content"] for m in held) == [
        "found topic alpha",
        "found topic beta",
        "found topic gamma",
    ]
    # A grandchild is a subagent under its parent's.
    nested = [e for e in nest["events"] if e["type"] == "SUBAGENT_STARTED"]
    assert [e["name"] for e in nested] == ["researcher", "researcher/critic"]
    assert "parentSubagentRunId" not in nested[0]
    assert nested[1]["parentSubagentRunId"] == nested[0]["subagentRunId"]
    # Each finishes once, after it started.  (Not necessarily the grandchild first: the
    # tree's stream merges its turns' events as they arrive, and a loaded gateway can
    # read the child's end before its grandchild's: docs/sub-agents.md, "One stream for the tree".)
    finished = [e["subagentRunId"] for e in nest["events"] if e["type"] == "SUBAGENT_FINISHED"]
    assert sorted(finished) == sorted(e["subagentRunId"] for e in nested)
    for run_id in finished:
        opened = next(i for i, e in enumerate(nest["events"]) if e.get("subagentRunId") == run_id)
        assert nest["events"][opened]["type"] == "SUBAGENT_STARTED"
    assert nest["result"] == {"outcome": "finished", "reply": "nested done"}
