"""Hosts the fleet's worker processes load by name (``PARLEY_HOST=tests.support.hosts:...``).

``workspace_host`` takes its behaviour from files a test writes beside its workspace
(``<workspace>/../.parley-test/``): the script, the policy, a gate.  So one host, loaded
once per worker process, serves every test, and the same test body runs embedded and on
the fleet with the very same host code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import parley
from parley.engine.compaction import SUMMARY_INSTRUCTIONS
from parley.ports.host import (
    Access,
    ApprovalRequest,
    Ask,
    DeltaSink,
    ModelReply,
    ModelRequest,
    Refusal,
    ToolContext,
)
from parley.schemas.messages import message_to_json
from parley.tools import WORKSPACE_TOOLS, FunctionTool

GATE_TIMEOUT_SECONDS = 30


def control_dir(root: str | Path) -> Path:
    """Where a test's control files live: beside the workspace, not inside it."""
    return Path(root).parent / ".parley-test"


class WorkspaceScriptedModel:
    """A scripted model whose script is the test's ``script.json``; it also records each
    request it was sent in ``requests.jsonl``.  With an ``openai.json`` (``{"base_url":
    …}``) it asks that OpenAI-compatible server instead, over the real protocol."""

    name = "workspace-scripted"

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        assert request.context is not None
        control = control_dir(request.context.root)
        with (control / "requests.jsonl").open("a") as log:
            seen = {
                "turn_id": request.context.turn_id,
                "host_context": dict(request.context.host_context),
                "system_prompt": request.prefix.system_prompt,
                "tools": [t.name for t in request.prefix.tools],
                "messages": [message_to_json(m) for m in request.messages],
            }
            log.write(json.dumps(seen) + "\n")
        provider = control / "openai.json"
        if provider.exists():
            # Imported here: the other tests' workers need not load the client library.
            from parley.models.openai_chat import OpenAIChatModel

            served = OpenAIChatModel(
                "gpt-test",
                base_url=json.loads(provider.read_text())["base_url"],
                api_key="sk-test-placeholder",
                max_retries=0,
                timeout=10,
            )
            return served.stream(request, on_delta)
        script = json.loads((control / "script.json").read_text())
        if "fail" in script:
            # Text streamed first (``fail_after``) is provisional: the failed step retracts it.
            if script.get("fail_after"):
                on_delta(script["fail_after"])
            raise RuntimeError(script["fail"])
        reply: ModelReply = parley.models.ScriptedModel(script).stream(request, on_delta)
        return reply


class WorkspacePolicy:
    """The test's ``policy.json`` (``parley.Policy`` arguments), re-read at every check."""

    def check(self, tool: str, accesses: Sequence[Access], root: str) -> Refusal | Ask | None:
        path = control_dir(root) / "policy.json"
        options = json.loads(path.read_text()) if path.exists() else {}
        return parley.Policy(**options).check(tool, accesses, root)


def wait_at_gate(control: Path, gate: str = "gate") -> int:
    """Blocks until ``<gate>-open`` (every process) or ``<gate>-open-<pid>`` (this
    process) exists, and returns this process's pid, so a test can tell who passed."""
    pid = os.getpid()
    with (control / f"{gate}-calls").open("a") as calls:
        calls.write(f"{pid}\n")
    (control / f"{gate}-entered").touch()
    (control / f"{gate}-entered-{pid}").touch()
    deadline = time.monotonic() + GATE_TIMEOUT_SECONDS
    while not (control / f"{gate}-open").exists() and not (control / f"{gate}-open-{pid}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test never opened the {gate}")
        time.sleep(0.01)
    return pid


def _wait_for_gate(_arguments: dict[str, Any], context: ToolContext) -> str:
    """The gate, as a tool: says which process passed, so a test can tell whose result
    was committed."""
    return f"gate opened (pid {wait_at_gate(control_dir(context.root))})"


def _record_call(arguments: dict[str, Any], context: ToolContext) -> str:
    """A side effect a test can count: appends this process's pid to ``record-calls``
    (and the call's ``note``, if it has one, to ``record-notes``)."""
    control = control_dir(context.root)
    with (control / "record-calls").open("a") as calls:
        calls.write(f"{os.getpid()}\n")
    note = arguments.get("note")
    if isinstance(note, str):
        with (control / "record-notes").open("a") as notes:
            notes.write(f"{note}\n")
    return "recorded"


def _whoami(_arguments: dict[str, Any], context: ToolContext) -> str:
    """The host context the turn's submission carried, as a tool sees it."""
    return json.dumps(dict(context.host_context), sort_keys=True)


WHOAMI = FunctionTool(
    name="whoami",
    description="Says who is asking: the turn's host context.",
    parameters={"type": "object", "properties": {}},
    function=_whoami,
)


RECORD_CALL = FunctionTool(
    name="record_call",
    description="Records that it ran, in any process (a side effect a test counts).",
    parameters={
        "type": "object",
        "properties": {"approval_gate": {"type": "string"}, "note": {"type": "string"}},
    },
    function=_record_call,
)


class WorkspaceApprover:
    """Approves every call; a call that names an ``approval_gate`` (a test's control
    directory) only once the ``approval`` gate there opens: a person taking their time."""

    def approve(self, request: ApprovalRequest) -> bool:
        gate = request.arguments.get("approval_gate")
        if isinstance(gate, str):
            wait_at_gate(Path(gate), "approval")
        return True


WAIT_FOR_GATE = FunctionTool(
    name="wait_for_gate",
    description="Blocks until the test opens the gate (a file), in any process.",
    parameters={"type": "object", "properties": {}},
    function=_wait_for_gate,
)


def workspace_host(**options: Any) -> parley.Host:
    """The host of the acceptance suite, embedded and fleet alike (``options``: more
    ``parley.Host`` arguments)."""
    return parley.Host(
        model=WorkspaceScriptedModel(),
        tools=[*WORKSPACE_TOOLS, WAIT_FOR_GATE, RECORD_CALL, WHOAMI],
        policy=WorkspacePolicy(),
        approver=WorkspaceApprover(),
        **options,
    )


PEDANT = parley.Agent("pedant", "Finds fault with the smallest details.")
CRITIC = parley.Agent(
    "critic", "Reviews what it is given and says what is wrong with it.", agents=[PEDANT]
)
RESEARCHER = parley.Agent(
    "researcher", "Looks one topic up and reports what it found.", agents=[CRITIC]
)


def agents_host(**options: Any) -> parley.Host:
    """``workspace_host`` with sub-agents (docs/sub-agents.md): a researcher, which may
    call a critic, which may call a pedant; children nest two deep at most, so the
    critic's calls of the pedant are refused (``options``: more ``parley.Host``
    arguments)."""
    return workspace_host(agents=[RESEARCHER], max_agent_depth=2, **options)


class SummaryGatedModel(WorkspaceScriptedModel):
    """``WorkspaceScriptedModel`` whose summarizing calls wait at the ``summary`` gate
    while the test's control directory holds a ``summary-gate`` file."""

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        if request.prefix.system_prompt == SUMMARY_INSTRUCTIONS and request.context is not None:
            control = control_dir(request.context.root)
            if (control / "summary-gate").exists():
                wait_at_gate(control, "summary")
        return super().stream(request, on_delta)


def compacting_host() -> parley.Host:
    """``workspace_host`` that summarizes a session but its newest turn before a turn
    whose first request passes 10,000 tokens (docs/compaction.md#when); its summaries
    wait at a gate when the test asks (:class:`SummaryGatedModel`)."""
    policy = parley.Compaction(strategy="summarize", threshold=0.5, keep_turns=1, window=20_000)
    host = workspace_host(compaction=policy)
    return dataclasses.replace(host, model=SummaryGatedModel())


def plan_then_act_host() -> parley.Host:
    """``workspace_host`` whose turns run on the example plan-then-act driver
    (``examples/plan_then_act``), which gives up after three steps of acting."""
    from examples.plan_then_act.driver import PlanThenAct

    return workspace_host(driver=PlanThenAct(max_act_steps=3))


def _await_event(arguments: dict[str, Any], _context: ToolContext) -> parley.WaitFor:
    """Parks the turn until the event ``event`` (a host's tool answering WaitFor)."""
    timeout = arguments.get("timeout")
    return parley.WaitFor(arguments["event"], timeout=None if timeout is None else float(timeout))


AWAIT_EVENT = FunctionTool(
    name="await_event",
    description="Waits until the named event is signalled to this turn (or the timeout).",
    parameters={
        "type": "object",
        "properties": {"event": {"type": "string"}, "timeout": {"type": "number"}},
        "required": ["event"],
    },
    function=_await_event,
)


def waiting_host() -> parley.Host:
    """``workspace_host`` with the built-in ``wait`` tool and a tool of its own that
    answers ``parley.WaitFor`` (docs/time.md#waiting-for-an-event)."""
    return parley.Host(
        model=WorkspaceScriptedModel(),
        tools=[*WORKSPACE_TOOLS, WAIT_FOR_GATE, RECORD_CALL, AWAIT_EVENT],
        policy=WorkspacePolicy(),
        approver=WorkspaceApprover(),
        wait_tool=True,
    )


def timeout_host() -> parley.Host:
    """``workspace_host`` whose asked calls are denied as ``timed out`` after two seconds
    without an answer (the fleet's sweeper does it)."""
    return workspace_host(approval_timeout=2.0)


class RecordingHooks(parley.SessionHooks):
    """Writes every hook call to ``<control>/hooks.jsonl`` (of the turns whose host
    context names a ``control`` directory), and raises in the hook the context's
    ``fail`` names: what the failure tests inject and assert on, in any process."""

    def __init__(self) -> None:
        self._turns: dict[str, tuple[Path, str]] = {}

    def _note(self, hook: str, turn_id: str, **seen: Any) -> None:
        control, fail = self._turns.get(turn_id, (None, ""))
        if control is None:
            return
        with (control / "hooks.jsonl").open("a") as log:
            log.write(json.dumps({"hook": hook, "turn_id": turn_id, **seen}) + "\n")
        if fail == hook:
            raise RuntimeError(f"injected failure in {hook}")

    def before_turn(
        self,
        request: parley.TurnRequest,
        options: parley.TurnOptions,
        state: parley.SessionStateView,
    ) -> None:
        context = options.host_context
        if "control" in context:
            self._turns[request.turn_id] = (Path(context["control"]), context.get("fail", ""))
        self._note("before_turn", request.turn_id, attempt=options.attempt)

    def before_commit(self, outcome: parley.TurnOutcome, context: dict[str, Any]) -> None:
        self._note("before_commit", outcome.turn_id, outcome=outcome.outcome, steps=outcome.steps)

    def after_commit(self, receipt: parley.CommitReceipt) -> None:
        outcome = receipt.outcome
        self._note(
            "after_commit",
            outcome.turn_id,
            outcome=outcome.outcome,
            steps=outcome.steps,
            delta=len(receipt.delta),
            host_context=receipt.host_context,
        )

    def on_terminal(self, outcome: parley.TurnOutcome) -> None:
        self._note("on_terminal", outcome.turn_id, outcome=outcome.outcome, steps=outcome.steps)


class InjectingLoop(parley.AgentLoop):
    """parley's own loop, failing where the turn's host context says (``fail``)."""

    def drive(self, turn: parley.DriverTurn) -> None:
        fail = turn.host_context.get("fail")
        if fail == "driver_before_step":
            raise RuntimeError("injected driver crash")
        if fail == "driver_after_step":
            turn.step()
            raise parley.errors.DriverFailed("injected driver failure", partial="half a thought")
        super().drive(turn)


def failing_host() -> parley.Host:
    """``workspace_host`` with recording hooks and a driver that fail on demand."""
    return workspace_host(hooks=RecordingHooks(), driver=InjectingLoop())


def provider_host() -> parley.Host:
    """A host whose model is the OpenAI-compatible server at ``PARLEY_TEST_PROVIDER_URL``
    (the rate-limited provider of the admission tests, tests/providers/), named
    ``openai:gpt-test``, with the client's own retries as shipped: admission must keep
    them from fighting its own."""
    from parley.models.openai_chat import OpenAIChatModel

    model = OpenAIChatModel(
        "gpt-test",
        base_url=os.environ["PARLEY_TEST_PROVIDER_URL"],
        api_key="sk-test-placeholder",
        timeout=30,
    )
    return parley.Host(model=model, tools=WORKSPACE_TOOLS)


def remote_agents_host(**options: Any) -> parley.Host:
    """``workspace_host`` with one remote agent (docs/sub-agents.md#8-remote-agents): the
    ``oracle``, an agent at ``PARLEY_TEST_REMOTE_URL`` (a second parley gateway) reached
    over ``PARLEY_TEST_REMOTE_PROTOCOL`` (``a2a``, the default, or ``mcp``: its ``/mcp``)
    with the token ``PARLEY_TEST_REMOTE_TOKEN`` (``options``: more ``parley.Host``
    arguments)."""
    protocol = os.environ.get("PARLEY_TEST_REMOTE_PROTOCOL", "a2a")
    url = os.environ["PARLEY_TEST_REMOTE_URL"]
    oracle = parley.Agent.remote(
        "oracle",
        f"{url}/mcp" if protocol == "mcp" else url,
        protocol,
        description="Answers one question, somewhere else.",
        token=os.environ["PARLEY_TEST_REMOTE_TOKEN"],
        poll_seconds=0.2,
    )
    return workspace_host(agents=[oracle], **options)
