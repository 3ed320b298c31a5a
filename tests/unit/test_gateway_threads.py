"""``src/parley/gateway/threads.py``: a protocol's thread or chat id names one session per
tenant, found the same way by every process, created once even when two requests race,
and an id that is one of the tenant's session ids names that session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import parley
from parley.errors import InvalidRequest
from parley.gateway import threads
from parley.gateway.threads import (
    check_external_id,
    derived_session_id,
    find_thread,
    message_request_id,
    open_thread,
)
from parley.validation import MAX_REQUEST_ID
from tests.support.helpers import scripted_host


@pytest.fixture
def client(tmp_path: Path) -> Iterator[parley.Client]:
    host = scripted_host([{"when": ".*", "steps": [{"text": "ok"}]}])
    with parley.connect(f"sqlite:///{tmp_path / 'parley.db'}", host=host) as client:
        yield client


def test_the_session_id_is_a_pure_function_of_tenant_and_id() -> None:
    assert derived_session_id("alice", "t1") == derived_session_id("alice", "t1")
    assert derived_session_id("alice", "t1") != derived_session_id("bob", "t1")
    assert derived_session_id("alice", "t1") != derived_session_id("alice", "t2")
    # The formula, and its namespace, are fixed for good: this value must never change
    # (every thread a client has open would lose its session).  Neither a tenant nor an
    # external id can hold the NUL that separates them.
    assert derived_session_id("alice", "t1") == str(uuid.uuid5(threads.NAMESPACE, "alice\x00t1"))
    assert derived_session_id("alice", "t1") == "5966aa83-c1c1-5ed9-8735-0c743426d112"


def test_a_thread_is_created_once_then_continued(client: parley.Client, tmp_path: Path) -> None:
    workspaces = tmp_path / "workspaces"
    assert find_thread(client, "alice", "t1") is None
    first = open_thread(client, workspaces, "alice", "t1", metadata={"via": "test"})
    assert first.created
    assert first.session.id == derived_session_id("alice", "t1")
    assert first.session.tenant == "alice"
    assert first.session.metadata == {"via": "test"}
    assert Path(first.session.root) == (workspaces / "alice" / first.session.id).resolve()
    again = open_thread(client, workspaces, "alice", "t1")
    assert (again.created, again.session.id) == (False, first.session.id)
    other = open_thread(client, workspaces, "bob", "t1")
    assert other.created and other.session.id != first.session.id
    assert other.session.tenant == "bob"


def test_a_create_that_loses_a_race_continues_the_winners_session(
    client: parley.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspaces = tmp_path / "workspaces"
    winner = open_thread(client, workspaces, "alice", "t1")
    # The loser looked before the winner inserted: its insert is a Conflict.
    monkeypatch.setattr(threads, "find_thread", lambda *_args: None)
    loser = open_thread(client, workspaces, "alice", "t1")
    assert (loser.created, loser.session.id) == (False, winner.session.id)


def test_an_id_that_is_the_tenants_session_names_that_session(
    client: parley.Client, tmp_path: Path
) -> None:
    workspaces = tmp_path / "workspaces"
    native = client.open_session(tmp_path, tenant="alice")
    found = open_thread(client, workspaces, "alice", native.id)
    assert (found.created, found.session.id) == (False, native.id)
    # Another tenant naming it gets a session of its own.
    theirs = open_thread(client, workspaces, "bob", native.id)
    assert theirs.created and theirs.session.id == derived_session_id("bob", native.id)


@pytest.mark.parametrize("bad", ["", "x" * (threads.MAX_EXTERNAL_ID + 1), "a\x00b", 7, None])
def test_an_id_that_cannot_name_a_thread_is_refused(bad: object) -> None:
    with pytest.raises(InvalidRequest):
        check_external_id(bad)


def test_a_messages_request_id_is_stable_bounded_and_changes_with_its_text() -> None:
    one = message_request_id("ag-ui", "m1", "hello")
    assert one == message_request_id("ag-ui", "m1", "hello")
    assert one != message_request_id("ag-ui", "m1", "hello!")
    assert one != message_request_id("ai-sdk", "m1", "hello")
    long = message_request_id("ag-ui", "m" * 1000, "hello")
    assert len(long) <= MAX_REQUEST_ID
    assert long != message_request_id("ag-ui", "m" * 999, "hello")
