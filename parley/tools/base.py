"""A tool built from a Python function and a JSON schema, with its arguments validated
before the function runs (a validation error goes back to the model, nothing runs)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from parley.errors import InvalidRequest
from schemas.messages import ToolDeclaration
from workers.host_ports import Access, ToolContext

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


@dataclass(frozen=True, kw_only=True)
class FunctionTool:
    """A tool: ``run(arguments, context) -> str`` behind a declared JSON schema.

    ``accesses`` tells the policy what a call would read, write or execute."""

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[[dict[str, Any], ToolContext], str]
    access: Callable[[dict[str, Any]], Sequence[Access]] = field(default=lambda _args: ())

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not TOOL_NAME.fullmatch(self.name):
            # What every major provider accepts; anything else fails at the provider.
            raise InvalidRequest(f"tool name {self.name!r} must match {TOOL_NAME.pattern}")
        if self.parameters.get("type") != "object":
            raise InvalidRequest(f"tool {self.name!r}: parameters must be a JSON object schema")

    @property
    def declaration(self) -> ToolDeclaration:
        """What the model sees."""
        return ToolDeclaration(
            name=self.name, description=self.description, parameters=self.parameters
        )

    def parse(self, arguments: str) -> dict[str, Any]:
        """Decode and validate the model's argument text."""
        value = decode_arguments(arguments, self.name)
        validate(value, self.parameters, self.name)
        return dict(value)

    def accesses(self, arguments: dict[str, Any]) -> Sequence[Access]:
        """What the call touches."""
        return self.access(arguments)

    def run(self, arguments: dict[str, Any], context: ToolContext) -> str:
        """Call the function."""
        return self.function(arguments, context)


def decode_arguments(arguments: str, where: str) -> Any:
    """The model's argument text as JSON (empty text is no arguments).  ``NaN`` and
    ``Infinity``, which Python's decoder accepts, are refused: no bound holds for them
    (``NaN < minimum`` is false), so a timeout of ``NaN`` would never expire."""
    try:
        return json.loads(arguments, parse_constant=_refuse_constant) if arguments.strip() else {}
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{where}: arguments are not valid JSON ({exc.msg})") from exc


def _refuse_constant(name: str) -> Any:
    raise InvalidRequest(f"{name} is not a JSON number")


def validate(value: Any, schema: dict[str, Any], where: str) -> None:
    """Check ``value`` against the subset of JSON Schema tools declare: ``type`` (one name
    or a list, ``null`` included), ``anyOf``, ``enum``, ``properties``, ``required``,
    ``additionalProperties`` (``false`` or a schema), ``items``, ``minItems``/``maxItems``,
    ``minLength`` and ``minimum``/``maximum``.  Other keywords (``description``,
    ``default``, …) are annotations and ignored."""
    if "anyOf" in schema:
        _validate_any_of(value, schema["anyOf"], where)
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        for name in names:
            if name not in _JSON_TYPES:
                raise InvalidRequest(f"{where}: schema type {name!r} is not supported")
        if not any(_is_type(value, name) for name in names):
            raise InvalidRequest(
                f"{where}: expected {' or '.join(names)}, got {json_type_name(value)}"
            )
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        raise InvalidRequest(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        _validate_object(value, schema, where)
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise InvalidRequest(f"{where}: needs at least {schema['minItems']} item(s)")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise InvalidRequest(f"{where}: takes at most {schema['maxItems']} item(s)")
        if "items" in schema:
            for position, item in enumerate(value):
                validate(item, schema["items"], f"{where}[{position}]")
    if isinstance(value, str) and "minLength" in schema and len(value) < schema["minLength"]:
        raise InvalidRequest(f"{where}: needs at least {schema['minLength']} character(s)")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest(f"{where}: {value!r} is not a finite number")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise InvalidRequest(f"{where}: {value!r} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise InvalidRequest(f"{where}: {value!r} is above the maximum {schema['maximum']}")


def json_type_name(value: Any) -> str:
    """The JSON name of a decoded value's type (what error messages call it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    for name in ("integer", "number", "string", "array", "object"):
        if isinstance(value, _JSON_TYPES[name]):
            return name
    return type(value).__name__


def _is_type(value: Any, name: str) -> bool:
    # JSON has no separate boolean-as-integer: True is not an integer argument.
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    return isinstance(value, _JSON_TYPES[name])


def _same(value: Any, option: Any) -> bool:
    # 1 == True in Python but not in JSON: an enum of [1] does not admit true.
    return bool(value == option) and isinstance(value, bool) == isinstance(option, bool)


def _validate_object(value: dict[str, Any], schema: dict[str, Any], where: str) -> None:
    properties: dict[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            raise InvalidRequest(f"{where}: missing required argument {name!r}")
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            validate(item, properties[name], f"{where}.{name}")
        elif extra is False:
            raise InvalidRequest(f"{where}: unexpected argument {name!r}")
        elif isinstance(extra, dict):
            validate(item, extra, f"{where}.{name}")


def _validate_any_of(value: Any, options: list[dict[str, Any]], where: str) -> None:
    failures: list[tuple[dict[str, Any], InvalidRequest]] = []
    for option in options:
        try:
            validate(value, option, where)
        except InvalidRequest as exc:
            failures.append((option, exc))
        else:
            return
    # When exactly one alternative has the value's type, its own error is the useful one
    # (say, the missing key of an object), not "matches none of".
    typed = [(o, e) for o, e in failures if "type" in o and _type_fits(value, o["type"])]
    if len(typed) == 1:
        raise typed[0][1]
    wanted = " or ".join(_describe(option) for option in options)
    raise InvalidRequest(f"{where}: expected {wanted}, got {json_type_name(value)}")


def _type_fits(value: Any, expected: str | list[str]) -> bool:
    names = expected if isinstance(expected, list) else [expected]
    return any(name in _JSON_TYPES and _is_type(value, name) for name in names)


def _describe(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return f"one of {schema['enum']}"
    expected = schema.get("type")
    if isinstance(expected, list):
        return " or ".join(expected)
    return str(expected) if expected else "a value"
