"""A decorated function's parameters as pydantic sees them: the JSON schema the model is
shown, and the conversion of the model's arguments into the Python values the function
takes (floats for ``float``, enum members, dataclass instances).

Only annotations that map one-to-one onto JSON are accepted: ``str``, ``int``,
``float``, ``bool``, ``None``, ``list[T]``, ``dict[str, T]``, ``Literal[...]``, ``Enum``
subclasses, unions, ``Any``, ``TypedDict`` and dataclass types, nested freely.  pydantic
would take more (tuples, sets, bytes, paths …), but their schemas are ones providers
handle badly or not at all, so they are refused when the function is decorated.

Records (TypedDicts and dataclasses) reach pydantic rebuilt as ``typing_extensions``
TypedDicts: pydantic refuses ``typing.TypedDict`` before Python 3.12, a dataclass
becomes a closed object that builds the instance once validated, and ``Annotated[T,
"text"]`` on any field becomes the field's description.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import typing_extensions
from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from parley.errors import InvalidRequest

_SUPPORTED = (
    "str, int, float, bool, list[T], dict[str, T], Literal[...], Enum, X | None, unions, "
    "Any, TypedDict, dataclasses, Annotated[T, 'description']"
)

_PLAIN = (Any, str, int, float, bool, type(None), list, dict)

# TypedDict's functional form, called with fields computed at run time (which a type
# checker cannot follow): names need not suit a class body, and typing_extensions'
# TypedDict is the one pydantic takes on every Python.
_typed_dict: Any = typing_extensions.TypedDict


@dataclass(frozen=True)
class Argument:
    """One parameter the model fills in, as read from the signature: its annotation as
    written (``Annotated[T, "text"]`` included), its default (``inspect.Parameter.empty``
    when the model must give it) and the docstring's description of it."""

    name: str
    annotation: Any
    default: Any = inspect.Parameter.empty
    docstring: str | None = None


class ArgumentsSchema:
    """The JSON schema of a function's arguments and their conversion, built by pydantic
    from the :class:`Argument` list.

    ``where`` prefixes the refusal of an unsupported annotation (``@tool name``).  The
    schema is a closed object; a parameter with a default is optional and declares the
    default when it is JSON."""

    def __init__(self, arguments: Sequence[Argument], where: str) -> None:
        members: dict[str, Any] = {}
        for argument in arguments:
            inner, note = _split_annotated(argument.annotation)
            declared = _declarable(inner, f"{where}: parameter {argument.name!r}", frozenset())
            members[argument.name] = _member(
                declared,
                argument.default is inspect.Parameter.empty,
                note or argument.docstring,
            )
        shape = _typed_dict("arguments", members)
        # Closed objects, at every level (the config reaches nested records).
        shape.__pydantic_config__ = ConfigDict(extra="forbid")
        self._adapter: TypeAdapter[dict[str, Any]] = TypeAdapter(shape)
        schema = _inline(self._adapter.json_schema(schema_generator=_Declaration))
        for argument in arguments:
            default = argument.default
            if isinstance(default, enum.Enum):
                default = default.value
            if default is not inspect.Parameter.empty and _is_json(default):
                schema["properties"][argument.name]["default"] = default
        self.json_schema: dict[str, Any] = schema

    def convert(self, arguments: dict[str, Any], where: str) -> dict[str, Any]:
        """The Python values of the arguments given (defaults are the function's to fill
        in); ``where`` names the tool in an :class:`InvalidRequest`.

        The arguments are expected to have passed the JSON schema already (JSON's rules,
        in parley's words: :func:`parley.tools.base.validate`), so pydantic runs in its
        lax mode, which takes an enum's value for its member; its own refusals (say, a
        dataclass's ``__post_init__`` raising ``ValueError``) keep its words."""
        try:
            return self._adapter.validate_python(arguments)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            raise InvalidRequest(
                f"{where}{_path(error['loc'], arguments)}: {error['msg']}"
            ) from exc


def _split_annotated(annotation: Any) -> tuple[Any, str | None]:
    """``Annotated[T, "text"]`` → ``(T, "text")``; other metadata is dropped, and so are
    ``Required``/``NotRequired`` (a record's required keys are read separately)."""
    note: str | None = None
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation, *metadata = typing.get_args(annotation)
            note = note or next((m for m in metadata if isinstance(m, str)), None)
        elif origin in (typing.Required, typing.NotRequired):
            annotation = typing.get_args(annotation)[0]
        else:
            return annotation, note


def _is_scalar_type(annotation: Any, origin: Any, arguments: tuple[Any, ...], where: str) -> bool:
    """Whether ``annotation`` is a JSON scalar as it is (a plain type, a Literal, an enum);
    :class:`InvalidRequest` for a Literal or enum whose values are not scalars."""
    if any(annotation is plain for plain in _PLAIN):
        return True
    if origin is Literal:
        if not all(_is_scalar(value) for value in arguments):
            raise InvalidRequest(f"{where}: Literal values must be str, int, float, bool or None")
        return True
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
        if not values or not all(_is_scalar(value) for value in values):
            raise InvalidRequest(f"{where}: enum {annotation.__name__} needs str/int values")
        return True
    return False


def _declarable(annotation: Any, where: str, enclosing: frozenset[type]) -> Any:
    """``annotation`` as pydantic should see it, or :class:`InvalidRequest` if it has no
    JSON equivalent.  ``enclosing`` holds the records being rebuilt around it."""
    annotation, _ = _split_annotated(annotation)  # a description only describes a field
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if _is_scalar_type(annotation, origin, arguments, where):
        return annotation
    if origin is list:
        if not arguments:  # typing.List
            return list
        return list[_declarable(arguments[0], where, enclosing)]  # type: ignore[misc]
    if origin is dict:
        if not arguments:  # typing.Dict
            return dict
        key, value = arguments
        if key is not str:
            raise InvalidRequest(f"{where}: JSON object keys are strings, not {key!r}")
        return dict[str, _declarable(value, where, enclosing)]  # type: ignore[misc]
    if origin in (typing.Union, types.UnionType):
        members = tuple(_declarable(member, where, enclosing) for member in arguments)
        return typing.Union[members]  # noqa: UP007 - made of a tuple, which | cannot take
    if typing.is_typeddict(annotation):
        return _record(annotation, _typeddict_fields(annotation, where), where, enclosing)
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        record = _record(annotation, _dataclass_fields(annotation, where), where, enclosing)
        return Annotated[record, AfterValidator(lambda values: annotation(**values))]
    raise InvalidRequest(
        f"{where}: annotation {annotation!r} cannot be declared as JSON schema "
        f"(supported: {_SUPPORTED})"
    )


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _member(declared: Any, required: bool, description: str | None) -> Any:
    """A field of a rebuilt record: its description on it, ``NotRequired`` if optional."""
    if description:
        declared = Annotated[declared, Field(description=description)]
    return declared if required else typing_extensions.NotRequired[declared]


def _record(
    cls: type,
    fields: list[tuple[str, Any, bool]],
    where: str,
    enclosing: frozenset[type],
) -> Any:
    if cls in enclosing:
        # The schema is declared inline, as providers take it best; a type that contains
        # itself has no inline schema.
        raise InvalidRequest(f"{where}: {cls.__name__} contains itself, which cannot be declared")
    members: dict[str, Any] = {}
    for name, hint, required in fields:
        inner, note = _split_annotated(hint)
        declared = _declarable(inner, f"{where}, field {name!r}", enclosing | {cls})
        members[name] = _member(declared, required, note)
    return _typed_dict(cls.__name__, members)


def _hints(cls: type, where: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except (TypeError, NameError) as exc:
        raise InvalidRequest(f"{where}: cannot read the fields of {cls.__name__} ({exc})") from exc


def _typeddict_fields(cls: type, where: str) -> list[tuple[str, Any, bool]]:
    hints = _hints(cls, where)
    required_keys: frozenset[str] = getattr(cls, "__required_keys__", frozenset(hints))
    return [(key, hint, _required_key(key, hint, required_keys)) for key, hint in hints.items()]


def _required_key(key: str, hint: Any, required_keys: frozenset[str]) -> bool:
    # Under ``from __future__ import annotations`` Python 3.11 cannot see NotRequired when
    # it builds ``__required_keys__``; the resolved hint can.
    while typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) is typing.NotRequired:
        return False
    return typing.get_origin(hint) is typing.Required or key in required_keys


def _dataclass_fields(cls: type, where: str) -> list[tuple[str, Any, bool]]:
    hints = _hints(cls, where)
    return [
        (
            item.name,
            hints[item.name],
            item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING,
        )
        for item in dataclasses.fields(cls)
        if item.init
    ]


class _Declaration(GenerateJsonSchema):
    """pydantic's JSON schema as parley declared it before pydantic: no field titles
    (noise to a model), a one-value ``Literal`` as an ``enum`` (not every provider takes
    ``const``), no empty ``items`` or ``true`` ``additionalProperties``, and keys in the
    order pydantic writes them (``type`` first), not sorted.  The titles and docstrings
    of records and enums go with their definitions, in :func:`_inline`."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def literal_schema(self, schema: core_schema.LiteralSchema) -> JsonSchemaValue:
        result = super().literal_schema(schema)
        if "const" in result:
            result = {"enum": [result.pop("const")], **result}
        return result

    def list_schema(self, schema: core_schema.ListSchema) -> JsonSchemaValue:
        result = super().list_schema(schema)
        if result.get("items") == {}:
            del result["items"]
        return result

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        result = super().dict_schema(schema)
        if result.get("additionalProperties") is True:
            del result["additionalProperties"]
        return result

    def sort(self, value: JsonSchemaValue, parent_key: str | None = None) -> JsonSchemaValue:
        return value


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``$ref`` replaced by its definition, as parley declared
    nested records before pydantic (no recursion is possible: see :func:`_record`).

    A definition is a record or an enum; its title (the class name) and docstring are
    dropped, as they were before: the model is told about fields and parameters."""
    definitions: dict[str, Any] = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, list):
            return [resolve(item) for item in node]
        if not isinstance(node, dict):
            return node
        resolved = {key: resolve(value) for key, value in node.items() if key != "$ref"}
        if "$ref" not in node:
            return resolved
        definition = resolve(definitions[node["$ref"].removeprefix("#/$defs/")])
        definition.pop("title", None)
        definition.pop("description", None)
        # Keywords beside the reference (a field's description) are the field's own.
        return {**definition, **resolved}

    result: dict[str, Any] = resolve(schema)
    result.pop("title", None)  # the arguments' record, named "arguments"
    return result


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)  # NaN would make the declaration invalid JSON
    except (TypeError, ValueError):
        return False
    return True


def _path(loc: tuple[int | str, ...], arguments: Any) -> str:
    """Where in the arguments pydantic's error is: ``.key`` and ``[index]`` steps.  A step
    that is not a key or index of the value there names a union's branch, not a place."""
    text = ""
    value = arguments
    for step in loc:
        if isinstance(value, dict) and step in value:
            text += f".{step}"
        elif isinstance(value, list) and isinstance(step, int) and 0 <= step < len(value):
            text += f"[{step}]"
        else:
            continue
        value = value[step]
    return text
