"""MCP tool sources: specs, the tool adaptor, and real servers (tests/support/mcp_server.py) over
stdio and streamable HTTP, started as subprocesses; plus servers that fail to start."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest

from parley.errors import InvalidRequest, McpError
from parley.mcp import (
    McpConnection,
    McpServer,
    McpTool,
    McpToolbox,
    exposed_name,
    open_toolbox,
    render_result,
)
from parley.mcp.toolbox import _name_tools
from parley.policy import Policy
from parley.ports.host import Access, ToolContext
from parley.remote_mcp import McpRemote, RemoteMcpError
from tests.providers.sink import RecordingSink

SERVER_SCRIPT = str(Path(__file__).resolve().parents[1] / "support" / "mcp_server.py")
CONTEXT = ToolContext(root="/tmp", session_id="s", turn_id="t")
CALL_TIMEOUT = 0.5


def stdio_spec(name: str = "test", **options: Any) -> McpServer:
    """The test server over stdio."""
    options.setdefault("timeout", 15.0)
    options.setdefault("call_timeout", CALL_TIMEOUT)
    return McpServer.stdio(name, [sys.executable, SERVER_SCRIPT, "stdio"], **options)


def process_gone(pid: int) -> bool:
    """True once ``pid`` is neither running nor a zombie (signal 0 reaches a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def free_port() -> int:
    """A loopback port nobody listens on (right now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def stdio_toolbox() -> Iterator[McpToolbox]:
    """One stdio server for the module's calls."""
    with open_toolbox([stdio_spec()]) as toolbox:
        yield toolbox


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """The test server on streamable HTTP, on a free loopback port."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, SERVER_SCRIPT, "http", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                pytest.fail(f"the HTTP test server exited with {process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the HTTP test server did not listen within 15 s")
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.communicate(timeout=10)


@pytest.fixture(scope="module")
def http_toolbox(http_url: str) -> Iterator[McpToolbox]:
    """A toolbox on the HTTP test server."""
    spec = McpServer.http("web", http_url, timeout=10, call_timeout=CALL_TIMEOUT)
    with open_toolbox([spec]) as toolbox:
        yield toolbox


@pytest.fixture(params=["stdio", "http"])
def toolbox(request: pytest.FixtureRequest) -> McpToolbox:
    """Each transport's toolbox in turn."""
    box: McpToolbox = request.getfixturevalue(f"{request.param}_toolbox")
    return box


# ---------------------------------------------------------------------------- specs


def test_specs_round_trip_through_json_and_hash() -> None:
    stdio = McpServer.stdio(
        "files", ["server", "--root", "/srv"], env={"TOKEN": "x"}, cwd="/srv", tool_prefix="f_"
    )
    http = McpServer.http("web", "https://example.com/mcp", headers={"A": "b"}, call_timeout=5)
    for spec in (stdio, http):
        data = json.loads(json.dumps(spec.to_json()))
        assert McpServer.from_json(data) == spec
        assert hash(McpServer.from_json(data)) == hash(spec)
    assert stdio.transport == "stdio" and stdio.command == ("server", "--root", "/srv")
    assert http.transport == "http" and http.per_call_timeout == 5
    assert stdio.per_call_timeout == stdio.timeout == 30.0
    assert http.to_json() == {
        "name": "web",
        "url": "https://example.com/mcp",
        "headers": {"A": "b"},
        "timeout": 30.0,
        "call_timeout": 5,
    }


@pytest.mark.parametrize(
    "data",
    [
        {"name": "x"},  # neither command nor url
        {"name": "x", "command": ["a"], "url": "http://h/mcp"},  # both
        {"name": "bad name", "command": ["a"]},
        {"name": "x", "command": "a b"},  # a string, not argv
        {"name": "x", "command": [""]},
        {"name": "x", "command": ["a", 3]},
        {"name": "x", "command": ["a"], "env": {"A": 1}},
        {"name": "x", "command": ["a"], "headers": {"A": "b"}},
        {"name": "x", "url": "ftp://h/mcp"},
        {"name": "x", "url": "http:///mcp"},
        {"name": "x", "url": "http://h:99999999/mcp"},
        {"name": "x", "url": "http://h/mcp", "cwd": "/"},
        {"name": "x", "command": ["a"], "timeout": 0},
        {"name": "x", "command": ["a"], "timeout": True},
        {"name": "x", "command": ["a"], "call_timeout": float("nan")},
        {"name": "x", "command": ["a"], "tool_prefix": "a.b"},
        {"name": "x", "command": ["a"], "comand": ["a"]},  # a misspelt key
        ["x"],
    ],
)
def test_bad_specs_are_invalid_requests(data: Any) -> None:
    with pytest.raises(InvalidRequest):
        McpServer.from_json(data)


def test_open_toolbox_checks_its_arguments() -> None:
    with pytest.raises(InvalidRequest, match="two MCP servers"):
        open_toolbox([stdio_spec(), stdio_spec()])
    with pytest.raises(InvalidRequest):
        open_toolbox(stdio_spec())  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        open_toolbox([stdio_spec()], timeout=-1)
    with open_toolbox([]) as empty:
        assert empty.tools == () and empty.alive


# ---------------------------------------------------------------------------- the adaptor


def offline_tool(schema: dict[str, Any], name: str = "lookup") -> McpTool:
    """An McpTool on a connection that was never started (for everything but run)."""
    remote = mcp_types.Tool(name=name, description="Look up.", input_schema=schema)
    return McpTool(name=name, remote=remote, connection=McpConnection(stdio_spec("srv")))


def test_parse_checks_plain_constraints_and_leaves_the_rest_to_the_server() -> None:
    tool = offline_tool(
        {
            "type": "object",
            "properties": {
                "key": {"type": "string"},
                "mode": {"enum": ["a", "b"]},
                "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
                "tags": {"type": ["string", "null"]},
                "ref": {"$ref": "#/$defs/Thing"},
            },
            "required": ["key"],
            "additionalProperties": False,
            "$defs": {"Thing": {"type": "object"}},
        }
    )
    assert tool.parse('{"key": "k", "limit": null, "tags": null, "ref": {"x": 1}}')["key"] == "k"
    assert tool.parse('{"key": "k", "limit": 3, "mode": "a"}')["limit"] == 3
    for bad in ('{"limit": 3}', '{"key": 1}', '{"key": "k", "mode": "c"}', '{"key": "k", "z": 1}'):
        with pytest.raises(InvalidRequest):
            tool.parse(bad)
    for malformed in ("{nope", "[1]", '"text"'):
        with pytest.raises(InvalidRequest, match="lookup"):
            tool.parse(malformed)
    assert offline_tool({"type": "object"}).parse("") == {}


def test_declaration_and_policy_accesses() -> None:
    tool = offline_tool({"type": "object"})
    assert tool.declaration.name == "lookup"
    assert tool.declaration.description == "Look up."
    assert tool.declaration.parameters == {"type": "object", "properties": {}}
    assert tool.accesses({}) == (Access(mode="mcp", path="srv/lookup"),)
    with pytest.raises(McpError, match="JSON object"):
        offline_tool({"type": "string"})

    accesses = tool.accesses({})
    refusal = Policy().check("lookup", accesses, "/tmp")  # calls no MCP tool by default
    assert refusal is not None and refusal.rule == "allow_mcp"
    assert Policy(allow_mcp=["**"]).check("lookup", accesses, "/tmp") is None
    assert Policy(allow_mcp=["srv/*"]).check("lookup", accesses, "/tmp") is None
    assert Policy(allow_mcp=["other/*"]).check("lookup", accesses, "/tmp") is not None
    # Globs for command lines admit no MCP tool, and the other way round.
    assert Policy(allow_execute=["**"]).check("lookup", accesses, "/tmp") is not None
    command = [Access(mode="execute", path="mcp:/../../bin/sh -c true")]
    assert Policy(allow_mcp=["**"]).check("run_command", command, "/tmp") is not None
    denied = Policy(allow_mcp=["**"], deny_tools=["lookup"]).check("lookup", accesses, "/")
    assert denied is not None and denied.rule == "deny_tools:lookup"


def test_names_prefix_sanitise_and_refuse_collisions() -> None:
    assert exposed_name("", "add") == "add"
    assert exposed_name("gh_", "repo.get/file") == "gh_repo_get_file"
    assert len(exposed_name("", "x" * 100)) == 64

    def connection(name: str, *tools: str, prefix: str = "") -> McpConnection:
        conn = McpConnection(stdio_spec(name, tool_prefix=prefix))
        conn.tools = tuple(
            mcp_types.Tool(name=tool, input_schema={"type": "object"}) for tool in tools
        )
        return conn

    named = _name_tools([connection("a", "add", "x.y"), connection("b", "add", prefix="b_")], ())
    assert [tool.name for tool in named] == ["add", "x_y", "b_add"]
    assert named[2].accesses({}) == (Access(mode="mcp", path="b/add"),)
    with pytest.raises(McpError, match=r"'add' is taken twice.*tool_prefix"):
        _name_tools([connection("a", "add"), connection("b", "add")], ())
    with pytest.raises(McpError, match="a tool of the host"):
        _name_tools([connection("a", "read_file")], {"read_file"})
    with pytest.raises(McpError, match="taken twice"):
        _name_tools([connection("a", "x.y", "x_y")], ())


def test_results_render_text_and_summarise_the_rest() -> None:
    result = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(text="one"),
            mcp_types.ImageContent(data="AAAA", mime_type="image/png"),
            mcp_types.AudioContent(data="!!", mime_type="audio/wav"),
            mcp_types.ResourceLink(uri="file:///a.txt", name="a.txt", mime_type="text/plain"),
            mcp_types.EmbeddedResource(
                resource=mcp_types.TextResourceContents(uri="mem://n", text="note")
            ),
            mcp_types.EmbeddedResource(
                resource=mcp_types.BlobResourceContents(uri="mem://b", blob="AAAAAA==")
            ),
        ]
    )
    assert render_result(result).splitlines() == [
        "one",
        "[image: image/png, 3 bytes]",
        "[audio: audio/wav, 2 base64 characters]",
        "[resource link: file:///a.txt (a.txt, text/plain)]",
        "[resource mem://n]",
        "note",
        "[resource mem://b: binary, 4 bytes]",
    ]
    structured = mcp_types.CallToolResult(content=[], structured_content={"n": 1})
    assert render_result(structured) == '{"n": 1}'


# ---------------------------------------------------------------------------- live servers


def test_lists_tools_with_their_schemas(toolbox: McpToolbox) -> None:
    names = [tool.name for tool in toolbox.tools]
    assert {"add", "echo", "fail", "slow", "picture"} <= set(names)
    add = toolbox.tool("add").declaration
    assert add.description == "Add two integers."
    assert add.parameters["type"] == "object"
    assert add.parameters["required"] == ["a", "b"]
    assert add.parameters["properties"]["a"]["type"] == "integer"
    with pytest.raises(KeyError):
        toolbox.tool("missing")


def test_calls_return_text(toolbox: McpToolbox) -> None:
    add, echo = toolbox.tool("add"), toolbox.tool("echo")
    assert add.run(add.parse('{"a": 2, "b": 40}'), CONTEXT) == "42"
    assert echo.run(echo.parse('{"text": "héllo\\nworld"}'), CONTEXT) == "héllo\nworld"
    assert toolbox.tool("picture").run({}, CONTEXT) == "[image: image/png, 69 bytes]"


def test_an_error_result_raises_with_the_servers_message(toolbox: McpToolbox) -> None:
    with pytest.raises(McpError, match="fail was asked to fail"):
        toolbox.tool("fail").run({}, CONTEXT)
    # An argument the server rejects (our local check would have caught it) is an error too.
    with pytest.raises(McpError):
        toolbox.tool("add").run({"a": "two", "b": 1}, CONTEXT)
    assert toolbox.tool("add").run({"a": 1, "b": 1}, CONTEXT) == "2"


def test_a_slow_call_times_out_and_the_connection_goes_on(toolbox: McpToolbox) -> None:
    started = time.monotonic()
    with pytest.raises(McpError, match=r"tool 'slow': timed out after 0.5 s"):
        toolbox.tool("slow").run({"seconds": 5}, CONTEXT)
    assert time.monotonic() - started < CALL_TIMEOUT + 1.5
    assert toolbox.tool("echo").run({"text": "still here"}, CONTEXT) == "still here"
    assert toolbox.alive


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_calls_from_several_threads_run_concurrently(
    transport: str, request: pytest.FixtureRequest
) -> None:
    # A call timeout far above the calls' 0.4 s: on a loaded machine four calls at once
    # may each take well over 0.4 s, and this test is about overlap, not timeouts.
    if transport == "stdio":
        spec = stdio_spec(call_timeout=10)
    else:
        spec = McpServer.http("web", request.getfixturevalue("http_url"), call_timeout=10)
    with open_toolbox([spec]) as toolbox:
        slow = toolbox.tool("slow")
        results: list[str] = []
        threads = [
            threading.Thread(target=lambda: results.append(slow.run({"seconds": 0.4}, CONTEXT)))
            for _ in range(4)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
    assert results == ["slept 0.4"] * 4
    assert elapsed < 1.2  # four 0.4 s calls, not one after another (1.6 s)


def test_colliding_tool_names_fail_the_open_and_stop_both_servers(http_url: str) -> None:
    specs = [stdio_spec("one"), McpServer.http("two", http_url)]
    with pytest.raises(McpError, match=r"taken twice.*'one'.*'two'"):
        open_toolbox(specs)
    with pytest.raises(McpError, match="a tool of the host"):
        open_toolbox([McpServer.http("two", http_url)], reserved={"echo"})


def test_servers_open_together_die_alone_and_close_together(http_url: str) -> None:
    specs = [
        stdio_spec("one", tool_prefix="one_"),
        stdio_spec("two", tool_prefix="two_"),
        McpServer.http("web", http_url, tool_prefix="web_", call_timeout=CALL_TIMEOUT),
    ]
    toolbox = open_toolbox(specs)
    assert toolbox.servers == tuple(specs)
    assert toolbox.tool("one_add").run({"a": 1, "b": 2}, CONTEXT) == "3"
    assert toolbox.tool("web_echo").accesses({}) == (Access(mode="mcp", path="web/echo"),)
    pids = [int(toolbox.tool(f"{name}_pid").run({}, CONTEXT)) for name in ("one", "two")]
    assert not any(process_gone(pid) for pid in pids)

    with pytest.raises(McpError, match="MCP server 'two', tool 'crash'"):
        toolbox.tool("two_crash").run({}, CONTEXT)
    with pytest.raises(McpError, match=r"MCP server 'two'.*gone"):
        toolbox.tool("two_add").run({"a": 1, "b": 1}, CONTEXT)
    assert not toolbox.alive
    assert toolbox.tool("one_echo").run({"text": "alive"}, CONTEXT) == "alive"
    assert toolbox.tool("web_echo").run({"text": "alive"}, CONTEXT) == "alive"

    toolbox.close()
    assert all(process_gone(pid) for pid in pids)  # stopped and reaped: no zombie
    with pytest.raises(McpError, match="closed"):
        toolbox.tool("one_add").run({"a": 1, "b": 1}, CONTEXT)
    toolbox.close()  # idempotent


# ---------------------------------------------------------------------------- failing starts


def assert_fails_fast(spec: McpServer, match: str, within: float) -> None:
    """Opening ``spec`` raises McpError matching ``match`` within ``within`` seconds."""
    started = time.monotonic()
    with pytest.raises(McpError, match=match):
        open_toolbox([spec])
    assert time.monotonic() - started < within


def test_a_missing_command_fails_fast() -> None:
    spec = McpServer.stdio("nope", ["parley-no-such-mcp-server"])
    assert_fails_fast(spec, r"'nope' did not start: cannot run 'parley-no-such-mcp-server'", 2)


def test_a_command_that_exits_fails_fast_with_its_stderr() -> None:
    code = "import sys; print('no config found', file=sys.stderr); sys.exit(3)"
    spec = McpServer.stdio("quits", [sys.executable, "-c", code])
    assert_fails_fast(spec, r"'quits' did not start: .*exited.*no config found", 5)


def test_a_server_that_never_answers_times_out() -> None:
    # It reads its stdin to the end without a word, then exits when parley closes it.
    mute = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    spec = McpServer.stdio("mute", mute, timeout=0.5)
    assert_fails_fast(spec, r"'mute' did not start: no answer within 0.5 s", 0.5 + 1.5)


def test_an_unreachable_url_fails_fast() -> None:
    spec = McpServer.http("gone", f"http://127.0.0.1:{free_port()}/mcp", timeout=5)
    assert_fails_fast(spec, r"'gone' did not start: cannot connect to http://127.0.0.1", 2)


def test_one_failed_server_closes_the_others(http_url: str) -> None:
    specs = [McpServer.http("fine", http_url), McpServer.stdio("nope", ["parley-no-such"])]
    with pytest.raises(McpError, match="'nope' did not start") as failure:
        open_toolbox(specs)
    assert "'fine'" not in str(failure.value)


def test_a_remote_mcp_agent_on_a_server_without_tasks_is_refused_before_sending(
    http_url: str,
) -> None:
    """A remote agent over MCP (docs/sub-agents.md#8-remote-agents) handshakes with the
    official SDK's server (a session id, SSE answers) and, since that server runs no tool
    call as a task, refuses it before any call is sent."""
    remote = McpRemote(url=http_url, tool="echo", headers={}, poll_seconds=0.1, timeout_seconds=10)
    sink = RecordingSink()
    with pytest.raises(RemoteMcpError, match="does not run tool calls as tasks"):
        remote.ask("hello", key="turn-1", sink=sink)
    assert sink.log == []
