"""Replay (docs/replay.md) through the public client, embedded on both back ends: a
recorded session re-run against another model in a new session marked ``replay_of``; in
``recorded`` mode a call the original made gets its recorded result without running (a
write is checked on disk), an unmatched read-only call runs, any other is answered
without running; ``live`` runs them; the original is unchanged; the report compares the
two turn by turn."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.errors import InvalidRequest
from parley.mcp import McpServer
from parley.models import ScriptedModel
from parley.replay_tools import NOT_RUN
from parley.schemas.records import REPLAY_TURN_KEY
from parley.transcript import InputRow, ToolResultRow, to_json
from tests.acceptance.conftest import ClientFactory
from tests.support.deployments import EMBEDDED, on_deployments

pytestmark = on_deployments(*EMBEDDED)

MCP_SCRIPT = str(Path(__file__).resolve().parents[1] / "support" / "mcp_server.py")


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


ORIGINAL = {
    "rules": [
        {
            "when": "^fix",
            "steps": [
                {
                    "text": "Writing. ",
                    "tool_calls": [
                        tool("write_file", path="notes.txt", content="v1"),
                        tool("read_file", path="retry.py"),
                    ],
                },
                {"text": "fixed"},
            ],
        },
        {"when": "^check", "steps": [{"text": "checked"}]},
    ]
}
CANDIDATE = {
    "rules": [
        {
            "when": "^fix",
            "steps": [
                {
                    "text": "Writing too. ",
                    "tool_calls": [
                        tool("read_file", path="retry.py"),
                        tool("write_file", path="notes.txt", content="v1"),
                        tool("write_file", path="other.txt", content="new"),
                        tool("list_files", path="."),
                    ],
                },
                {"text": "fixed it"},
            ],
        },
        {"when": "^check", "steps": [{"text": "checked"}]},
    ]
}

# A candidate slow to answer the first prompt: a batch of it can be cancelled mid-way.
SLOW = {
    "rules": [
        {"when": "^fix", "steps": [{"text": "x" * 200, "chunk_chars": 1, "delay_ms": 50}]},
        {"when": "^check", "steps": [{"text": "checked"}]},
    ]
}


def recorded_session(make_client: ClientFactory, workspace: Path) -> tuple[parley.Client, str]:
    client = make_client(host=parley.Host(model=ScriptedModel(ORIGINAL, name="scripted-a")))
    session = client.open_session(workspace)
    assert session.turn("fix the notes", timeout=60).outcome == "finished"
    assert session.turn("check them", timeout=60).outcome == "finished"
    assert (workspace / "notes.txt").read_text() == "v1"
    # Changed by hand since: a replay that wrote again would overwrite it.
    (workspace / "notes.txt").write_text("changed since")
    return client, session.id


def results(client: parley.Client, session_id: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for row in client.session(session_id).transcript():
        if isinstance(row, ToolResultRow):
            found.setdefault(row.name, []).append(row.content)
    return found


def test_a_recorded_replay_runs_no_write_again(make_client: ClientFactory, workspace: Path) -> None:
    client, original_id = recorded_session(make_client, workspace)
    before = [to_json(r) for r in client.session(original_id).transcript()]
    replay = client.replay(original_id, model=ScriptedModel(CANDIDATE, name="scripted-b"))
    assert [r.outcome for r in replay.wait(60)] == ["finished", "finished"]

    replayed = client.session(replay.session_id)
    assert replayed.replay_of == original_id
    assert client.session(original_id).replay_of is None
    assert [to_json(r) for r in client.session(original_id).transcript()] == before
    # On disk: the recorded write did not run again, the unmatched one did not run.
    assert (workspace / "notes.txt").read_text() == "changed since"
    assert not (workspace / "other.txt").exists()
    original, again = results(client, original_id), results(client, replay.session_id)
    assert again["write_file"] == [original["write_file"][0], NOT_RUN]
    assert again["read_file"] == original["read_file"]
    assert "retry.py" in again["list_files"][0]  # read-only: it ran
    assert [t.prompt for t in client.store.history(replay.session_id)] == [
        "fix the notes",
        "check them",
    ]

    report = replay.report(scorer=lambda a, b: float(a == b))
    first, second = report["turns"]
    assert report["original"] == original_id and report["replay"] == replay.session_id
    assert (first["original"]["reply"], first["replay"]["reply"]) == ("fixed", "fixed it")
    assert first["tool_calls"]["same"] == [
        {"name": "read_file", "arguments": '{"path": "retry.py"}'},
        {"name": "write_file", "arguments": '{"content": "v1", "path": "notes.txt"}'},
    ]
    assert [c["name"] for c in first["tool_calls"]["added"]] == ["write_file", "list_files"]
    assert first["tool_calls"]["missing"] == [] and first["changed"]
    assert 0 < first["similarity"] < 1 and first["score"] == 0.0
    assert second["similarity"] == 1.0 and second["score"] == 1.0 and not second["changed"]
    assert first["original"]["steps"] == 2 and first["replay"]["models"] == ["scripted-b"]
    assert first["replay"]["cost"] == 0.0
    assert report["totals"]["turns"] == 2 and report["totals"]["changed"] == 1


def test_a_live_replay_runs_the_calls(make_client: ClientFactory, workspace: Path) -> None:
    client, original_id = recorded_session(make_client, workspace)
    replay = client.replay(original_id, model=ScriptedModel(CANDIDATE), tools="live", from_turn=0)
    replay.wait(60)
    assert (workspace / "notes.txt").read_text() == "v1"
    assert (workspace / "other.txt").read_text() == "new"


def test_a_replay_from_a_later_turn_seeds_the_earlier(
    make_client: ClientFactory, workspace: Path
) -> None:
    client, original_id = recorded_session(make_client, workspace)
    replay = client.replay(original_id, from_turn=1, system_prompt="Be brief.")
    assert [r.reply for r in replay.wait(60)] == ["checked"]
    prompts = [t.prompt for t in client.store.history(replay.session_id)]
    assert prompts[-1] == "check them" and len(prompts) == 2
    assert len(replay.report()["turns"]) == 1


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"tools": "sometimes"}, "tools must be"),
        ({"from_turn": 5}, "from_turn 5"),
        ({"from_turn": "nope"}, "from_turn 'nope'"),
        ({"model": 3}, "model must be"),
        ({"system_prompt": 3}, "system_prompt must be"),
    ],
)
def test_a_bad_replay_is_refused(
    make_client: ClientFactory, workspace: Path, given: dict[str, Any], message: str
) -> None:
    client, original_id = recorded_session(make_client, workspace)
    with pytest.raises(InvalidRequest, match=message):
        client.replay(original_id, **given)


def test_steers_are_placed_where_they_entered(make_client: ClientFactory, workspace: Path) -> None:
    """The original turn was steered while its first step's call ran (so the steer
    entered before step 1); the replay's turn takes the same steer before its step 1."""
    clients: list[parley.Client] = []

    @parley.tool
    def note(text: str, context: parley.ToolContext) -> str:
        """Note something.

        Args:
            text: what to note.
        """
        clients[0].attach(context.turn_id).say("and be quick")
        return f"noted {text}"

    script = {
        "rules": [
            {
                "when": "^plan",
                "steps": [
                    {"tool_calls": [tool("note", text="plan")]},
                    {"tool_calls": [tool("note", text="more")]},
                    {"text": "planned"},
                ],
            }
        ]
    }
    host = parley.Host(model=ScriptedModel(script), tools=[*parley.tools.WORKSPACE_TOOLS, note])
    clients.append(make_client(host=host))
    client = clients[0]
    session = client.open_session(workspace)
    assert session.turn("plan it", timeout=60).outcome == "finished"

    def steers(session_id: str) -> list[tuple[int, str]]:
        rows = client.session(session_id).transcript()
        return [(r.step, r.text) for r in rows if isinstance(r, InputRow)]

    recorded = steers(session.id)
    assert recorded[0] == (1, "and be quick")
    replay = client.replay(session.id)
    assert replay.wait(60)[0].reply == "planned"
    # In recorded mode the tool did not run again: the only steers are the placed ones.
    assert steers(replay.session_id) == recorded


def test_a_replay_turn_naming_another_sessions_turn_takes_none_of_its_steers(
    make_client: ClientFactory, workspace: Path
) -> None:
    """A turn of a replay session places the steers of the original turn its host
    context names, but only of a turn of the original session: a context (any client's,
    an HTTP turn's ``context`` too) naming another tenant's turn gets none of its
    steers, so another tenant's words never reach the replay's conversation."""
    clients: list[parley.Client] = []
    said = ["bob's secret plan"]

    @parley.tool
    def note(text: str, context: parley.ToolContext) -> str:
        """Note something.

        Args:
            text: what to note.
        """
        clients[0].attach(context.turn_id).say(said[0])
        return f"noted {text}"

    script = {
        "rules": [
            {
                "when": "^plan",
                "steps": [
                    {"tool_calls": [tool("note", text="plan")]},
                    {"tool_calls": [tool("note", text="more")]},
                    {"text": "planned"},
                ],
            }
        ]
    }
    host = parley.Host(model=ScriptedModel(script), tools=[*parley.tools.WORKSPACE_TOOLS, note])
    clients.append(make_client(host=host))
    client = clients[0]
    bobs = client.open_session(workspace, tenant="bob")
    bob_turn = bobs.submit("plan it")
    assert bob_turn.wait(60).outcome == "finished"
    said[0] = "alice's own words"
    alices = client.open_session(workspace, tenant="alice")
    assert alices.turn("plan it", timeout=60).outcome == "finished"
    replay = client.replay(alices.id)
    replay.wait(60)

    handle = client.session(replay.session_id).submit(
        "plan again", context={REPLAY_TURN_KEY: bob_turn.turn_id}
    )
    assert handle.wait(60).reply == "planned"
    texts = [
        r.text for r in client.session(replay.session_id).transcript() if isinstance(r, InputRow)
    ]
    assert "bob's secret plan" not in texts
    assert texts and set(texts) == {"alice's own words"}


def test_a_model_judges_the_replies(make_client: ClientFactory, workspace: Path) -> None:
    client, original_id = recorded_session(make_client, workspace)
    replay = client.replay(original_id, model=ScriptedModel(CANDIDATE))
    replay.wait(60)
    judge = ScriptedModel({"rules": [{"when": "First answer", "steps": [{"text": "0.75"}]}]})
    assert [t["score"] for t in replay.report(scorer=judge)["turns"]] == [0.75, 0.75]
    # A host judges with its model.
    host = parley.Host(model=judge)
    assert [t["score"] for t in replay.report(scorer=host)["turns"]] == [0.75, 0.75]
    with pytest.raises(InvalidRequest, match="scorer must be"):
        replay.report(scorer=3)


AGENT_SCRIPT = {
    "rules": [
        {
            "when": "^delegate",
            "steps": [
                {"tool_calls": [tool("scribe", task="write the notes")]},
                {"text": "delegated"},
            ],
        },
        {
            "when": "^write the notes",
            "steps": [
                {"tool_calls": [tool("write_file", path="notes.txt", content="v1")]},
                {"text": "written"},
            ],
        },
        {
            "when": "^log",
            "steps": [
                {"tool_calls": [tool("append", path="log.txt", text="entry")]},
                {"text": "logged"},
            ],
        },
    ]
}
AGENT_CANDIDATE = {
    "rules": [
        {
            "when": "^delegate",
            "steps": [
                {
                    "tool_calls": [
                        tool("scribe", task="write the notes"),
                        tool("scribe", task="write more notes"),
                    ]
                },
                {"text": "delegated twice"},
            ],
        },
        {"when": "^write", "steps": [{"text": "a child ran"}]},
        {
            "when": "^log",
            "steps": [
                {
                    "tool_calls": [
                        tool("append", path="log.txt", text="entry"),
                        tool("append", path="log.txt", text="another"),
                    ]
                },
                {"text": "logged twice"},
            ],
        },
    ]
}


def test_a_recorded_replay_answers_agent_and_mcp_calls_without_running_them(
    make_client: ClientFactory, workspace: Path
) -> None:
    """An agent's call that matches a recorded one gets the original child's reply and
    opens no child turn; an MCP tool's gets its recorded result and the server is not
    called; an unmatched call of either runs nowhere (checked on disk)."""
    server = McpServer.stdio(
        "notes", [sys.executable, MCP_SCRIPT, "stdio"], cwd=str(workspace), timeout=20
    )
    host = parley.Host(
        model=ScriptedModel(AGENT_SCRIPT),
        agents=[parley.Agent("scribe", "writes notes")],
        mcp_servers=[server],
        policy=parley.Policy(allow_mcp=["notes/*"]),
    )
    client = make_client(host=host)
    session = client.open_session(workspace)
    delegated = session.turn("delegate the notes", timeout=60)
    assert delegated.reply == "delegated" and len(delegated.children) == 1
    assert session.turn("log it", timeout=60).reply == "logged"
    assert (workspace / "log.txt").read_text() == "entry\n"
    (workspace / "notes.txt").write_text("changed since")

    replay = client.replay(session.id, model=ScriptedModel(AGENT_CANDIDATE))
    first, second = replay.wait(60)
    assert (first.reply, second.reply) == ("delegated twice", "logged twice")
    assert first.children == ()  # no child turn, for the matched call nor the other
    assert [
        row.content
        for row in client.session(replay.session_id).transcript()
        if isinstance(row, ToolResultRow) and row.name == "scribe"
    ] == ["written", NOT_RUN]
    assert results(client, replay.session_id)["append"] == ["appended to log.txt", NOT_RUN]
    # On disk: neither the child's write nor the MCP server's append ran again.
    assert (workspace / "notes.txt").read_text() == "changed since"
    assert (workspace / "log.txt").read_text() == "entry\n"
    client.host.close()  # type: ignore[union-attr]  # (the MCP server)
