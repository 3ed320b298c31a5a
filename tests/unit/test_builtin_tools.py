"""The built-in ``run_command`` and ``search_files`` tools, the policy's view of them
(execute accesses, glob reads), and a real embedded turn through decorated tools."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.errors import InvalidRequest
from parley.policy import Policy
from parley.ports.host import Access, ToolContext
from parley.schemas.events import EventKind
from parley.tools import WORKSPACE_TOOLS, FunctionTool, command_tool, run_command, search_files
from parley.tools import commands as commands_module
from parley.tools import search as search_module
from parley.tools.base import validate


@pytest.fixture
def root(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


@pytest.fixture
def context(root: Path) -> ToolContext:
    return ToolContext(root=str(root), session_id="s", turn_id="t")


def parse(tool: FunctionTool, arguments: dict[str, Any]) -> dict[str, Any]:
    return tool.parse(json.dumps(arguments))


def call(tool: FunctionTool, arguments: dict[str, Any], context: ToolContext) -> str:
    parsed = parse(tool, arguments)
    tool.accesses(parsed)  # what the engine does first: its errors come before the run
    result = tool.run(parsed, context)
    assert isinstance(result, str)  # (a WaitFor parks a turn: none of these tools waits)
    return result


def refusal(
    policy: Policy, tool: FunctionTool, arguments: dict[str, Any], root: Path
) -> str | None:
    """The rule that refuses the call, as the engine asks the policy; None if allowed."""
    name = tool.declaration.name
    found = policy.check(name, tuple(tool.accesses(parse(tool, arguments))), str(root))
    return None if found is None else found.rule


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def alive(pid: int) -> bool:
    """Running (a zombie that nobody reaped yet does not count)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


# ---------------------------------------------------------------------------- toolbox


def test_search_is_in_the_default_toolbox_and_run_command_is_not() -> None:
    names = [t.declaration.name for t in WORKSPACE_TOOLS]
    assert "search_files" in names
    assert "run_command" not in names
    assert parley.tools.run_command is run_command


# ---------------------------------------------------------------------------- run_command


def test_run_command_reports_exit_code_and_merged_output(context: ToolContext) -> None:
    output = call(run_command, {"argv": ["sh", "-c", "echo out; echo err >&2; exit 3"]}, context)
    assert output.splitlines() == [
        "[exit code 3]",
        "$ sh -c 'echo out; echo err >&2; exit 3'",
        "out",
        "err",
    ]
    assert call(run_command, {"argv": ["true"]}, context) == "[exit code 0]\n$ true"


def test_run_command_reports_a_signal(context: ToolContext) -> None:
    output = call(run_command, {"argv": ["sh", "-c", "kill -9 $$"]}, context)
    assert output.startswith("[killed by signal 9")


def test_argv_never_goes_through_a_shell(root: Path, context: ToolContext) -> None:
    code = "import sys; print(sys.argv[1:])"
    arguments = ["a; touch pwned", "$(touch pwned2)", "*", "|", "`id`", "$HOME"]
    output = call(run_command, {"argv": python(code, *arguments)}, context)
    assert output.splitlines()[-1] == repr(arguments)
    assert sorted(p.name for p in root.iterdir()) == []


def test_the_access_is_the_quoted_command_line() -> None:
    accesses = run_command.accesses(parse(run_command, {"argv": ["ls", "a b", "c;d"]}))
    assert tuple(accesses) == (Access(mode="execute", path="ls 'a b' 'c;d'"),)


def test_the_default_policy_refuses_run_command_and_an_allow_lets_it_through(
    root: Path,
) -> None:
    arguments = {"argv": ["pytest", "-q", "tests/unit"]}
    assert refusal(Policy(), run_command, arguments, root) == "allow_execute"
    assert refusal(Policy(allow_execute=["pytest **"]), run_command, arguments, root) is None
    # '*' stops at '/', as for paths; '**' does not.
    assert refusal(Policy(allow_execute=["pytest *"]), run_command, arguments, root) == (
        "allow_execute"
    )
    assert refusal(Policy(allow_execute=["git **"]), run_command, arguments, root) == (
        "allow_execute"
    )
    # An argument cannot pose as a separate command: it is quoted.
    sneaky = {"argv": ["echo", "x; rm -rf /"]}
    assert refusal(Policy(allow_execute=["echo x*"]), run_command, sneaky, root) == (
        "allow_execute"
    )
    assert refusal(Policy(deny_tools=["run_command"]), run_command, arguments, root) == (
        "deny_tools:run_command"
    )


def test_timeout_kills_the_process_group(root: Path, context: ToolContext) -> None:
    started = time.monotonic()
    output = call(
        run_command,
        {"argv": ["sh", "-c", "sleep 60 & echo $! > child.pid; echo started; wait"], "timeout": 1},
        context,
    )
    assert time.monotonic() - started < 10
    assert output.startswith("[timed out after 1 s; the process group was killed]")
    assert "started" in output
    child = int((root / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_a_command_ignoring_sigterm_is_killed(
    context: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commands_module, "KILL_GRACE_SECONDS", 0.2)
    started = time.monotonic()
    output = call(
        run_command, {"argv": ["sh", "-c", "trap '' TERM; sleep 60"], "timeout": 1}, context
    )
    assert output.startswith("[timed out after 1 s")
    assert time.monotonic() - started < 10


def test_processes_left_behind_are_killed(root: Path, context: ToolContext) -> None:
    # The command exits at once; its background child would hold the pipe (and live on).
    output = call(run_command, {"argv": ["sh", "-c", "sleep 60 & echo $! > child.pid"]}, context)
    assert output.startswith("[exit code 0]")
    child = int((root / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_output_is_capped_keeping_head_and_tail(context: ToolContext) -> None:
    tool = command_tool(output_limit=100)
    code = "print('H' * 50 + 'M' * 10000 + 'T' * 50, end='')"
    output = call(tool, {"argv": python(code)}, context)
    lines = output.splitlines()
    assert lines[0] == "[exit code 0]"
    assert lines[2] == "H" * 50
    assert lines[3] == "[… output truncated: 10000 of 10100 bytes omitted …]"
    assert lines[4] == "T" * 50
    small = call(tool, {"argv": python("print('x' * 100, end='')")}, context)
    assert small.splitlines()[-1] == "x" * 100


def test_output_of_a_large_command_is_drained_not_buffered(context: ToolContext) -> None:
    # 20 MB through a 16 kB capture: the command is not blocked on a full pipe and the
    # tool keeps only its bound.
    code = "import sys\nfor _ in range(20): sys.stdout.write('y' * 1_000_000)"
    output = call(run_command, {"argv": python(code)}, context)
    assert output.startswith("[exit code 0]")
    assert "20000000 bytes" in output
    assert len(output) < 20_000


def test_cwd_is_confined_to_the_root(root: Path, context: ToolContext, tmp_path: Path) -> None:
    (root / "sub").mkdir()
    (root / "file.txt").write_text("")
    (root / "out").symlink_to(tmp_path)
    output = call(run_command, {"argv": ["pwd"], "cwd": "sub"}, context)
    assert output.splitlines() == [
        "[exit code 0]",
        "$ pwd  (in sub)",
        str((root / "sub").resolve()),
    ]
    assert call(run_command, {"argv": ["pwd"]}, context).splitlines()[-1] == str(root.resolve())
    for cwd in ("..", "/tmp", "sub/../..", "out"):
        with pytest.raises(InvalidRequest):
            call(run_command, {"argv": ["pwd"], "cwd": cwd}, context)
    with pytest.raises(InvalidRequest, match="not a directory"):
        call(run_command, {"argv": ["pwd"], "cwd": "file.txt"}, context)


def test_the_environment_is_an_allow_list(
    context: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARLEY_TEST_SECRET", "hunter2")
    code = "import os; print(sorted(os.environ))"
    names = call(run_command, {"argv": python(code)}, context).splitlines()[-1]
    assert "PARLEY_TEST_SECRET" not in names and "PATH" in names
    inherit = command_tool(environment=os.environ)
    assert "PARLEY_TEST_SECRET" in call(inherit, {"argv": python(code)}, context)


def test_a_missing_program_is_an_error(context: ToolContext) -> None:
    with pytest.raises(FileNotFoundError, match="command not found: 'no-such-program-x'"):
        call(run_command, {"argv": ["no-such-program-x"]}, context)


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param({}, id="no-argv"),
        pytest.param({"argv": "ls -l"}, id="string-not-argv"),
        pytest.param({"argv": []}, id="empty-argv"),
        pytest.param({"argv": [""]}, id="empty-program"),
        pytest.param({"argv": ["ls", 1]}, id="non-string-argument"),
        pytest.param({"argv": ["ls"], "timeout": 0}, id="zero-timeout"),
        pytest.param({"argv": ["ls"], "timeout": 100_000}, id="timeout-over-the-cap"),
        pytest.param({"argv": ["ls"], "shell": True}, id="no-shell-option"),
    ],
)
def test_run_command_arguments_are_validated(arguments: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        parse(run_command, arguments)


def test_command_tool_settings_are_checked() -> None:
    with pytest.raises(InvalidRequest):
        command_tool(default_timeout=0)
    with pytest.raises(InvalidRequest):
        command_tool(default_timeout=100, max_timeout=10)
    with pytest.raises(InvalidRequest):
        command_tool(output_limit=1)
    tool = command_tool(name="sh_run", max_timeout=5, default_timeout=2)
    assert tool.declaration.name == "sh_run"
    assert tool.declaration.parameters["properties"]["timeout"]["maximum"] == 5


# ---------------------------------------------------------------------------- search_files


@pytest.fixture
def tree(root: Path) -> Path:
    write(
        root,
        {
            "src/app.py": "import os\n\ndef main():\n    return TODO\n",
            "src/util/helpers.py": "# todo: tidy\nVALUE = 1\n",
            "docs/guide.md": "TODO: write the guide\n",
            "secrets/token.txt": "TODO rotate tok-123\n",
            "image.png": b"\x89PNG\x00\x00TODO",
            ".git/config": "TODO in git\n",
            "node_modules/x/index.js": "TODO in a dependency\n",
        },
    )
    return root


def test_search_finds_lines_as_path_line_text(tree: Path, context: ToolContext) -> None:
    assert call(search_files, {"pattern": "TODO"}, context).splitlines() == [
        "docs/guide.md:1: TODO: write the guide",
        "secrets/token.txt:1: TODO rotate tok-123",
        "src/app.py:4:     return TODO",
    ]
    assert call(search_files, {"pattern": r"^def \w+\("}, context) == "src/app.py:3: def main():"


def test_search_options(tree: Path, context: ToolContext) -> None:
    found = call(search_files, {"pattern": "todo", "ignore_case": True, "path": "src"}, context)
    assert found.splitlines() == [
        "src/app.py:4:     return TODO",
        "src/util/helpers.py:1: # todo: tidy",
    ]
    by_glob = call(search_files, {"pattern": "TODO|todo", "glob": "*.md"}, context)
    assert by_glob == "docs/guide.md:1: TODO: write the guide"
    # A glob with a slash is relative to path.
    nested = call(search_files, {"pattern": "=", "path": "src", "glob": "util/*.py"}, context)
    assert nested == "src/util/helpers.py:2: VALUE = 1"
    one_file = call(search_files, {"pattern": "import", "path": "src/app.py"}, context)
    assert one_file == "src/app.py:1: import os"
    assert call(search_files, {"pattern": "nothing like this"}, context) == "(no matches)"


def test_search_skips_binary_files_and_tool_directories(tree: Path, context: ToolContext) -> None:
    output = call(search_files, {"pattern": "TODO"}, context)
    assert "image.png" not in output and ".git" not in output and "node_modules" not in output


def test_search_is_bounded_and_says_so(
    root: Path, context: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(root, {"a.txt": "hit\n" * 5, "b.txt": "hit " + "x" * 1000 + " hit\n"})
    two = call(search_files, {"pattern": "hit", "max_results": 2}, context).splitlines()
    assert two[:2] == ["a.txt:1: hit", "a.txt:2: hit"]
    assert two[2].startswith("[stopped at 2 matches")
    exact = call(search_files, {"pattern": "hit", "max_results": 5, "glob": "a.txt"}, context)
    assert "stopped" not in exact and len(exact.splitlines()) == 5
    long_line = call(search_files, {"pattern": "hit", "path": "b.txt"}, context)
    assert long_line.startswith("b.txt:1: hit xxx") and long_line.endswith(
        "… [line of 1008 characters]"
    )
    assert len(long_line) < search_module.MAX_LINE_CHARS + 60

    monkeypatch.setattr(search_module, "MAX_FILES", 1)
    assert call(search_files, {"pattern": "nothing"}, context).splitlines() == [
        "(no matches)",
        "[stopped after searching 1 files; narrow path or glob]",
    ]
    monkeypatch.setattr(search_module, "MAX_FILES", 100)
    monkeypatch.setattr(search_module, "MAX_FILE_BYTES", 100)
    too_big = call(search_files, {"pattern": "hit"}, context).splitlines()
    assert too_big[0] == "a.txt:1: hit"
    assert too_big[-1].startswith("[skipped 1 file(s) over 100 bytes: b.txt")
    monkeypatch.setattr(search_module, "MAX_SCAN_BYTES", 1)
    assert call(search_files, {"pattern": "hit"}, context).splitlines()[-1] == (
        "[stopped after reading 1 bytes; narrow path or glob]"
    )


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param({"pattern": "x", "path": ".."}, id="parent"),
        pytest.param({"pattern": "x", "path": "/etc"}, id="absolute"),
        pytest.param({"pattern": "x", "path": "src/../.."}, id="parent-after-normalising"),
        pytest.param({"pattern": "x", "glob": "../*"}, id="glob-climbs"),
        pytest.param({"pattern": "x", "glob": "/etc/*"}, id="absolute-glob"),
        pytest.param({"pattern": "x", "path": "src/*"}, id="wildcard-path"),
        pytest.param({"pattern": "(unclosed"}, id="bad-regex"),
    ],
)
def test_search_refuses_bad_arguments_before_the_policy(arguments: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        search_files.accesses(parse(search_files, arguments))


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param({}, id="no-pattern"),
        pytest.param({"pattern": "x", "max_results": 0}, id="zero-results"),
        pytest.param({"pattern": "x", "max_results": 100_000}, id="too-many-results"),
        pytest.param({"pattern": "x", "recursive": True}, id="unknown-argument"),
    ],
)
def test_search_arguments_are_validated(arguments: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        parse(search_files, arguments)


def test_search_does_not_follow_symlinks_out_of_the_root(
    tree: Path, context: ToolContext, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "leak.txt").write_text("TODO outside\n")
    (tree / "link.txt").symlink_to(outside / "leak.txt")
    (tree / "linkdir").symlink_to(outside)
    assert "outside" not in call(search_files, {"pattern": "TODO"}, context)
    with pytest.raises(InvalidRequest, match="symlink"):
        call(search_files, {"pattern": "TODO", "path": "linkdir"}, context)
    assert refusal(Policy(), search_files, {"pattern": "x", "path": "linkdir"}, tree) == "root"


def test_search_of_a_missing_path(root: Path, context: ToolContext) -> None:
    with pytest.raises(FileNotFoundError):
        call(search_files, {"pattern": "x", "path": "nowhere"}, context)


def test_search_declares_its_reads(root: Path) -> None:
    def accesses(arguments: dict[str, Any]) -> tuple[Access, ...]:
        return tuple(search_files.accesses(parse(search_files, arguments)))

    assert accesses({"pattern": "x"}) == (
        Access(mode="read", path="."),
        Access(mode="read", path="**"),
    )
    assert accesses({"pattern": "x", "path": "./src/", "glob": "*.py"}) == (
        Access(mode="read", path="src"),
        Access(mode="read", path="src/**/*.py"),
    )
    assert accesses({"pattern": "x", "glob": "docs/*.md"})[1] == Access(
        mode="read", path="docs/*.md"
    )


def test_the_policy_judges_every_file_a_search_would_read(tree: Path) -> None:
    policy = Policy(deny_read=["secrets/**"])
    assert refusal(policy, search_files, {"pattern": "x"}, tree) == "deny_read:secrets/**"
    assert refusal(policy, search_files, {"pattern": "x", "path": "secrets/token.txt"}, tree) == (
        "deny_read:secrets/**"
    )
    assert refusal(policy, search_files, {"pattern": "x", "path": "src"}, tree) is None
    assert refusal(policy, search_files, {"pattern": "x", "glob": "*.py"}, tree) is None
    # The reason names the file, so the model knows how to narrow the search.
    found = policy.check("search_files", [Access(mode="read", path="**")], str(tree))
    assert found is not None and "secrets/token.txt" in found.reason

    # A directory or a file linked to a denied one is judged under its real name.
    (tree / "alias").symlink_to(tree / "secrets")
    aliased = {"pattern": "x", "path": "alias"}
    assert refusal(policy, search_files, aliased, tree) == "deny_read:secrets/**"

    narrow = Policy(allow_read=["src", "src/**"])
    assert refusal(narrow, search_files, {"pattern": "x", "path": "src"}, tree) is None
    assert refusal(narrow, search_files, {"pattern": "x"}, tree) == "allow_read"

    (tree / "src" / "token.txt").symlink_to(tree / "secrets" / "token.txt")
    assert refusal(policy, search_files, {"pattern": "x", "path": "src"}, tree) == (
        "deny_read:secrets/**"
    )


def test_glob_reads_in_the_policy(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def rule(policy: Policy, glob: str) -> str | None:
        found = policy.check("t", [Access(mode="read", path=glob)], str(tree))
        return None if found is None else found.rule

    permissive = Policy()
    assert rule(permissive, "**") is None
    assert rule(permissive, "../**") == "root"
    assert rule(permissive, "/etc/*") == "root"
    assert rule(permissive, "src/../../*") == "root"
    denying = Policy(deny_read=["**/*.md"])
    assert rule(denying, "**") == "deny_read:**/*.md"
    assert rule(denying, "src/**") is None
    assert rule(denying, "nothing/here/**") is None
    assert rule(denying, "docs/?uide.md") == "deny_read:**/*.md"
    monkeypatch.setattr("parley.policy.MAX_GLOB_FILES", 2)
    assert rule(denying, "**") == "read_glob_limit"
    assert rule(permissive, "**") is None  # nothing to judge: no walk, no limit


# ---------------------------------------------------------------------------- a real turn


@parley.tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


@parley.tool
def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"exploded: {reason}")


@pytest.mark.embedded_only
def test_a_turn_goes_on_after_bad_arguments_and_a_failing_tool(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PARLEY_REDIS_URL", raising=False)
    (root / "notes.md").write_text("remember the milk\n")
    script = {
        "rules": [
            {
                "when": ".*",
                "steps": [
                    {
                        "text": "working. ",
                        "tool_calls": [
                            {"name": "add", "arguments": {"a": "one", "b": 2}},
                            {"name": "add", "arguments": '{"a": 1'},
                            {"name": "explode", "arguments": {"reason": "on purpose"}},
                            {"name": "add", "arguments": {"a": 1, "b": 2}},
                            {"name": "search_files", "arguments": {"pattern": "milk"}},
                            {"name": "run_command", "arguments": {"argv": ["touch", "x"]}},
                        ],
                    },
                    {"text": "carried on"},
                ],
            }
        ]
    }
    host = parley.Host(
        model=parley.models.ScriptedModel(script),
        tools=[*WORKSPACE_TOOLS, run_command, add, explode],
    )
    client = parley.connect("sqlite:///" + str(tmp_path / "db.sqlite"), host=host)
    try:
        events = list(client.open_session(root).submit("go").events())
    finally:
        client.close()
    results = [e.data for e in events if e.kind is EventKind.TOOL_RESULT]
    contents = [(r["is_error"], r["content"]) for r in results]
    assert contents[0] == (True, "error: InvalidRequest: add.a: expected integer, got string")
    assert contents[1][0] and "not valid JSON" in contents[1][1]
    assert contents[2] == (True, "error: RuntimeError: exploded: on purpose")
    assert contents[3] == (False, "3")
    assert contents[4] == (False, "notes.md:1: remember the milk")
    assert contents[5][0] and results[5]["refusal"] == "allow_execute"
    assert not (root / "x").exists()
    refusals = [e.data for e in events if e.kind is EventKind.REFUSAL]
    assert [r["tool"] for r in refusals] == ["run_command"]
    assert events[-1].data == {
        "outcome": "finished",
        "reply": "carried on",
        "error": None,
        "undelivered": [],
    }


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused_before_any_bound_is_checked(constant: str) -> None:
    # NaN compares false with every bound: a NaN timeout would never expire.
    with pytest.raises(InvalidRequest, match="not a JSON number"):
        run_command.parse(f'{{"argv": ["sleep", "3"], "timeout": {constant}}}')
    with pytest.raises(InvalidRequest, match="finite"):
        validate(float("nan"), {"type": "number", "maximum": 10}, "t")
