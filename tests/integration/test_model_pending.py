"""A model whose answer is not ready yet (``ModelPending``, docs/sub-agents.md#8-remote-agents),
on the embedded runtime: the turn lets its worker go between calls (a ``throttled``
event with reason ``pending``, the run queued with its time) and the same call is made
again then, until it answers; an interrupt while it waits so ends the turn cancelled
without calling the model again, and calls the model's ``abandon`` once."""

from __future__ import annotations

import threading
from pathlib import Path

import parley
from parley.ports.host import DeltaSink, ModelPending, ModelReply, ModelRequest
from parley.schemas.events import EventKind
from parley.schemas.records import TurnStatus, Waiting
from tests.support.waiting import wait_until


class PendingModel:
    """Not ready for its first ``pending`` calls (``seconds`` between them), then
    answers ``ready``; records each call and each ``abandon``."""

    name = "pending-model"

    def __init__(self, pending: int, seconds: float) -> None:
        self.pending = pending
        self.seconds = seconds
        self.calls = 0
        self.abandoned: list[str] = []
        self._lock = threading.Lock()

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        with self._lock:
            self.calls += 1
            calls = self.calls
        if calls <= self.pending:
            raise ModelPending("not ready", seconds=self.seconds)
        on_delta("ready")
        return ModelReply(text="ready", model=self.name)

    def abandon(self, request: ModelRequest) -> None:
        assert request.context is not None
        self.abandoned.append(request.context.turn_id)


def test_a_pending_answer_lets_go_and_is_asked_again_until_it_is_ready(tmp_path: Path) -> None:
    model = PendingModel(pending=2, seconds=0.05)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with parley.connect(url, host=parley.Host(model=model), migrate_schema=True) as client:
        result = client.open_session(tmp_path).turn("go", timeout=30)
        assert result.outcome is TurnStatus.FINISHED and result.reply == "ready"
        assert model.calls == 3 and model.abandoned == []
        events = list(client.attach(result.turn_id).events())
        waits = [e.data for e in events if e.kind is EventKind.THROTTLED]
        assert [w["reason"] for w in waits] == ["pending", "pending"]
        assert all(w["model"] == "pending-model" for w in waits)


def test_an_interrupt_while_pending_abandons_the_call_and_does_not_make_it_again(
    tmp_path: Path,
) -> None:
    model = PendingModel(pending=1_000, seconds=30)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with parley.connect(url, host=parley.Host(model=model), migrate_schema=True) as client:
        handle = client.open_session(tmp_path).submit("go")

        def waiting() -> bool:
            record = handle.record()
            return model.calls == 1 and record.waiting_for is Waiting.CAPACITY

        wait_until(waiting, 30, what="the turn let go, its answer pending")
        handle.interrupt()
        result = handle.wait(30)
        assert result.outcome is TurnStatus.CANCELLED
        assert model.calls == 1  # not asked again
        assert model.abandoned == [handle.turn_id]
