"""``@parley.tool``: schemas from signatures, descriptions from docstrings, validation
before the call, context injection, return encoding; and the validator's extensions."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import (  # noqa: UP035 - the old spellings are supported too
    Annotated,
    Any,
    Dict,
    List,
    Literal,
    NotRequired,
    Optional,
    TypedDict,
)

import pytest

import parley
from parley.errors import InvalidRequest
from parley.ports.host import Access, ToolContext
from parley.tools import DecoratedTool, FunctionTool, tool
from parley.tools.base import validate
from parley.tools.decorator import parse_docstring


@pytest.fixture
def context(tmp_path: Path) -> ToolContext:
    return ToolContext(root=str(tmp_path), session_id="s", turn_id="t")


def properties(decorated: FunctionTool) -> dict[str, Any]:
    result: dict[str, Any] = decorated.declaration.parameters["properties"]
    return result


def call(decorated: FunctionTool, arguments: dict[str, Any] | str, context: ToolContext) -> str:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    result = decorated.run(decorated.parse(text), context)
    assert isinstance(result, str)  # (a WaitFor parks a turn: none of these tools waits)
    return result


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


class Options(TypedDict):
    label: str
    weight: NotRequired[float]


# ---------------------------------------------------------------------------- the decorator


def test_both_spellings_build_a_function_tool() -> None:
    @tool
    def plain(a: str) -> str:
        """Plain."""
        return a

    @parley.tool(name="renamed", description="Said otherwise.")
    def configured(a: str) -> str:
        """Ignored."""
        return a

    assert isinstance(plain, DecoratedTool) and isinstance(plain, FunctionTool)
    assert plain.declaration.name == "plain"
    assert plain.declaration.description == "Plain."
    assert configured.declaration.name == "renamed"
    assert configured.declaration.description == "Said otherwise."
    assert parley.tool is tool and parley.tools.tool is tool


def test_the_tool_is_still_the_function() -> None:
    @tool
    def add(a: int, b: int = 2) -> int:
        """Add."""
        return a + b

    assert add(1) == 3 and add(1, b=5) == 6
    assert add.wrapped.__name__ == "add"


def test_a_decorated_tool_goes_into_a_host() -> None:
    @tool
    def ping() -> str:
        """Ping."""
        return "pong"

    host = parley.Host(
        model=parley.models.ScriptedModel({"rules": [{"when": ".*", "steps": [{}]}]}), tools=[ping]
    )
    assert [t.declaration.name for t in host.tools] == ["ping"]


# ---------------------------------------------------------------------------- schemas


@pytest.mark.parametrize(
    ("annotation", "schema"),
    [
        pytest.param(str, {"type": "string"}, id="str"),
        pytest.param(int, {"type": "integer"}, id="int"),
        pytest.param(float, {"type": "number"}, id="float"),
        pytest.param(bool, {"type": "boolean"}, id="bool"),
        pytest.param(list[str], {"type": "array", "items": {"type": "string"}}, id="list"),
        pytest.param(list, {"type": "array"}, id="bare-list"),
        pytest.param(List, {"type": "array"}, id="typing-list"),  # noqa: UP006
        pytest.param(
            dict[str, int],
            {"type": "object", "additionalProperties": {"type": "integer"}},
            id="dict",
        ),
        pytest.param(dict, {"type": "object"}, id="bare-dict"),
        pytest.param(Dict, {"type": "object"}, id="typing-dict"),  # noqa: UP006
        pytest.param(Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}, id="literal"),
        pytest.param(Literal[1, "x"], {"enum": [1, "x"]}, id="mixed-literal"),
        pytest.param(Color, {"type": "string", "enum": ["red", "blue"]}, id="enum"),
        pytest.param(
            Optional[int],  # noqa: UP045 - the old spelling is supported too
            {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            id="optional",
        ),
        pytest.param(
            int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}, id="pipe-none"
        ),
        pytest.param(int | str, {"anyOf": [{"type": "integer"}, {"type": "string"}]}, id="union"),
        pytest.param(Any, {}, id="any"),
        pytest.param(
            list[list[bool]],
            {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}}},
            id="nested",
        ),
        pytest.param(
            Point,
            {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x"],
                "additionalProperties": False,
            },
            id="dataclass",
        ),
        pytest.param(
            Options,
            {
                "type": "object",
                "properties": {"label": {"type": "string"}, "weight": {"type": "number"}},
                "required": ["label"],
                "additionalProperties": False,
            },
            id="typeddict",
        ),
        pytest.param(Annotated[str, "what it is"], {"type": "string"}, id="annotated"),
    ],
)
def test_schema_of_each_supported_annotation(annotation: Any, schema: dict[str, Any]) -> None:
    def function(value: Any) -> str:
        """Take a value."""
        return ""

    function.__annotations__ = {"value": annotation, "return": str}
    declared = tool(function).declaration.parameters
    value_schema = dict(declared["properties"]["value"])
    value_schema.pop("description", None)
    assert value_schema == schema
    assert declared["required"] == ["value"]
    assert declared["additionalProperties"] is False
    assert declared["type"] == "object"


def test_defaults_are_not_required_and_are_declared() -> None:
    @tool
    def search(
        query: str,
        limit: int = 10,
        color: Color = Color.RED,
        tags: list[str] | None = None,
        origin: Point | None = None,
    ) -> str:
        """Search."""
        return ""

    schema = search.declaration.parameters
    assert schema["required"] == ["query"]
    assert schema["properties"]["limit"] == {"type": "integer", "default": 10}
    assert schema["properties"]["color"]["default"] == "red"
    assert schema["properties"]["tags"]["default"] is None
    # An optional parameter without a default is still required: it must be given, null
    # being one of its values.


def test_optional_without_default_is_required_but_nullable(context: ToolContext) -> None:
    @tool
    def f(a: int | None) -> str:
        """F."""
        return repr(a)

    assert f.declaration.parameters["required"] == ["a"]
    assert call(f, {"a": None}, context) == "None"
    assert call(f, {"a": 3}, context) == "3"
    with pytest.raises(InvalidRequest, match="missing required argument 'a'"):
        f.parse("{}")


def test_no_parameters_and_no_required_list() -> None:
    @tool
    def now() -> str:
        """The time."""
        return "noon"

    assert now.declaration.parameters == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    assert now.parse("") == {}


def test_annotated_description_wins_over_the_docstring() -> None:
    @tool
    def f(a: Annotated[str, "from the annotation"], b: int) -> str:
        """F.

        Args:
            a: from the docstring
            b: the b
        """
        return ""

    assert properties(f)["a"]["description"] == "from the annotation"
    assert properties(f)["b"]["description"] == "the b"


@pytest.mark.parametrize(
    "annotation",
    [
        pytest.param(set[int], id="set"),
        pytest.param(tuple[int, int], id="tuple"),
        pytest.param(bytes, id="bytes"),
        pytest.param(Path, id="class"),
        pytest.param(dict[int, str], id="non-string-keys"),
        pytest.param(list[set[int]], id="nested-unsupported"),
        pytest.param(Literal[b"x"], id="bytes-literal"),
    ],
)
def test_unsupported_annotations_fail_at_decoration(annotation: Any) -> None:
    def function(value: Any) -> str:
        """F."""
        return ""

    function.__annotations__ = {"value": annotation}
    with pytest.raises(InvalidRequest, match="'value'"):
        tool(function)


def test_unsupported_dataclass_field_is_named() -> None:
    @dataclasses.dataclass
    class Bad:
        items: set[int]

    def function(value: Bad) -> str:
        """F."""
        return ""

    function.__annotations__ = {"value": Bad}
    with pytest.raises(InvalidRequest, match="field 'items'"):
        tool(function)


def test_signatures_that_cannot_be_declared() -> None:
    def untyped(a):  # type: ignore[no-untyped-def]
        """Untyped."""

    def star(*values: int) -> None:
        """Star."""

    def stars(**values: int) -> None:
        """Stars."""

    def undocumented(a: int) -> None:
        pass

    with pytest.raises(InvalidRequest, match="no type annotation"):
        tool(untyped)
    with pytest.raises(InvalidRequest, match=r"\*args"):
        tool(star)
    with pytest.raises(InvalidRequest, match=r"\*args"):
        tool(stars)
    with pytest.raises(InvalidRequest, match="description"):
        tool(undocumented)
    assert tool(description="Given here.")(undocumented).declaration.description == "Given here."
    with pytest.raises(InvalidRequest, match="must match"):
        tool(description="a lambda has no usable name")(lambda: None)
    with pytest.raises(InvalidRequest, match="must match"):
        tool(name="bad name", description="d")(undocumented)


# ---------------------------------------------------------------------------- docstrings


def test_google_docstring() -> None:
    parsed = parse_docstring(
        """Copy a file.

        Longer explanation
        over two lines.

        Args:
            source (str): where from,
                relative to the root.
            target: where to.
            *rest: ignored.

        Returns:
            the number of bytes.
        """
    )
    assert parsed.description == "Copy a file.\n\nLonger explanation over two lines."
    assert parsed.parameters == {
        "source": "where from, relative to the root.",
        "target": "where to.",
        "rest": "ignored.",
    }


def test_numpy_docstring() -> None:
    parsed = parse_docstring(
        """Copy a file.

        Parameters
        ----------
        source : str
            where from,
            relative to the root.
        target
            where to.

        Returns
        -------
        int
            the number of bytes.
        """
    )
    assert parsed.description == "Copy a file."
    assert parsed.parameters == {
        "source": "where from, relative to the root.",
        "target": "where to.",
    }


def test_rest_docstring() -> None:
    parsed = parse_docstring(
        """Copy a file.

        :param source: where from,
            relative to the root.
        :param str target: where to.
        :type target: str
        :returns: the number of bytes.
        """
    )
    assert parsed.description == "Copy a file."
    assert parsed.parameters == {
        "source": "where from, relative to the root.",
        "target": "where to.",
    }


def test_docstring_without_sections_and_prose_after_sections() -> None:
    assert parse_docstring("One line.").description == "One line."
    assert parse_docstring("").description == ""
    parsed = parse_docstring("Summary.\n\nReturns:\n    x\n\nNot part of the description.")
    assert parsed.description == "Summary."


def test_docstring_descriptions_reach_the_schema() -> None:
    @tool
    def copy(source: str, target: str, overwrite: bool = False) -> str:
        """Copy a file.

        Args:
            source: where from.
            target: where to.
        """
        return ""

    assert copy.declaration.description == "Copy a file."
    assert properties(copy)["source"] == {"type": "string", "description": "where from."}
    assert "description" not in properties(copy)["overwrite"]


# ---------------------------------------------------------------------------- calls


@tool
def record(
    name: str,
    count: int,
    ratio: float = 1.0,
    color: Color = Color.RED,
    points: list[Point] | None = None,
    options: Options | None = None,
    weights: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Echo what the function received, with the Python types.

    Args:
        name: a name.
        count: a count.
    """
    return {
        "name": name,
        "count": count,
        "ratio": [ratio, type(ratio).__name__],
        "color": repr(color),
        "points": [repr(p) for p in points or []],
        "options": options,
        "weights": weights,
    }


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        pytest.param('{"count": 1}', "missing required argument 'name'", id="missing"),
        pytest.param(
            '{"name": 1, "count": 1}', "record.name: expected string, got integer", id="type"
        ),
        pytest.param('{"name": "n", "count": 1.5}', "expected integer, got number", id="float"),
        pytest.param('{"name": "n", "count": true}', "expected integer, got boolean", id="bool"),
        pytest.param(
            '{"name": "n", "count": 1, "extra": 0}', "unexpected argument 'extra'", id="extra"
        ),
        pytest.param('{"name": "n", "count": 1, "color": "green"}', "not one of", id="enum"),
        pytest.param('{"name": null, "count": 1}', "got null", id="null"),
        pytest.param(
            '{"name": "n", "count": 1, "points": [{"y": 1}]}', r"points\[0\]: missing", id="nested"
        ),
        pytest.param(
            '{"name": "n", "count": 1, "points": 3}', "expected array or null", id="union"
        ),
        pytest.param(
            '{"name": "n", "count": 1, "weights": {"a": "x"}}', r"weights\.a", id="dict-value"
        ),
        pytest.param("{not json", "not valid JSON", id="json"),
    ],
)
def test_invalid_arguments_are_refused_before_the_call(arguments: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        record.parse(arguments)


def test_arguments_become_python_values(context: ToolContext) -> None:
    output = json.loads(
        call(
            record,
            {
                "name": "n",
                "count": 2,
                "ratio": 3,
                "color": "blue",
                "points": [{"x": 1}, {"x": 2, "y": 3}],
                "options": {"label": "l"},
                "weights": {"a": 1},
            },
            context,
        )
    )
    assert output == {
        "name": "n",
        "count": 2,
        "ratio": [3.0, "float"],
        "color": "<Color.BLUE: 'blue'>",
        "points": ["Point(x=1, y=0)", "Point(x=2, y=3)"],
        "options": {"label": "l"},
        "weights": {"a": 1.0},
    }


def test_defaults_apply_when_arguments_are_left_out(context: ToolContext) -> None:
    output = json.loads(call(record, {"name": "n", "count": 1}, context))
    assert output["ratio"] == [1.0, "float"] and output["color"] == "<Color.RED: 'red'>"


def test_return_values(context: ToolContext) -> None:
    @tool
    def text() -> str:
        """Text."""
        return 'as "is"'

    @tool
    def nothing() -> None:
        """Nothing."""

    @tool
    def structured() -> Point:
        """A dataclass."""
        return Point(x=1)

    @tool
    def mixed() -> dict[str, Any]:
        """Mixed."""
        return {"set": {1}, "color": Color.BLUE, "path": Path("a/b"), "é": "ü"}

    assert call(text, {}, context) == 'as "is"'
    assert call(nothing, {}, context) == "null"
    assert json.loads(call(structured, {}, context)) == {"x": 1, "y": 0}
    assert json.loads(call(mixed, {}, context)) == {
        "set": [1],
        "color": "blue",
        "path": "a/b",
        "é": "ü",
    }


def test_context_by_annotation_or_by_name(context: ToolContext) -> None:
    @tool
    def by_annotation(ctx: ToolContext, a: int) -> str:
        """A."""
        return f"{ctx.turn_id}:{a}"

    @tool
    def by_name(a: int, context) -> str:  # type: ignore[no-untyped-def]
        """B."""
        return f"{context.session_id}:{a}"

    @tool
    def optional_context(a: int, where: ToolContext | None = None) -> str:
        """C."""
        return f"{where.root if where else None}:{a}"

    for decorated in (by_annotation, by_name, optional_context):
        assert set(properties(decorated)) == {"a"}
        assert decorated.declaration.parameters["required"] == ["a"]
    assert call(by_annotation, {"a": 1}, context) == "t:1"
    assert call(by_name, {"a": 2}, context) == "s:2"
    assert call(optional_context, {"a": 3}, context) == f"{context.root}:3"
    with pytest.raises(InvalidRequest, match="unexpected argument 'ctx'"):
        by_annotation.parse('{"a": 1, "ctx": {}}')


def test_positional_only_parameters(context: ToolContext) -> None:
    @tool
    def f(a: int = 1, b: int = 2, /, c: int = 3) -> str:
        """F."""
        return f"{a}{b}{c}"

    assert call(f, {"b": 5}, context) == "153"
    assert call(f, {}, context) == "123"


def test_accesses_see_the_arguments_with_defaults() -> None:
    seen: list[dict[str, Any]] = []

    def accesses(arguments: dict[str, Any]) -> list[Access]:
        seen.append(arguments)
        return [Access(mode="read", path=arguments["path"])]

    @tool(accesses=accesses)
    def peek(path: str = "README.md", lines: int = 5) -> str:
        """Peek."""
        return ""

    assert tuple(peek.accesses(peek.parse('{"lines": 2}'))) == (
        Access(mode="read", path="README.md"),
    )
    assert seen == [{"path": "README.md", "lines": 2}]

    @tool
    def undeclared() -> str:
        """No accesses."""
        return ""

    assert tuple(undeclared.accesses({})) == ()


def test_an_exception_from_the_function_propagates_to_the_engine(context: ToolContext) -> None:
    @tool
    def boom() -> str:
        """Fails."""
        raise ZeroDivisionError("no")

    with pytest.raises(ZeroDivisionError):
        call(boom, {}, context)


# ---------------------------------------------------------------------------- the validator


def test_validator_null_type_lists_and_any_of() -> None:
    validate(None, {"type": "null"}, "w")
    validate(None, {"type": ["string", "null"]}, "w")
    validate("a", {"type": ["string", "null"]}, "w")
    with pytest.raises(InvalidRequest, match="expected string or null, got integer"):
        validate(1, {"type": ["string", "null"]}, "w")
    validate(1, {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "w")
    with pytest.raises(InvalidRequest, match="expected integer or string, got boolean"):
        validate(True, {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "w")
    with pytest.raises(InvalidRequest, match="not supported"):
        validate(1, {"type": ["integer", "int"]}, "w")


def test_validator_bounds_and_map_values() -> None:
    validate(5, {"type": "integer", "minimum": 1, "maximum": 5}, "w")
    with pytest.raises(InvalidRequest, match="below the minimum"):
        validate(0, {"type": "integer", "minimum": 1}, "w")
    with pytest.raises(InvalidRequest, match="above the maximum"):
        validate(5.5, {"type": "number", "maximum": 5}, "w")
    with pytest.raises(InvalidRequest, match="at least 1 item"):
        validate([], {"type": "array", "minItems": 1}, "w")
    with pytest.raises(InvalidRequest, match="at most 1 item"):
        validate([1, 2], {"type": "array", "maxItems": 1}, "w")
    with pytest.raises(InvalidRequest, match="at least 1 character"):
        validate("", {"type": "string", "minLength": 1}, "w")
    with pytest.raises(InvalidRequest, match=r"w\.b: expected integer"):
        validate(
            {"a": 1, "b": "x"}, {"type": "object", "additionalProperties": {"type": "integer"}}, "w"
        )


def test_validator_enum_keeps_booleans_apart_from_numbers() -> None:
    validate(1, {"enum": [1, 2]}, "w")
    with pytest.raises(InvalidRequest):
        validate(True, {"enum": [1, 2]}, "w")
    with pytest.raises(InvalidRequest):
        validate(0, {"enum": [False]}, "w")


# ---------------------------------------------------------------------------- pydantic


def all_keys(schema: Any) -> set[str]:
    """Every keyword used anywhere in a schema (property names excluded)."""
    if isinstance(schema, list):
        return set().union(*(all_keys(item) for item in schema))
    if not isinstance(schema, dict):
        return set()
    keys = set(schema) - {"properties"}
    nested = [v for k, v in schema.items() if k != "properties"]
    nested += list(schema.get("properties", {}).values())
    return keys.union(*(all_keys(item) for item in nested))


class Documented(enum.Enum):
    """An enum's docstring, which the model is not told."""

    ONE = 1
    TWO = 2


@dataclasses.dataclass
class Labelled:
    """A record's docstring, which the model is not told either."""

    label: Annotated[str, "what it says"]
    tags: list[Literal["only"]] = dataclasses.field(default_factory=list)
    options: Options | None = None  # a typing.TypedDict, which pydantic refuses on 3.11


def test_the_schema_is_inline_and_without_pydantic_noise() -> None:
    @tool
    def f(
        first: Labelled,
        second: list[Labelled],
        number: Documented = Documented.TWO,
        odd: Any = object(),  # noqa: B008 - a default that is not JSON
        nan: float = float("nan"),
    ) -> str:
        """F."""
        return ""

    schema = f.declaration.parameters
    keys = all_keys(schema)
    assert not keys & {"title", "$ref", "$defs", "const"}, keys
    labelled = properties(f)["first"]
    assert labelled == properties(f)["second"]["items"]
    assert labelled["properties"]["label"] == {"type": "string", "description": "what it says"}
    assert labelled["properties"]["tags"] == {
        "type": "array",
        "items": {"type": "string", "enum": ["only"]},
    }
    assert labelled["required"] == ["label"] and "description" not in labelled
    assert labelled["properties"]["options"]["anyOf"][0]["additionalProperties"] is False
    assert properties(f)["number"] == {"type": "integer", "enum": [1, 2], "default": 2}
    assert "default" not in properties(f)["odd"] and "default" not in properties(f)["nan"]


def test_booleans_are_not_literal_or_enum_numbers() -> None:
    # pydantic alone takes true for Literal[1] and for an enum member of value 1, even in
    # strict mode: the JSON schema check before it keeps JSON's rule.
    @tool
    def f(level: Literal[1, 2] = 1, number: Documented = Documented.ONE) -> str:
        """F."""
        return ""

    with pytest.raises(InvalidRequest, match=r"f\.level: True is not one of \[1, 2\]"):
        f.parse('{"level": true}')
    with pytest.raises(InvalidRequest, match=r"f\.number: True is not one of \[1, 2\]"):
        f.parse('{"number": true}')


def test_records_are_built_with_their_nested_values(context: ToolContext) -> None:
    @tool
    def f(items: dict[str, list[Labelled]]) -> str:
        """F."""
        return repr(items)

    text = '{"items": {"a": [{"label": "l", "options": {"label": "o", "weight": 2}}]}}'
    assert call(f, text, context) == (
        "{'a': [Labelled(label='l', tags=[], options={'label': 'o', 'weight': 2.0})]}"
    )


@dataclasses.dataclass
class Positive:
    value: int

    def __post_init__(self) -> None:
        if self.value <= 0:
            raise ValueError("value must be positive")


def test_what_only_pydantic_refuses_is_refused_by_parse() -> None:
    ran: list[Any] = []

    @tool
    def f(numbers: list[Positive] | None = None) -> str:
        """F."""
        ran.append(numbers)
        return ""

    with pytest.raises(
        InvalidRequest, match=r"^f\.numbers\[1\]: Value error, value must be positive$"
    ):
        f.parse('{"numbers": [{"value": 1}, {"value": 0}]}')
    assert ran == []


@dataclasses.dataclass
class Node:
    children: list[Node]


def test_a_type_that_contains_itself_is_refused() -> None:
    def function(tree: Node) -> str:
        """F."""
        return ""

    with pytest.raises(InvalidRequest, match="'tree', field 'children': Node contains itself"):
        tool(function)


def test_a_record_whose_fields_cannot_be_read_is_refused() -> None:
    @dataclasses.dataclass
    class Local:
        child: Local  # a name the module cannot resolve

    def function(value: Local) -> str:
        """F."""
        return ""

    function.__annotations__ = {"value": Local}
    with pytest.raises(InvalidRequest, match="cannot read the fields of Local"):
        tool(function)


def test_unions_pick_the_exact_type(context: ToolContext) -> None:
    # pydantic's smart unions: an integer stays an int, a string that looks like one a str.
    @tool
    def f(a: float | int = 0, b: int | str = 0, c: bool | int = 0) -> str:
        """F."""
        return repr((a, b, c))

    assert call(f, {"a": 3, "b": "4", "c": 1}, context) == "(3, '4', 1)"
    assert call(f, {"a": 3.5, "b": 4, "c": True}, context) == "(3.5, 4, True)"


def test_results_are_encoded_by_pydantic(context: ToolContext) -> None:
    @tool
    def f() -> dict[str, Any]:
        """F."""
        return {"tuple": (1, Point(x=2)), "frozen": frozenset({"a"}), "nan": float("nan")}

    assert call(f, {}, context) == ('{"tuple": [1, {"x": 2, "y": 0}], "frozen": ["a"], "nan": NaN}')


def test_docstring_summary_over_two_lines() -> None:
    parsed = parse_docstring("Summary line\ncontinued.\n\nArgs:\n    a: the a.")
    assert parsed.description == "Summary line continued."
    assert parsed.parameters == {"a": "the a."}
