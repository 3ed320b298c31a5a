"""FunctionTool argument validation and the built-in workspace tools."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from parley.errors import InvalidRequest
from parley.ports.host import Access, ToolContext
from parley.tools import WORKSPACE_TOOLS, FunctionTool, list_files, read_file, write_file
from parley.tools.base import validate
from parley.tools.workspace import LIST_LIMIT, READ_LIMIT

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["fast", "slow"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "points": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["name"],
    "additionalProperties": False,
}


def echo(arguments: dict[str, Any], context: ToolContext) -> str:
    return json.dumps({"arguments": arguments, "root": context.root}, sort_keys=True)


def make_tool(**overrides: Any) -> FunctionTool:
    options: dict[str, Any] = {
        "name": "echo",
        "description": "Echo the arguments.",
        "parameters": SCHEMA,
        "function": echo,
    }
    options.update(overrides)
    return FunctionTool(**options)


@pytest.fixture
def context(tmp_path: Path) -> ToolContext:
    return ToolContext(root=str(tmp_path), session_id="s", turn_id="t")


def call(tool: FunctionTool, arguments: dict[str, Any] | str, context: ToolContext) -> str:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    result = tool.run(tool.parse(text), context)
    assert isinstance(result, str)  # (a WaitFor parks a turn: none of these tools waits)
    return result


# ---------------------------------------------------------------------------- validation


def test_valid_arguments_parse_to_a_dict() -> None:
    arguments = {
        "name": "n",
        "count": 3,
        "ratio": 2,
        "flag": False,
        "mode": "slow",
        "tags": ["a", "b"],
        "points": [{"x": 1, "y": 2}],
    }
    assert make_tool().parse(json.dumps(arguments)) == arguments
    assert make_tool().parse('{"name": "n", "ratio": 0.5}') == {"name": "n", "ratio": 0.5}


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{not json", id="invalid-json"),
        pytest.param('{"name": "n",}', id="trailing-comma"),
        pytest.param("[]", id="array-not-object"),
        pytest.param('"name"', id="string-not-object"),
        pytest.param("{}", id="missing-required"),
        pytest.param("", id="empty-text-misses-required"),
        pytest.param('{"name": 5}', id="int-for-string"),
        pytest.param('{"name": null}', id="null-for-string"),
        pytest.param('{"name": "n", "count": true}', id="bool-is-not-integer"),
        pytest.param('{"name": "n", "count": 1.5}', id="float-for-integer"),
        pytest.param('{"name": "n", "count": "1"}', id="string-for-integer"),
        pytest.param('{"name": "n", "ratio": false}', id="bool-is-not-number"),
        pytest.param('{"name": "n", "flag": 1}', id="int-is-not-boolean"),
        pytest.param('{"name": "n", "extra": 1}', id="additional-property"),
        pytest.param('{"name": "n", "mode": "medium"}', id="not-in-enum"),
        pytest.param('{"name": "n", "tags": "a"}', id="string-for-array"),
        pytest.param('{"name": "n", "tags": ["a", 2]}', id="bad-array-item"),
        pytest.param('{"name": "n", "points": [{"x": 1}]}', id="nested-missing-required"),
        pytest.param('{"name": "n", "points": [{"x": 1, "y": true}]}', id="nested-bool"),
        pytest.param('{"name": "n", "points": [{"x": 1, "y": 2, "z": 3}]}', id="nested-extra"),
    ],
)
def test_invalid_arguments_are_refused(text: str) -> None:
    with pytest.raises(InvalidRequest):
        make_tool().parse(text)


def test_additional_properties_are_allowed_unless_forbidden() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    tool = make_tool(parameters=schema)
    assert tool.parse('{"a": "x", "b": [1]}') == {"a": "x", "b": [1]}
    assert tool.parse("") == {}


def test_validation_error_names_the_argument() -> None:
    with pytest.raises(InvalidRequest, match=r"points\[1\]"):
        make_tool().parse('{"name": "n", "points": [{"x": 1, "y": 2}, {"x": "1", "y": 2}]}')


def test_enum_without_type() -> None:
    validate("b", {"enum": ["a", "b"]}, "w")
    with pytest.raises(InvalidRequest):
        validate("c", {"enum": ["a", "b"]}, "w")


def test_unsupported_schema_type_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="not supported"):
        validate(1, {"type": "int"}, "w")
    with pytest.raises(InvalidRequest, match=r"not supported.*\(at properties/a/minimum\)"):
        validate({}, {"type": "object", "properties": {"a": {"minimum": "one"}}}, "w")


def test_every_json_schema_keyword_is_checked() -> None:
    # jsonschema checks the whole of draft 2020-12; what parley words itself above, the
    # rest in jsonschema's own words.
    with pytest.raises(InvalidRequest, match=r"w\.a: 'ab' does not match"):
        validate({"a": "ab"}, {"properties": {"a": {"pattern": "^a$"}}}, "w")
    with pytest.raises(InvalidRequest, match="w: 2 was expected"):
        validate(3, {"const": 2}, "w")
    with pytest.raises(InvalidRequest, match="w: 'x' is not valid under any of the given schemas"):
        validate("x", {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}, "w")
    validate("x", {"type": "string", "format": "email"}, "w")  # formats are annotations


def test_json_numbers() -> None:
    # 1.0 is a float when decoded: not an integer argument (JSON Schema itself says it is).
    with pytest.raises(InvalidRequest, match="expected integer, got number"):
        validate(1.0, {"type": "integer"}, "w")
    validate(10**400, {"type": "number"}, "w")  # an int of any size is finite
    with pytest.raises(InvalidRequest, match="inf is not a finite number"):
        validate(float("inf"), {"type": ["number", "null"]}, "w")


def test_pattern_properties_are_not_unexpected() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {}},
        "patternProperties": {"^x-": {"type": "string"}},
        "additionalProperties": False,
    }
    validate({"a": 1, "x-tag": "t"}, schema, "w")
    with pytest.raises(InvalidRequest, match="unexpected argument 'b'"):
        validate({"x-tag": "t", "b": 1}, schema, "w")


# ---------------------------------------------------------------------------- construction


@pytest.mark.parametrize("name", ["", "read file", "read/file", "read.file", "tool()", "a;b"])
def test_invalid_tool_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidRequest):
        make_tool(name=name)


@pytest.mark.parametrize("name", ["read_file", "read-file", "Tool2", "x"])
def test_valid_tool_names(name: str) -> None:
    assert make_tool(name=name).declaration.name == name


def test_parameters_must_be_an_object_schema() -> None:
    with pytest.raises(InvalidRequest):
        make_tool(parameters={"type": "array", "items": {"type": "string"}})
    with pytest.raises(InvalidRequest):
        make_tool(parameters={"properties": {}})


def test_declaration_is_what_the_model_sees() -> None:
    declaration = make_tool().declaration
    assert declaration.name == "echo"
    assert declaration.description == "Echo the arguments."
    assert declaration.parameters == SCHEMA


def test_run_passes_arguments_and_context(context: ToolContext) -> None:
    output = json.loads(call(make_tool(), {"name": "n", "count": 2}, context))
    assert output == {"arguments": {"name": "n", "count": 2}, "root": context.root}


def test_accesses_default_to_none_and_use_the_declared_function() -> None:
    assert tuple(make_tool().accesses({"name": "n"})) == ()
    tool = make_tool(access=lambda args: (Access(mode="execute", path=args["name"]),))
    assert tuple(tool.accesses({"name": "ls"})) == (Access(mode="execute", path="ls"),)


# ---------------------------------------------------------------------------- built-in tools


def test_workspace_tools_are_the_four_built_ins() -> None:
    assert [t.declaration.name for t in WORKSPACE_TOOLS] == [
        "read_file",
        "write_file",
        "list_files",
        "search_files",
    ]


def test_built_in_accesses() -> None:
    assert tuple(read_file.accesses({"path": "a/b.py"})) == (Access(mode="read", path="a/b.py"),)
    assert tuple(write_file.accesses({"path": "c.txt", "content": ""})) == (
        Access(mode="write", path="c.txt"),
    )
    assert tuple(list_files.accesses({"path": "docs"})) == (Access(mode="read", path="docs"),)
    assert tuple(list_files.accesses({})) == (Access(mode="read", path="."),)


@pytest.mark.parametrize(
    ("tool", "text"),
    [
        (read_file, "{}"),
        (read_file, '{"path": 1}'),
        (read_file, '{"path": "a", "mode": "r"}'),
        (write_file, '{"path": "a"}'),
        (write_file, '{"path": "a", "content": 5}'),
        (list_files, '{"path": ["a"]}'),
        (list_files, '{"recursive": true}'),
    ],
)
def test_built_in_argument_validation(tool: FunctionTool, text: str) -> None:
    with pytest.raises(InvalidRequest):
        tool.parse(text)


def test_read_file(tmp_path: Path, context: ToolContext) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "retry.py").write_text("RETRY_ON = (502, 504)\nnaïve\n", encoding="utf-8")
    assert call(read_file, {"path": "pkg/retry.py"}, context) == "RETRY_ON = (502, 504)\nnaïve\n"


def test_read_file_truncates_large_files(tmp_path: Path, context: ToolContext) -> None:
    (tmp_path / "big.txt").write_bytes(b"a" * (READ_LIMIT + 10))
    text = call(read_file, {"path": "big.txt"}, context)
    assert text.startswith("a" * READ_LIMIT)
    assert "a" * (READ_LIMIT + 1) not in text
    assert "truncated" in text


def test_read_file_reads_no_more_of_a_huge_file_than_it_returns(
    tmp_path: Path, context: ToolContext
) -> None:
    with (tmp_path / "sparse.bin").open("wb") as handle:
        handle.truncate(1 << 40)  # a terabyte that takes no disk, and no memory unless read
    assert "truncated" in call(read_file, {"path": "sparse.bin"}, context)


def test_read_file_of_a_fifo_errors_instead_of_blocking(
    tmp_path: Path, context: ToolContext
) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(OSError, match="not a regular file"):
        call(read_file, {"path": "pipe"}, context)


def test_read_file_of_a_directory_errors(tmp_path: Path, context: ToolContext) -> None:
    (tmp_path / "docs").mkdir()
    with pytest.raises(IsADirectoryError):
        call(read_file, {"path": "docs"}, context)


def test_read_file_of_a_missing_file_errors(context: ToolContext) -> None:
    with pytest.raises(FileNotFoundError):
        call(read_file, {"path": "missing.txt"}, context)


def test_write_file_creates_parents_and_reports_bytes(tmp_path: Path, context: ToolContext) -> None:
    result = call(write_file, {"path": "a/b/c.txt", "content": "héllo"}, context)
    assert (tmp_path / "a" / "b" / "c.txt").read_text(encoding="utf-8") == "héllo"
    assert result == "wrote 6 bytes to a/b/c.txt"


def test_write_file_replaces_content(tmp_path: Path, context: ToolContext) -> None:
    (tmp_path / "f.txt").write_text("old and longer")
    call(write_file, {"path": "f.txt", "content": "new"}, context)
    assert (tmp_path / "f.txt").read_text() == "new"


@pytest.mark.parametrize("path", ["../escape.txt", "/tmp/escape.txt", "a/../../escape.txt"])
def test_write_file_outside_the_root_raises(tmp_path: Path, path: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    context = ToolContext(root=str(root), session_id="s", turn_id="t")
    with pytest.raises(InvalidRequest):
        call(write_file, {"path": path, "content": "x"}, context)
    assert not (tmp_path / "escape.txt").exists()


def test_write_file_through_an_escaping_symlink_raises(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "out").symlink_to(outside, target_is_directory=True)
    context = ToolContext(root=str(root), session_id="s", turn_id="t")
    with pytest.raises(InvalidRequest):
        call(write_file, {"path": "out/x.txt", "content": "x"}, context)
    assert list(outside.iterdir()) == []


def test_read_file_outside_the_root_raises(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("s")
    context = ToolContext(root=str(root), session_id="s", turn_id="t")
    with pytest.raises(InvalidRequest):
        call(read_file, {"path": "../secret.txt"}, context)


def test_list_files(tmp_path: Path, context: ToolContext) -> None:
    for path in ("b.txt", "a.txt", "src/z.py", "src/deep/y.py", "docs/readme.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    listing = call(list_files, {}, context).splitlines()
    assert sorted(listing) == [
        "a.txt",
        "b.txt",
        "docs/readme.md",
        "src/deep/y.py",
        "src/z.py",
    ]
    # Paths are relative to the root even when listing a subdirectory.
    assert call(list_files, {"path": "src"}, context).splitlines() == ["src/z.py", "src/deep/y.py"]


def test_list_files_skips_vcs_and_tool_directories(tmp_path: Path, context: ToolContext) -> None:
    for path in (".git/config", "node_modules/m/index.js", "__pycache__/a.pyc", "keep.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    (tmp_path / ".gitignore").write_text("x")
    assert sorted(call(list_files, {}, context).splitlines()) == [".gitignore", "keep.py"]


def test_list_files_of_an_empty_directory(context: ToolContext) -> None:
    assert call(list_files, {}, context) == "(no files)"


def test_list_files_stops_at_the_limit(tmp_path: Path, context: ToolContext) -> None:
    for n in range(LIST_LIMIT + 1):
        (tmp_path / f"f{n:05d}.txt").touch()
    lines = call(list_files, {}, context).splitlines()
    assert len(lines) == LIST_LIMIT + 1
    assert lines[-1] == f"[listing stopped at {LIST_LIMIT} files]"
    assert lines[0] == "f00000.txt"


def test_list_files_outside_the_root_raises(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    context = ToolContext(root=str(root), session_id="s", turn_id="t")
    with pytest.raises(InvalidRequest):
        call(list_files, {"path": ".."}, context)
