"""A model (or host code after it) that fails once a step has streamed: readers are told
to drop that text at once (``step_restarted``, reason ``failed``), so after a resume the
step's tokens still concatenate to exactly its committed text.  A tool's bad output is the
tool's error, not the turn's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import parley
from parley.ports.host import DeltaSink, ModelReply, ModelRequest
from parley.schemas.events import EventKind
from parley.schemas.records import Usage
from parley.tools.base import FunctionTool
from tests.support.events import displayed_text


class BreaksOnce:
    name = "breaks-once"

    def __init__(self) -> None:
        self.calls = 0

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        self.calls += 1
        if self.calls == 1:
            on_delta("Half an ans")
            raise RuntimeError("the provider went away")
        on_delta("Full answer.")
        return ModelReply(text="Full answer.")


def test_a_failed_step_retracts_its_tokens_and_a_resume_reads_cleanly(tmp_path: Path) -> None:
    host = parley.Host(model=BreaksOnce())
    with parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host=host) as client:
        session = client.open_session(str(tmp_path))
        failed = session.turn("hello")
        assert failed.outcome == parley.TurnStatus.FAILED
        resumed = session.resume(failed.turn_id).wait(timeout=30)
        assert resumed.outcome == parley.TurnStatus.FINISHED
        shown = displayed_text(list(client.attach(failed.turn_id).events()))
        assert shown == "Full answer." == resumed.reply
        kinds = [e.kind for e in client.attach(failed.turn_id).events()]
        first_end = kinds.index(EventKind.END)
        assert EventKind.STEP_RESTARTED in kinds[:first_end]  # told before the failure ends


class BadReplyOnce:
    """Streams, then returns a reply the engine cannot use (a host model's bug) once."""

    name = "bad-reply-once"

    def __init__(self) -> None:
        self.calls = 0

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        self.calls += 1
        on_delta("Full answer.")
        usage: Any = None if self.calls == 1 else Usage()
        return ModelReply(text="Full answer.", usage=usage)


def test_a_turn_failed_by_host_code_after_streaming_retracts_its_tokens(tmp_path: Path) -> None:
    # Not the model call itself failing: the engine fails on what host code gave it after
    # the step streamed.  The step never commits, so readers must drop its text before a
    # resume streams it again.
    host = parley.Host(model=BadReplyOnce())
    with parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host=host) as client:
        session = client.open_session(str(tmp_path))
        failed = session.turn("hello")
        assert failed.outcome == parley.TurnStatus.FAILED and failed.steps == 0
        resumed = session.resume(failed.turn_id).wait(timeout=30)
        assert resumed.outcome == parley.TurnStatus.FINISHED
        shown = displayed_text(list(client.attach(failed.turn_id).events()))
        assert shown == "Full answer." == resumed.reply


def test_a_tool_that_returns_no_text_is_the_tools_error_not_the_turns(tmp_path: Path) -> None:
    def broken(_arguments: dict[str, Any], _context: Any) -> str:
        return None  # type: ignore[return-value]  # the host's bug under test

    tool = FunctionTool(
        name="broken", description="", parameters={"type": "object"}, function=broken
    )
    model = parley.models.ScriptedModel(
        {
            "rules": [
                {
                    "when": ".*",
                    "steps": [
                        {"tool_calls": [{"name": "broken"}]},
                        {"text": "noted"},
                    ],
                }
            ]
        }
    )
    host = parley.Host(model=model, tools=[tool])
    with parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host=host) as client:
        result = client.open_session(str(tmp_path)).turn("go")
        results = [
            e.data
            for e in client.attach(result.turn_id).events()
            if e.kind is EventKind.TOOL_RESULT
        ]
    assert result.outcome == parley.TurnStatus.FINISHED and result.reply == "noted"
    assert [(r["content"], r["is_error"]) for r in results] == [
        ("error: the tool returned NoneType, not text", True)
    ]
