"""A fleet client when its Redis, the broker too, is down: a submission is stored and
left to the sweeper, and the client says so on one line, not with the broker client's
chained traceback; a turn it follows is read from PostgreSQL meanwhile, the outage said
on one line when it starts and one when it ends."""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import parley
from parley.schemas.events import Event, EventKind
from tests.integration.drive import commit, finish, start
from tests.support.redis_server import RedisServer, running_redis
from tests.support.waiting import wait_until

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


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of the test's own, to stop and start again."""
    with running_redis(tmp_path) as server:
        yield server


def test_a_turn_followed_through_a_redis_outage_is_read_from_the_store_and_logged_twice(
    postgres_url: str,
    workspace: Path,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    address = f"127.0.0.1:{redis_server.port}/0"
    # No worker serves the queue: the test drives the turn itself, committing its step and
    # its end to PostgreSQL as a worker does, while the client's Redis is down.
    queue = f"parley.test.{uuid.uuid4().hex[:8]}"
    with parley.connect(postgres_url, redis_url=redis_server.url, queue=queue) as client:
        handle = client.open_session(workspace).submit("through the outage")
        driving = start(client.store, handle.session_id)
        redis_server.shutdown()

        seen: list[Event] = []
        results: list[parley.TurnResult] = []
        reader = threading.Thread(target=lambda: seen.extend(handle.events()), daemon=True)
        waiter = threading.Thread(target=lambda: results.append(handle.wait()), daemon=True)
        reader.start()
        waiter.start()
        with pytest.raises(parley.errors.WaitTimeout) as timed_out:
            handle.wait(timeout=3)
        message = str(timed_out.value)
        assert message.startswith(
            f"turn {handle.turn_id} did not end within 3s: Redis at {address} is unreachable "
            "(ConnectionError: "
        )
        assert message.endswith("), and the fleet's workers need it to run the turn")

        commit(client.store, driving, 0)
        wait_until(lambda: any(e.kind is EventKind.STEP for e in seen), what="the step, read")
        redis_server.start()
        wait_until(lambda: len(caplog.records) == 2, what="Redis heard again")
        finish(client.store, driving, driving.next_seq + 1)
        reader.join(30)
        waiter.join(30)
        assert not reader.is_alive() and not waiter.is_alive()
    assert [r.reply for r in results] == ["r"]
    assert [e.seq for e in seen] == list(range(1, driving.next_seq + 2))
    assert [e.kind for e in seen][-2:] == [EventKind.STEP, EventKind.END]
    # A reader retries every half second, two readers here, for seconds: two lines in all.
    gone, back = caplog.records
    assert (gone.name, gone.levelno) == ("parley.redis", logging.WARNING)
    assert gone.getMessage().startswith(f"Redis at {address} is unreachable (ConnectionError: ")
    assert gone.getMessage().endswith(
        "): turns wait for the fleet, whose workers need it to run them; their events and ends "
        "are read from the database meanwhile"
    )
    assert back.name == "parley.redis" and back.getMessage().startswith(
        f"Redis at {address} answers again (after "
    )


def test_a_turn_with_a_timeout_raises_at_it_naming_redis_its_events_included(
    postgres_url: str,
    workspace: Path,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    queue = f"parley.test.{uuid.uuid4().hex[:8]}"
    with parley.connect(postgres_url, redis_url=redis_server.url, queue=queue) as client:
        session = client.open_session(workspace)
        redis_server.shutdown()
        seen: list[Event] = []
        began = time.monotonic()
        with pytest.raises(parley.errors.WaitTimeout) as timed_out:
            session.turn("anyone?", on_event=seen.append, timeout=2)
        took = time.monotonic() - began
    # Its events stop at the timeout too (a half-second poll late at most), rather than
    # follow a turn that no worker can run for ever.
    assert 2 <= took < 4, took
    assert f"within 2s: Redis at 127.0.0.1:{redis_server.port}/0 is unreachable" in str(
        timed_out.value
    )
    assert [e.kind for e in seen] == [EventKind.QUEUED]  # read from the store
    kick, gone = (record.getMessage() for record in caplog.records)
    assert kick.startswith(f"could not kick session {session.id} (OperationalError: ")
    assert gone.startswith(f"Redis at 127.0.0.1:{redis_server.port}/0 is unreachable")
