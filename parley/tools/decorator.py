"""``@parley.tool``: a typed Python function becomes a tool the model may call.

The JSON schema comes from the signature, the descriptions from the docstring::

    @parley.tool
    def grep_count(pattern: str, paths: list[str], ignore_case: bool = False) -> int:
        \"\"\"Count the lines matching a regex.

        Args:
            pattern: a Python regular expression.
            paths: files relative to the workspace root.
            ignore_case: match without regard to case.
        \"\"\"

Supported annotations: ``str``, ``int``, ``float``, ``bool``, ``list[T]``,
``dict[str, T]``, ``Literal[...]``, ``Enum`` subclasses, ``X | None`` and other unions,
``Any``, ``TypedDict`` and dataclass types, nested freely; ``Annotated[T, "text"]`` gives
a parameter its description.  Anything else is refused when the function is decorated.
A parameter annotated ``ToolContext`` (or an unannotated one named ``context``) receives
the turn's :class:`~workers.host_ports.ToolContext` and is not shown to the model.

Arguments are validated against the schema before the function runs; a validation error
goes back to the model as the tool's result.  A ``str`` return value is the result as
is; anything else is JSON-encoded.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

from parley.errors import InvalidRequest
from parley.tools.base import FunctionTool, validate
from workers.host_ports import Access, ToolContext

P = ParamSpec("P")
R = TypeVar("R")

AccessFunction = Callable[[dict[str, Any]], Sequence[Access]]
Converter = Callable[[Any], Any]

_SUPPORTED = (
    "str, int, float, bool, list[T], dict[str, T], Literal[...], Enum, X | None, unions, "
    "Any, TypedDict, dataclasses, Annotated[T, 'description']"
)


@dataclass(frozen=True, kw_only=True)
class DecoratedTool(FunctionTool, Generic[P, R]):
    """What ``@parley.tool`` returns: a :class:`FunctionTool` (so a tool for any
    ``Host``) that can still be called as the plain Python function it wraps."""

    wrapped: Callable[P, R]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the original function directly (no validation, no policy)."""
        return self.wrapped(*args, **kwargs)


@overload
def tool(function: Callable[P, R], /) -> DecoratedTool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    accesses: AccessFunction | None = None,
) -> Callable[[Callable[P, R]], DecoratedTool[P, R]]: ...


def tool(
    function: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    accesses: AccessFunction | None = None,
) -> DecoratedTool[P, R] | Callable[[Callable[P, R]], DecoratedTool[P, R]]:
    """Make a tool of a typed function: ``@tool`` or ``@tool(name=..., description=...,
    accesses=...)``.

    ``name`` defaults to the function's name, ``description`` to its docstring's text
    before the first section.  ``accesses`` receives the validated arguments (defaults
    filled in) and returns what the call reads, writes or executes, for the host's
    policy; without it the tool declares no access, so the policy can only deny it by
    name (``deny_tools``).  Raises :class:`InvalidRequest` for an annotation it cannot
    express as JSON schema, a missing annotation or description, or ``*args``/``**kwargs``.
    """

    def decorate(target: Callable[P, R]) -> DecoratedTool[P, R]:
        return _build(target, name=name, description=description, accesses=accesses)

    if function is not None:
        return decorate(function)
    return decorate


# --------------------------------------------------------------------------- building


@dataclass(frozen=True)
class _Parameter:
    name: str
    positional_only: bool
    convert: Converter
    default: Any
    is_context: bool = False


def _build(
    function: Callable[P, R],
    *,
    name: str | None,
    description: str | None,
    accesses: AccessFunction | None,
) -> DecoratedTool[P, R]:
    if not callable(function):
        raise InvalidRequest(f"@tool needs a function, not {function!r}")
    label = getattr(function, "__qualname__", repr(function))
    if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
        # Its call would return an unawaited coroutine, which the model would get as text.
        raise InvalidRequest(f"@tool {label}: tools run synchronously; make it a plain def")
    if inspect.isgeneratorfunction(function):
        raise InvalidRequest(f"@tool {label}: a tool returns its result; it cannot yield")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(f"@tool {label}: description must be text")
    if accesses is not None and not callable(accesses):
        raise InvalidRequest(f"@tool {label}: accesses must be a function of the arguments")
    try:
        signature = inspect.signature(function)
        hints = typing.get_type_hints(function, include_extras=True)
    except (TypeError, ValueError, NameError) as exc:
        raise InvalidRequest(f"@tool {label}: cannot read its signature ({exc})") from exc
    docstring = parse_docstring(inspect.getdoc(function) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    parameters: list[_Parameter] = []
    for parameter in signature.parameters.values():
        where = f"@tool {label}: parameter {parameter.name!r}"
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise InvalidRequest(f"{where}: *args and **kwargs cannot be declared to a model")
        annotation = hints.get(parameter.name, inspect.Parameter.empty)
        positional_only = parameter.kind is parameter.POSITIONAL_ONLY
        if _is_context(parameter.name, annotation):
            parameters.append(
                _Parameter(parameter.name, positional_only, _identity, None, is_context=True)
            )
            continue
        if annotation is inspect.Parameter.empty:
            raise InvalidRequest(f"{where} has no type annotation")
        annotation, note = _strip_annotated(annotation)
        schema, convert = _schema(annotation, where)
        explained = note or docstring.parameters.get(parameter.name)
        if explained:
            schema = {**schema, "description": explained}
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
        else:
            default = parameter.default
            if isinstance(default, enum.Enum):
                default = default.value
            if _is_json(default):
                schema = {**schema, "default": default}
        properties[parameter.name] = schema
        parameters.append(_Parameter(parameter.name, positional_only, convert, parameter.default))
    schema_object = _closed_object(properties, required)
    text = description if description is not None else docstring.description
    if not text or not text.strip():
        raise InvalidRequest(
            f"@tool {label}: the model needs a description: write a docstring or pass description="
        )

    def with_defaults(arguments: dict[str, Any]) -> dict[str, Any]:
        complete = dict(arguments)
        for item in parameters:
            if item.is_context:
                continue
            if item.name not in complete and item.default is not inspect.Parameter.empty:
                complete[item.name] = item.default
        return complete

    def run(arguments: dict[str, Any], context: ToolContext) -> str:
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        for item in parameters:
            if item.is_context:
                value: Any = context
            elif item.name in arguments:
                value = item.convert(arguments[item.name])
            elif item.positional_only:
                value = item.default  # a later positional-only argument may follow
            else:
                continue  # Python fills in the default
            if item.positional_only:
                positional.append(value)
            else:
                keywords[item.name] = value
        call: Callable[..., Any] = function
        result = call(*positional, **keywords)
        return result if isinstance(result, str) else _to_json(result)

    def access(arguments: dict[str, Any]) -> Sequence[Access]:
        return () if accesses is None else tuple(accesses(with_defaults(arguments)))

    return DecoratedTool(
        name=name if name is not None else getattr(function, "__name__", ""),
        description=text.strip(),
        parameters=schema_object,
        function=run,
        access=access,
        wrapped=function,
    )


def _is_context(name: str, annotation: Any) -> bool:
    if annotation is ToolContext:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return members == [ToolContext]
    return name == "context" and annotation is inspect.Parameter.empty


def _strip_annotated(annotation: Any) -> tuple[Any, str | None]:
    """``Annotated[T, "text"]`` → ``(T, "text")``; other metadata is ignored, and so are
    ``Required``/``NotRequired`` (a TypedDict's ``__required_keys__`` already says)."""
    note: str | None = None
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation, *metadata = typing.get_args(annotation)
            note = note or next((m for m in metadata if isinstance(m, str)), None)
        elif origin in (typing.Required, typing.NotRequired):
            annotation = typing.get_args(annotation)[0]
        else:
            return annotation, note


def _identity(value: Any) -> Any:
    return value


def _schema(annotation: Any, where: str) -> tuple[dict[str, Any], Converter]:
    """The JSON schema of an annotation, and how to turn a validated JSON value into the
    Python value the function expects."""
    annotation, _ = _strip_annotated(annotation)
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if annotation is Any:
        return {}, _identity
    if annotation is str:
        return {"type": "string"}, _identity
    if annotation is bool:
        return {"type": "boolean"}, _identity
    if annotation is int:
        return {"type": "integer"}, _identity
    if annotation is float:
        return {"type": "number"}, float
    if annotation is type(None):
        return {"type": "null"}, _identity
    if annotation is list:
        return {"type": "array"}, _identity
    if annotation is dict:
        return {"type": "object"}, _identity
    if origin is Literal:
        return _literal_schema(arguments, where), _identity
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
        if not values or not all(_is_scalar(v) for v in values):
            raise InvalidRequest(f"{where}: enum {annotation.__name__} needs str/int values")
        return {**_enum_type(values), "enum": values}, annotation
    if origin is list:
        item_schema, convert_item = _schema(arguments[0], where) if arguments else ({}, _identity)
        return {"type": "array", "items": item_schema}, lambda v: [convert_item(i) for i in v]
    if origin is dict:
        key, value = arguments
        if key is not str:
            raise InvalidRequest(f"{where}: JSON object keys are strings, not {key!r}")
        value_schema, convert_value = _schema(value, where)
        return (
            {"type": "object", "additionalProperties": value_schema},
            lambda v: {k: convert_value(i) for k, i in v.items()},
        )
    if origin in (typing.Union, types.UnionType):
        return _union_schema(arguments, where)
    if typing.is_typeddict(annotation):
        return _typeddict_schema(annotation, where)
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return _dataclass_schema(annotation, where)
    raise InvalidRequest(
        f"{where}: annotation {annotation!r} cannot be declared as JSON schema "
        f"(supported: {_SUPPORTED})"
    )


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _enum_type(values: list[Any]) -> dict[str, Any]:
    kinds = {"null" if v is None else _json_kind(v) for v in values}
    return {"type": kinds.pop()} if len(kinds) == 1 else {}


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return "number" if isinstance(value, float) else "string"


def _literal_schema(values: tuple[Any, ...], where: str) -> dict[str, Any]:
    if not values or not all(_is_scalar(v) for v in values):
        raise InvalidRequest(f"{where}: Literal values must be str, int, float, bool or None")
    options = list(values)
    return {**_enum_type(options), "enum": options}


def _union_schema(members: tuple[Any, ...], where: str) -> tuple[dict[str, Any], Converter]:
    parts = [_schema(member, where) for member in members]
    options = [schema for schema, _ in parts]

    def convert(value: Any) -> Any:
        # The first alternative the value validates against decides its Python type, so
        # ``int | float`` keeps 3 an int and ``Point | None`` builds the Point.
        for schema, member_convert in parts:
            try:
                validate(value, schema, "")
            except InvalidRequest:
                continue
            return member_convert(value)
        return value

    return {"anyOf": options}, convert


def _object_schema(
    fields: list[tuple[str, Any, bool]], where: str, build: Callable[[dict[str, Any]], Any]
) -> tuple[dict[str, Any], Converter]:
    properties: dict[str, Any] = {}
    converters: dict[str, Converter] = {}
    required: list[str] = []
    for field_name, annotation, is_required in fields:
        inner, note = _strip_annotated(annotation)
        schema, convert = _schema(inner, f"{where}, field {field_name!r}")
        properties[field_name] = {**schema, "description": note} if note else schema
        converters[field_name] = convert
        if is_required:
            required.append(field_name)
    schema_object = _closed_object(properties, required)

    def convert_object(value: dict[str, Any]) -> Any:
        return build({k: converters[k](v) for k, v in value.items()})

    return schema_object, convert_object


def _typeddict_schema(annotation: Any, where: str) -> tuple[dict[str, Any], Converter]:
    hints = typing.get_type_hints(annotation, include_extras=True)
    required_keys = getattr(annotation, "__required_keys__", frozenset(hints))
    fields = [(key, hint, _required_key(key, hint, required_keys)) for key, hint in hints.items()]
    return _object_schema(fields, where, dict)


def _required_key(key: str, hint: Any, required_keys: frozenset[str]) -> bool:
    # Under ``from __future__ import annotations`` Python 3.11 cannot see NotRequired when
    # it builds ``__required_keys__``; the resolved hint can.
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) is typing.NotRequired:
        return False
    return typing.get_origin(hint) is typing.Required or key in required_keys


def _dataclass_schema(annotation: type[Any], where: str) -> tuple[dict[str, Any], Converter]:
    hints = typing.get_type_hints(annotation, include_extras=True)
    fields = [
        (
            item.name,
            hints[item.name],
            item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING,
        )
        for item in dataclasses.fields(annotation)
        if item.init
    ]
    return _object_schema(fields, where, lambda values: annotation(**values))


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _to_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=_jsonable)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


# --------------------------------------------------------------------------- docstrings


@dataclass(frozen=True)
class Docstring:
    """A docstring's prose (before its first section) and its parameter descriptions."""

    description: str
    parameters: Mapping[str, str]


_GOOGLE_ARGS = re.compile(
    r"(?:Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments)\s*:\s*", re.IGNORECASE
)
_GOOGLE_SECTION = re.compile(
    r"(?:Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters|"
    r"Returns?|Yields?|Raises|Examples?|Notes?|Attributes|See Also|Warnings?|Warns|Todo|"
    r"References|Methods)\s*:\s*",
    re.IGNORECASE,
)
_GOOGLE_ENTRY = re.compile(r"(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")
_NUMPY_ENTRY = re.compile(r"(\*{0,2}\w+)\s*(?::.*)?")
_REST_PARAM = re.compile(
    r":(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?(\w+)\s*:(.*)"
)
_NUMPY_ARGS = {"parameters", "other parameters", "keyword arguments"}


def parse_docstring(text: str) -> Docstring:
    """Split a (cleaned) docstring into its prose and its per-parameter descriptions, in
    Google (``Args:``), NumPy (``Parameters`` over dashes) or reST (``:param x:``) style.
    Continuation lines are joined with spaces."""
    lines = inspect.cleandoc(text).splitlines() if text else []
    description: list[str] = []
    parameters: dict[str, str] = {}
    in_sections = False
    index = 0
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        underlined = index + 1 < len(lines) and _is_underline(lines[index + 1])
        if underlined:  # NumPy: a heading over a line of dashes
            index = _numpy_section(lines, index, parameters)
        elif not line[:1].isspace() and _GOOGLE_SECTION.fullmatch(stripped):
            index = _google_section(lines, index, parameters)
        elif stripped.startswith(":"):
            index = _rest_field(lines, index, parameters)
        else:
            # Prose after the first section (say, after "Returns:") does not describe
            # the tool.
            if not in_sections:
                description.append(stripped)
            index += 1
            continue
        in_sections = True
    return Docstring(description=_paragraphs(description), parameters=parameters)


def _is_underline(line: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= 3 and set(stripped) == {"-"}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _google_section(lines: list[str], index: int, parameters: dict[str, str]) -> int:
    is_args = _GOOGLE_ARGS.fullmatch(lines[index].strip()) is not None
    index += 1
    entry_indent: int | None = None
    current: str | None = None
    while index < len(lines):
        line = lines[index]
        if line.strip() and _indent(line) == 0:
            break  # the next section or prose at the margin
        if line.strip() and is_args:
            if entry_indent is None:
                entry_indent = _indent(line)
            match = _GOOGLE_ENTRY.fullmatch(line.strip())
            if _indent(line) <= entry_indent and match:
                current = match.group(1).lstrip("*")
                parameters[current] = match.group(2).strip()
            elif current is not None:
                parameters[current] = f"{parameters[current]} {line.strip()}".strip()
        index += 1
    return index


def _numpy_section(lines: list[str], index: int, parameters: dict[str, str]) -> int:
    is_args = lines[index].strip().lower() in _NUMPY_ARGS
    index += 2
    current: str | None = None
    while index < len(lines):
        line = lines[index]
        if index + 1 < len(lines) and _is_underline(lines[index + 1]) and line.strip():
            break  # the next heading
        if line.strip() and is_args:
            match = _NUMPY_ENTRY.fullmatch(line.strip())
            if _indent(line) == 0 and match:
                current = match.group(1).lstrip("*")
                parameters[current] = ""
            elif current is not None:
                parameters[current] = f"{parameters[current]} {line.strip()}".strip()
        index += 1
    return index


def _rest_field(lines: list[str], index: int, parameters: dict[str, str]) -> int:
    match = _REST_PARAM.fullmatch(lines[index].strip())
    current = match.group(1) if match else None
    if current is not None and match is not None:
        parameters[current] = match.group(2).strip()
    index += 1
    while index < len(lines) and lines[index].strip() and _indent(lines[index]) > 0:
        if current is not None:
            parameters[current] = f"{parameters[current]} {lines[index].strip()}".strip()
        index += 1
    return index


def _paragraphs(lines: list[str]) -> str:
    """Join wrapped lines into paragraphs separated by a blank line."""
    paragraphs: list[str] = []
    current: list[str] = []
    for line in [*lines, ""]:
        if line:
            current.append(line)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    return "\n\n".join(paragraphs)


def _closed_object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An object schema that admits exactly ``properties`` (a function's parameters or a
    record's fields) and names the ``required`` ones."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    return schema
