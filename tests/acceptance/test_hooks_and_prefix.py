"""Hooks cannot break durability, and the prefix (system prompt and tool declarations) is
frozen after the first committed turn unless explicitly refreshed."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.errors import InvalidRequest, StoreError, TurnEnded
from parley.schemas.events import EventKind
from parley.schemas.messages import Prefix, ToolDeclaration
from tests.acceptance.conftest import ClientFactory
from tests.support.deployments import EMBEDDED, on_deployments
from tests.support.events import displayed_text
from tests.support.helpers import Control, RecordingModel
from tests.support.hosts import WAIT_FOR_GATE

# The hooks under test live in this process.
pytestmark = on_deployments(*EMBEDDED)

ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}


class Recorder:
    """Hooks that record every call and can be told to fail."""

    def __init__(self, *, reject: bool = False, break_after: bool = False) -> None:
        self.reject = reject
        self.break_after = break_after
        self.before_commit_calls: list[str] = []
        self.after_commit_calls: list[parley.CommitReceipt] = []
        self.terminal: list[str] = []

    def before_commit(self, outcome: parley.TurnOutcome, _context: Any) -> None:
        self.before_commit_calls.append(outcome.outcome)
        if self.reject:
            raise ValueError("the transcript would be invalid")

    def after_commit(self, receipt: parley.CommitReceipt) -> None:
        self.after_commit_calls.append(receipt)
        if self.break_after:
            raise RuntimeError("the audit sink is down")

    def on_terminal(self, outcome: parley.TurnOutcome) -> None:
        self.terminal.append(outcome.outcome)
        if self.break_after:
            raise RuntimeError("so is the metrics sink")


def host(hooks: object, rules: list[dict[str, Any]] | None = None, **options: Any) -> parley.Host:
    model = parley.models.ScriptedModel({"rules": rules or [ECHO]})
    return parley.Host(model=model, hooks=hooks, **options)


def test_before_commit_rejects_and_nothing_is_committed(
    make_client: ClientFactory, workspace: Path
) -> None:
    hooks = Recorder()
    client = make_client(host=host(hooks))
    session = client.open_session(workspace)
    kept = session.turn("kept")
    hooks.reject = True
    rejected = session.turn("rejected")

    assert rejected.outcome is parley.TurnStatus.FAILED
    assert rejected.reply is None
    assert rejected.error is not None and "before_commit" in rejected.error
    assert session.head == kept.turn_id
    assert [t.prompt for t in session.history()] == ["kept"]
    assert hooks.before_commit_calls == ["finished", "finished"]
    assert len(hooks.after_commit_calls) == 1  # never for the rejected turn
    assert hooks.terminal == ["finished", "failed"]
    # Not even its answer's step: the hook saw it before it committed (what the answer
    # cost is charged all the same).
    assert rejected.steps == 0 and rejected.usage.total > 0
    kinds = [e.kind for e in client.attach(rejected.turn_id).events()]
    assert kinds.index(EventKind.STEP_RESTARTED) < kinds.index(EventKind.END)  # retracted
    assert EventKind.STEP not in kinds

    # So a resume asks the model again rather than replaying the rejected answer.
    hooks.reject = False
    resumed = session.resume(rejected.turn_id).wait(30)
    assert resumed.outcome is parley.TurnStatus.FINISHED and resumed.steps == 1
    assert hooks.before_commit_calls == ["finished", "finished", "finished"]
    assert session.head == rejected.turn_id


class Verdicts:
    """A before_commit that records the replies it was asked about and rejects the
    first ``rejections`` of them."""

    def __init__(self, rejections: int = 0) -> None:
        self.asked: list[str | None] = []
        self.rejections = rejections

    def before_commit(self, outcome: parley.TurnOutcome, _context: Any) -> None:
        self.asked.append(outcome.reply)
        if len(self.asked) <= self.rejections:
            raise ValueError("not this answer")


def test_before_commit_is_not_asked_about_an_answer_a_steer_keeps_from_being_final(
    make_client: ClientFactory, workspace: Path
) -> None:
    draft = "".join(f"draft{i} " for i in range(40))
    rule = {
        "when": "write",
        "steps": [
            {"text": draft, "chunk_chars": 6, "delay_ms": 10},
            {"text": "final: {last_message}"},
        ],
    }
    hooks = Verdicts()
    client = make_client(host=host(hooks, [rule]))
    handle = client.open_session(workspace).submit("write it")
    for event in handle.events():
        if event.kind is EventKind.TOKEN:
            handle.say("in capitals")  # arrives while the first answer streams
            break
    result = handle.wait(30)
    assert result.reply == "final: in capitals" and result.steps == 2
    assert hooks.asked == ["final: in capitals"]  # never the draft the steer overtook


def test_a_steer_sent_while_before_commit_judges_the_final_answer_is_refused(
    make_client: ClientFactory, workspace: Path
) -> None:
    # The inbox closes before the hook is asked, so the answer it judges is final: a
    # say() meanwhile is told the turn has ended instead of slipping in after the verdict.
    class Deliberates(Verdicts):
        def __init__(self) -> None:
            super().__init__()
            self.entered, self.done = threading.Event(), threading.Event()

        def before_commit(self, outcome: parley.TurnOutcome, context: Any) -> None:
            self.entered.set()
            assert self.done.wait(10)
            super().before_commit(outcome, context)

    hooks = Deliberates()
    client = make_client(host=host(hooks))
    handle = client.open_session(workspace).submit("hello")
    assert hooks.entered.wait(10)
    with pytest.raises(TurnEnded):
        handle.say("one more thing")
    hooks.done.set()
    result = handle.wait(30)
    assert result.reply == "heard: hello" and hooks.asked == ["heard: hello"]
    assert result.undelivered == ()


class AnswersWithoutStreaming:
    """A model that returns its text whole, never through the delta sink."""

    name = "unstreamed"

    def __init__(self) -> None:
        self.calls = 0

    def stream(self, request: Any, on_delta: Any) -> Any:
        self.calls += 1
        return parley.models.ModelReply(text=f"answer {self.calls}")


def test_a_vetoed_answer_that_was_never_streamed_is_still_retracted(
    make_client: ClientFactory, workspace: Path
) -> None:
    # The engine itself sends an unstreamed answer as one token: the veto must retract
    # that too, or a reader would glue the resumed answer to it.  No seq is skipped.
    hooks = Verdicts(rejections=1)
    client = make_client(host=parley.Host(model=AnswersWithoutStreaming(), hooks=hooks))
    session = client.open_session(workspace)
    rejected = session.turn("go")
    assert rejected.outcome is parley.TurnStatus.FAILED
    resumed = session.resume(rejected.turn_id).wait(30)
    assert resumed.reply == "answer 2" and hooks.asked == ["answer 1", "answer 2"]
    events = list(client.attach(rejected.turn_id).events())
    shown = displayed_text(events)
    assert shown == "answer 2"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def test_a_checked_answer_is_judged_before_any_of_it_commits(
    make_client: ClientFactory, workspace: Path
) -> None:
    # A contract's check runs on the final answer before its step commits, so that a
    # before_commit veto keeps nothing of it either, and a resume asks the model again.
    hooks = Verdicts(rejections=1)
    client = make_client(host=parley.Host(model=AnswersWithoutStreaming(), hooks=hooks))
    session = client.open_session(workspace)
    contract = parley.TaskContract(max_steps=3, check="true")
    rejected = session.turn("go", contract=contract)
    assert rejected.outcome is parley.TurnStatus.FAILED and rejected.steps == 0
    assert session.history() == []

    resumed = session.resume(rejected.turn_id).wait(30)
    assert resumed.outcome is parley.TurnStatus.SUCCEEDED
    assert (resumed.reply, resumed.steps) == ("answer 2", 1)
    assert hooks.asked == ["answer 1", "answer 2"]  # never the rejected answer again
    events = list(client.attach(rejected.turn_id).events())
    kinds = [e.kind for e in events]
    assert kinds.count(EventKind.CHECK) == 2 and kinds.count(EventKind.STEP) == 1
    assert kinds.index(EventKind.STEP) > len(kinds) - 1 - kinds[::-1].index(EventKind.CHECK)
    assert displayed_text(events) == "answer 2"


def test_a_turn_whose_end_failed_to_commit_calls_no_after_commit(
    make_client: ClientFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks = Recorder()
    client = make_client(host=host(hooks))
    session = client.open_session(workspace)
    store = client.store
    commit_step = store.commit_step

    def database_gone(**kwargs: Any) -> Any:
        if kwargs.get("end") is not None:
            raise StoreError("the database went away during the commit")
        return commit_step(**kwargs)

    monkeypatch.setattr(store, "commit_step", database_gone)
    handle = session.submit("hello")
    with pytest.raises(StoreError):
        handle.wait(30)
    assert hooks.before_commit_calls == ["finished"]  # asked; then persistence failed
    assert hooks.after_commit_calls == [] and hooks.terminal == []
    assert store.run_state(handle.turn_id).status is parley.TurnStatus.RUNNING  # stranded

    monkeypatch.undo()
    result = session.resume(handle.turn_id).wait(30)
    assert result.outcome is parley.TurnStatus.FINISHED
    assert [r.outcome.turn_id for r in hooks.after_commit_calls] == [handle.turn_id]
    assert hooks.terminal == ["finished"]


def test_observational_hooks_cannot_undo_a_commit(
    make_client: ClientFactory, workspace: Path
) -> None:
    hooks = Recorder(break_after=True)
    client = make_client(host=host(hooks))
    session = client.open_session(workspace)
    result = session.turn("hello")
    assert result.outcome is parley.TurnStatus.FINISHED
    assert result.reply == "heard: hello"
    assert session.head == result.turn_id
    receipt = hooks.after_commit_calls[0]
    assert receipt.outcome.turn_id == result.turn_id and receipt.head_turn_id == result.turn_id
    assert receipt.prefix_generation == 1


def test_cancelled_and_failed_turns_never_call_after_commit(
    make_client: ClientFactory, workspace: Path, control: Control
) -> None:
    hooks = Recorder()
    rules = [
        {"when": "slow", "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "x"}]}
    ]
    client = make_client(host=host(hooks, rules, tools=[WAIT_FOR_GATE]))
    handle = client.open_session(workspace).submit("slow")
    control.wait_entered()
    handle.interrupt()
    control.open_gate()
    assert handle.wait(30).outcome is parley.TurnStatus.CANCELLED

    def broken(_request: parley.models.ModelRequest) -> str:
        raise ConnectionError("no route")

    failing = make_client(host=parley.Host(model=parley.models.FunctionModel(broken), hooks=hooks))
    assert failing.open_session(workspace).turn("x").outcome is parley.TurnStatus.FAILED
    assert hooks.after_commit_calls == []
    assert hooks.before_commit_calls == []
    assert hooks.terminal == ["cancelled", "failed"]


def test_an_interrupt_sent_while_the_previous_turn_winds_up_stops_the_next_before_a_step(
    make_client: ClientFactory, workspace: Path
) -> None:
    ran: list[str] = []

    @parley.tool
    def launch() -> str:
        """Do something that cannot be undone."""
        ran.append("launched")
        return "launched"

    class SlowTerminal:
        """The first turn waits until the second is queued (so its final transaction
        claims it), then its observational hook takes its time."""

        def __init__(self) -> None:
            self.queued, self.entered, self.gate = (threading.Event() for _ in range(3))

        def before_turn(self, request: Any, _options: Any, _state: Any) -> None:
            if request.prompt == "one":
                assert self.queued.wait(10)

        def on_terminal(self, outcome: parley.TurnOutcome) -> None:
            if outcome.reply == "ok" and not self.entered.is_set():
                self.entered.set()
                self.gate.wait(10)

    hooks = SlowTerminal()
    rules: list[dict[str, Any]] = [
        {"when": "^two", "steps": [{"tool_calls": [{"name": "launch"}]}, {"text": "done"}]},
        {"when": ".*", "steps": [{"text": "ok"}]},
    ]
    client = make_client(host=host(hooks, rules, tools=[launch]))
    session = client.open_session(workspace)
    session.submit("one")
    second = session.submit("two")
    hooks.queued.set()
    assert hooks.entered.wait(10)  # the first turn committed, and claimed the second
    second.interrupt()
    hooks.gate.set()
    result = second.wait(30)
    assert result.outcome is parley.TurnStatus.CANCELLED
    assert result.steps == 0 and ran == []  # stopped at its first boundary


def test_the_prefix_is_frozen_after_the_first_committed_turn(
    make_client: ClientFactory, workspace: Path
) -> None:
    first_model = RecordingModel(parley.models.ScriptedModel({"rules": [ECHO]}))
    client = make_client(host=parley.Host(model=first_model, system_prompt="You are v1."))
    session = client.open_session(workspace)
    session.turn("one")
    frozen = first_model.requests[0].prefix

    # A new deployment with another system prompt and fewer tools: the session keeps the
    # prefix it froze, byte for byte, so provider prompt caches keep hitting.
    second_model = RecordingModel(parley.models.ScriptedModel({"rules": [ECHO]}))
    later = make_client(
        host=parley.Host(
            model=second_model, system_prompt="You are v2.", tools=[parley.tools.read_file]
        )
    )
    later.session(session.id).turn("two")
    assert second_model.requests[0].prefix.canonical_bytes() == frozen.canonical_bytes()
    assert frozen.system_prompt == "You are v1."


class PrefixHooks:
    """before_turn that offers a prefix snapshot."""

    def __init__(self) -> None:
        self.snapshot: parley.PrefixSnapshot | None = None
        self.views: list[Any] = []

    def before_turn(self, request: Any, options: Any, state: Any) -> parley.TurnPreparation | None:
        self.views.append(state)
        if self.snapshot is None:
            return None
        return parley.TurnPreparation(prefix=self.snapshot)


def test_before_turn_sets_the_initial_prefix_and_refreshes_only_explicitly(
    make_client: ClientFactory, workspace: Path
) -> None:
    hooks = PrefixHooks()
    model = RecordingModel(parley.models.ScriptedModel({"rules": [ECHO]}))
    client = make_client(host=parley.Host(model=model, hooks=hooks))
    session = client.open_session(workspace)
    tools = [ToolDeclaration(name="read_file", description="read", parameters={"type": "object"})]

    hooks.snapshot = parley.PrefixSnapshot.initial("Initial prompt.", tools)
    session.turn("one")
    assert model.requests[-1].prefix == Prefix(system_prompt="Initial prompt.", tools=tuple(tools))

    hooks.snapshot = parley.PrefixSnapshot.initial("Sneaky replacement.", tools)
    refused = session.turn("two")
    assert refused.outcome is parley.TurnStatus.FAILED
    assert refused.error is not None and refused.error.startswith("PrefixFrozen")

    hooks.snapshot = parley.PrefixSnapshot.refreshing("Refreshed prompt.", tools)
    assert session.turn("three").outcome is parley.TurnStatus.FINISHED
    assert model.requests[-1].prefix.system_prompt == "Refreshed prompt."
    hooks.snapshot = None
    session.turn("four")
    assert model.requests[-1].prefix.system_prompt == "Refreshed prompt."
    # Refresh keeps every conversation row: the model still sees the whole path.
    prompts = [getattr(m, "text", None) for m in model.requests[-1].messages if m.role == "user"]
    assert prompts == ["one", "three", "four"]
    assert hooks.views[-1].prefix.system_prompt == "Refreshed prompt."


def test_a_turn_claimed_by_the_first_turns_commit_sees_the_prefix_it_froze(
    make_client: ClientFactory, workspace: Path
) -> None:
    tools = [ToolDeclaration(name="read_file", description="read", parameters={"type": "object"})]
    views: list[Any] = []
    queued = threading.Event()

    class PromptedPrefix:
        """The first turn offers the initial prefix once the second is queued (so its
        final transaction claims the second); the second offers another one."""

        def before_turn(self, request: Any, _options: Any, state: Any) -> parley.TurnPreparation:
            views.append(state)
            if request.prompt == "one":
                assert queued.wait(10)
            prompt = "Initial prompt." if request.prompt == "one" else "Sneaky replacement."
            return parley.TurnPreparation(prefix=parley.PrefixSnapshot.initial(prompt, tools))

    model = RecordingModel(parley.models.ScriptedModel({"rules": [ECHO]}))
    client = make_client(host=parley.Host(model=model, hooks=PromptedPrefix()))
    session = client.open_session(workspace)
    first = session.submit("one")
    second = session.submit("two")  # claimed in the transaction that freezes the prefix
    queued.set()
    assert first.wait(30).outcome is parley.TurnStatus.FINISHED
    refused = second.wait(30)
    assert views[1].prefix == Prefix(system_prompt="Initial prompt.", tools=tuple(tools))
    assert refused.outcome is parley.TurnStatus.FAILED
    assert refused.error is not None and refused.error.startswith("PrefixFrozen")


def test_before_turn_that_raises_fails_the_turn_cleanly(
    make_client: ClientFactory, workspace: Path
) -> None:
    class Broken:
        def before_turn(self, *_args: Any) -> None:
            raise KeyError("tenant")

    client = make_client(host=host(Broken()))
    session = client.open_session(workspace)
    result = session.turn("x")
    assert result.outcome is parley.TurnStatus.FAILED
    assert result.error is not None and "before_turn failed" in result.error
    assert session.head is None


def test_a_host_needs_a_model_with_stream() -> None:
    with pytest.raises(InvalidRequest):
        parley.Host(model=object())  # type: ignore[arg-type]
