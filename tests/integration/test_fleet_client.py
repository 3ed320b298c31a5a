"""A fleet client when its Redis, the broker too, is down: a submission is stored and
left to the sweeper, and the client says so on one line, not with the broker client's
chained traceback."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

import parley

pytestmark = pytest.mark.postgres


def test_a_client_whose_broker_is_down_warns_on_one_line_and_the_turn_stays_queued(
    postgres_url: str, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as probe:  # a port that nothing listens on once this is closed
        probe.bind(("127.0.0.1", 0))
        nowhere = f"redis://127.0.0.1:{probe.getsockname()[1]}/0"
    caplog.set_level(logging.WARNING)
    with parley.connect(postgres_url, redis_url=nowhere, queue="parley.test.nowhere") as client:
        handle = client.open_session(workspace).submit("is anyone there?")
        assert handle.record().status is parley.TurnStatus.QUEUED
    [record] = caplog.records
    line = record.getMessage()
    assert record.name == "parley.client" and record.levelno == logging.WARNING
    assert line.startswith(f"could not kick session {handle.session_id} (OperationalError: ")
    assert "Connection refused" in line and line.endswith("; the sweeper will")
    assert record.exc_info is None and "\n" not in caplog.text.rstrip("\n")
