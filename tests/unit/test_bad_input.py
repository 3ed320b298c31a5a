"""Bad input to the public API gets a clear parley.errors exception and changes nothing
(the embedded client on SQLite; what the fleet adds is checked in the same client code)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.errors import InvalidRequest
from parley.validation import MAX_JSON_DEPTH

ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[parley.Client]:
    model = parley.models.ScriptedModel({"rules": [ECHO]})
    with parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host=parley.Host(model=model)) as c:
        yield c


def count(client: parley.Client, table: str) -> int:
    with client.store.engine.connect() as db:
        return int(db.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one())


@pytest.mark.parametrize("root", [None, 1, b"/tmp", "", "/tmp\0x"])
def test_a_root_that_is_not_a_path_is_refused(client: parley.Client, root: Any) -> None:
    with pytest.raises(InvalidRequest, match="root"):
        client.open_session(root)
    assert count(client, "sessions") == 0


@pytest.mark.parametrize(
    "metadata", [{"a": {1, 2}}, {"k": math.nan}, {1: 2}, {"t": (1, 2)}, {"big": "x" * 200_000}]
)
def test_metadata_must_come_back_as_it_went_in(
    client: parley.Client, tmp_path: Path, metadata: dict[Any, Any]
) -> None:
    with pytest.raises(InvalidRequest, match="metadata"):
        client.open_session(tmp_path, metadata=metadata)
    assert count(client, "sessions") == 0


def nested(levels: int) -> dict[str, Any]:
    """A JSON object ``levels`` deep (itself level 1)."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def test_metadata_and_context_nest_at_most_max_json_depth_levels(
    client: parley.Client, tmp_path: Path
) -> None:
    deepest = nested(MAX_JSON_DEPTH)
    assert client.open_session(tmp_path, metadata=deepest).metadata == deepest
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    for metadata in (nested(MAX_JSON_DEPTH + 1), nested(256), nested(5_000), cyclic):
        with pytest.raises(InvalidRequest, match=f"metadata must nest .* at most {MAX_JSON_DEPTH}"):
            client.open_session(tmp_path, metadata=metadata)
    assert count(client, "sessions") == 1
    session = client.open_session(tmp_path)
    with pytest.raises(InvalidRequest, match="context must nest"):
        session.submit("hello", context={"list": [nested(MAX_JSON_DEPTH)]})
    assert count(client, "turns") == 0


@pytest.mark.parametrize("title", [None, 7, "", "  ", "x" * 201, "two\nlines", "\x1b[2J"])
def test_a_title_is_one_line_of_text(client: parley.Client, tmp_path: Path, title: Any) -> None:
    if title is not None:
        with pytest.raises(InvalidRequest, match="title"):
            client.open_session(tmp_path, title=title)
        assert count(client, "sessions") == 0
    session = client.open_session(tmp_path, title="Kept")
    with pytest.raises(InvalidRequest, match="title"):
        session.set_title(title)
    assert session.title == "Kept"


def test_a_session_is_titled_by_its_first_prompt_unless_given_one(
    client: parley.Client, tmp_path: Path
) -> None:
    session = client.open_session(tmp_path)
    assert session.title is None
    session.turn("What does\nretry.py do?")
    session.turn("and then?")
    assert session.title == "What does retry.py do?"
    session.set_title("Retries")
    assert client.session(session.id).title == "Retries"
    chosen = client.open_session(tmp_path, title="Chosen")
    chosen.turn("a first prompt")
    assert chosen.title == "Chosen"


def test_turn_checks_its_arguments_before_it_writes(client: parley.Client, tmp_path: Path) -> None:
    session = client.open_session(tmp_path)
    with pytest.raises(InvalidRequest, match="timeout"):
        session.turn("hello", timeout="5")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="on_event"):
        session.turn("hello", on_event=5)  # type: ignore[arg-type]
    assert count(client, "turns") == 0
    handle = session.submit("hello")
    timeouts: list[Any] = ["1", math.nan, {}]
    for timeout in timeouts:
        with pytest.raises(InvalidRequest, match="timeout"):
            handle.wait(timeout=timeout)
    with pytest.raises(InvalidRequest, match="seq"):
        list(handle.events(after=2**70))
    assert handle.wait(30).reply == "heard: hello"


def test_nothing_is_written_once_the_client_is_closed(
    client: parley.Client, tmp_path: Path
) -> None:
    session = client.open_session(tmp_path)
    first = session.turn("one")
    client.close()
    for write in (
        lambda: client.open_session(tmp_path),
        lambda: session.branch_from(first.turn_id),
        lambda: session.submit("two"),
        lambda: session.resume(first.turn_id),
        lambda: client.attach(first.turn_id).say("late"),
        lambda: client.attach(first.turn_id).interrupt(),
    ):
        with pytest.raises(InvalidRequest, match="closed"):
            write()
    assert count(client, "sessions") == 1 and count(client, "turns") == 1


def test_a_host_made_of_the_wrong_pieces_is_refused_when_made() -> None:
    model = parley.models.ScriptedModel({"rules": [ECHO]})

    def plain(path: str) -> str:
        return path

    for pieces in (
        {"tools": [plain]},
        {"tools": None},
        {"tools": parley.tools.read_file},
        {"policy": {"deny_write": ["x"]}},
        {"approver": None},
        {"system_prompt": 5},
        {"tool_output_limit": "x"},
        {"tool_output_limit": 1.5},
    ):
        with pytest.raises(InvalidRequest):
            parley.Host(model=model, **pieces)


def test_connect_wants_a_host_not_its_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="load_host"):
        parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host="tests.support.hosts:host")  # type: ignore[arg-type]


def test_a_tool_must_be_a_plain_function() -> None:
    async def fetch(url: str) -> str:
        return url

    def pages(url: str) -> Any:
        yield url

    for function in (fetch, pages):
        with pytest.raises(InvalidRequest, match="@tool"):
            parley.tool(function)
    with pytest.raises(InvalidRequest, match="description"):
        parley.tool(description=5)(lambda: "x")  # type: ignore[call-overload]
    with pytest.raises(InvalidRequest, match="accesses"):
        parley.tool(accesses=5)(lambda: "x")  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "script",
    [
        None,
        5,
        [ECHO],
        "",
        {"rules": [{**ECHO, "stepz": []}]},
        {"rules": [{"when": ".*", "steps": [{"tool_calls": [{"name": "x", "args": {}}]}]}]},
        {"rules": [{"when": ".*", "steps": [{"text": "x", "delay_ms": math.inf}]}]},
        {"rules": [{"when": ".*", "steps": [{"text": "x", "delay_ms": math.nan}]}]},
    ],
)
def test_a_script_a_user_got_wrong_is_refused_when_loaded(script: Any) -> None:
    # A misspelt key used to be dropped (a call without its arguments); an infinite delay
    # failed the turn with an OverflowError.
    with pytest.raises(InvalidRequest):
        parley.models.ScriptedModel(script)


@pytest.mark.parametrize("spec", [None, 5, "json:loads", "math:pi"])
def test_load_host_names_what_is_wrong_with_its_spec(spec: Any) -> None:
    with pytest.raises(InvalidRequest):
        parley.load_host(spec)
