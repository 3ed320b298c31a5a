"""Embedded clients in one process: two on one database share its sessions safely, and a
session whose driver thread fails while a submission arrives still gets a driver."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

import parley
import parley.kickers as kickers
from parley.engine.turn_engine import TurnEngine
from parley.kickers import EmbeddedKicker
from parley.schemas.events import EventKind


class GatedModel:
    """Answers every request; the first one waits for the gate."""

    name = "gated"

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.entered, self.gate = threading.Event(), threading.Event()

    def stream(self, request: Any, on_delta: Any) -> Any:
        self.prompts.append(request.messages[-1].text)
        if len(self.prompts) == 1:
            self.entered.set()
            assert self.gate.wait(10)
        on_delta("ok")
        return parley.models.ModelReply(text="ok")


def test_a_second_client_on_the_same_database_never_takes_over_a_running_turn(
    tmp_path: Path,
) -> None:
    model = GatedModel()
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with (
        parley.connect(url, host=parley.Host(model=model)) as first_client,
        parley.connect(url, host=parley.Host(model=model)) as second_client,
    ):
        session = first_client.open_session(tmp_path)
        first = session.submit("one")
        assert model.entered.wait(10)
        second = second_client.session(session.id).submit("two")
        time.sleep(0.3)  # room for the second client's driver to (wrongly) take over
        model.gate.set()
        assert first.wait(30).outcome is parley.TurnStatus.FINISHED
        assert second_client.attach(second.turn_id).wait(30).outcome is parley.TurnStatus.FINISHED
        assert model.prompts == ["one", "two"]  # each asked once, in order
        kinds = [e.kind for e in first_client.attach(first.turn_id).events()]
        assert EventKind.STEP_RESTARTED not in kinds


def test_a_kick_that_meets_a_failing_driver_gets_a_driver_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drives: list[str] = []
    second_drive = threading.Event()

    class FailsOnce:
        def __init__(self, _engine: object, **_options: object) -> None:
            pass

        def drive(self, session_id: str) -> None:
            drives.append(session_id)
            if len(drives) == 1:
                raise RuntimeError("the database went away")
            second_drive.set()

    engine = SimpleNamespace(host=SimpleNamespace(approval_timeout=None))
    kicker = EmbeddedKicker(lambda: cast(TurnEngine, engine))

    class SubmissionDuringTheFailure:
        """The log line the failing driver writes, with a submission landing meanwhile."""

        @staticmethod
        def exception(*_args: object) -> None:
            kicker.kick("s1")

    monkeypatch.setattr(kickers, "SessionDrainer", FailsOnce)
    monkeypatch.setattr(kickers, "log", SubmissionDuringTheFailure)
    kicker.kick("s1")
    assert second_drive.wait(10), "the submission was left without a driver"
    assert drives == ["s1", "s1"]


def test_no_driver_starts_after_close(monkeypatch: pytest.MonkeyPatch) -> None:
    drives: list[str] = []

    class Records:
        def __init__(self, _engine: object, **_options: object) -> None:
            pass

        def drive(self, session_id: str) -> None:
            drives.append(session_id)

    monkeypatch.setattr(kickers, "SessionDrainer", Records)
    engine = SimpleNamespace(host=SimpleNamespace(approval_timeout=None))
    kicker = EmbeddedKicker(lambda: cast(TurnEngine, engine))
    ready = kicker.ready

    def closed_right_after_the_check() -> None:
        ready()
        kicker.close(wait=True, timeout=None)  # another thread closes the client here

    monkeypatch.setattr(kicker, "ready", closed_right_after_the_check)
    with pytest.raises(parley.errors.InvalidRequest, match="closed"):
        kicker.kick("s1")
    time.sleep(0.1)
    assert drives == []
