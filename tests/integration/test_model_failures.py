"""A model that fails after streaming part of its answer: readers are told to drop that
text at once (``step_restarted``, reason ``failed``), so after a resume the step's tokens
still concatenate to exactly its committed text."""

from __future__ import annotations

from pathlib import Path

import parley
from schemas.events import EventKind
from workers.ports import DeltaSink, ModelReply, ModelRequest


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
        shown = ""
        for event in client.attach(failed.turn_id).events():
            if event.kind is EventKind.STEP_RESTARTED:
                shown = ""
            elif event.kind is EventKind.TOKEN:
                shown += event.data["text"]
        assert shown == "Full answer." == resumed.reply
        kinds = [e.kind for e in client.attach(failed.turn_id).events()]
        first_end = kinds.index(EventKind.END)
        assert EventKind.STEP_RESTARTED in kinds[:first_end]  # told before the failure ends
