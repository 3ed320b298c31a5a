"""A tool built from a Python function and a JSON schema, with its arguments validated
before the function runs (a validation error goes back to the model, nothing runs)."""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import extend

from parley.errors import InvalidRequest
from parley.ports.host import Access, ToolContext, WaitFor
from parley.schemas.messages import ToolDeclaration

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


@dataclass(frozen=True, kw_only=True)
class FunctionTool:
    """A tool: ``run(arguments, context) -> str`` behind a declared JSON schema.

    ``accesses`` tells the policy what a call would read, write or execute."""

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[[dict[str, Any], ToolContext], str | WaitFor]
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

    def run(self, arguments: dict[str, Any], context: ToolContext) -> str | WaitFor:
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


# --------------------------------------------------------------------------- validation


def _is_integer(_checker: Any, value: Any) -> bool:
    # JSON has no boolean-as-integer (True is not an integer argument), and a decoded 1.0
    # is a float: the function would get 1.0 where it declared int.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(_checker: Any, value: Any) -> bool:
    # No bound holds for NaN or an infinity (1e400 decodes to inf), so neither is a number.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)  # an int of any size is finite


_TYPES = Draft202012Validator.TYPE_CHECKER.redefine_many(
    {"integer": _is_integer, "number": _is_number}
)
# The stubs leave ``extend`` untyped; what it returns is a validator class.
_Checker: type[Validator] = extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, type_checker=_TYPES
)


def validate(value: Any, schema: dict[str, Any], where: str) -> None:
    """Check ``value`` against a JSON schema (draft 2020-12, formats unchecked) and raise
    :class:`InvalidRequest` with the first problem, worded for the model: the shallowest
    one, so a missing argument is named before a wrong value inside another.  Integers
    and numbers are JSON's: ``true`` is neither, ``1.0`` is not an integer, and ``NaN``
    and infinities are no numbers.  A schema that is not valid JSON Schema is refused."""
    try:
        checker = _checker(json.dumps(schema, sort_keys=True))
    except SchemaError as exc:
        place = "/".join(str(part) for part in exc.path) or "the root"
        raise InvalidRequest(
            f"{where}: the tool's schema is not supported: {exc.message} (at {place})"
        ) from exc
    errors = list(checker.iter_errors(value))
    if errors:
        raise InvalidRequest(_wording(_first(errors), where))


@functools.lru_cache(maxsize=256)
def _checker(schema_text: str) -> Validator:
    # Checking a schema against the metaschema takes milliseconds and a tool's schema is
    # the same on every call, so each is checked and compiled once (keyed by its text: a
    # dict cannot be a key).
    schema = json.loads(schema_text)
    _Checker.check_schema(schema)
    return _Checker(schema)


def _first(errors: list[ValidationError]) -> ValidationError:
    return min(errors, key=lambda error: len(error.path))


# The keywords whose sentence needs only the place, the value and the schema's setting.
_SIMPLE_WORDING = {
    "enum": "{at}: {value!r} is not one of {setting}",
    "minimum": "{at}: {value!r} is below the minimum {setting}",
    "maximum": "{at}: {value!r} is above the maximum {setting}",
    "minItems": "{at}: needs at least {setting} item(s)",
    "maxItems": "{at}: takes at most {setting} item(s)",
    "minLength": "{at}: needs at least {setting} character(s)",
}


def _wording(error: ValidationError, where: str) -> str:
    """parley's sentence for one of jsonschema's errors; ``where`` names the tool."""
    at = where + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path
    )
    # jsonschema sets these on every error it yields (the stubs allow them unset).
    value: Any = error.instance
    setting: Any = error.validator_value
    rule = str(error.validator)
    if rule == "type" and isinstance(value, float) and not math.isfinite(value):
        return f"{at}: {value!r} is not a finite number"
    if rule == "type":
        names = setting if isinstance(setting, list) else [setting]
        return f"{at}: expected {' or '.join(names)}, got {json_type_name(value)}"
    if rule == "anyOf":
        return _any_of_wording(error, at, where)
    if rule == "required":
        missing = next(name for name in setting if name not in value)
        return f"{at}: missing required argument {missing!r}"
    if rule == "additionalProperties":
        return f"{at}: unexpected argument {_extra_key(value, error.schema)!r}"
    wording = _SIMPLE_WORDING.get(rule)
    if wording is not None:
        return wording.format(at=at, value=value, setting=setting)
    return f"{at}: {error.message}"  # the rarer keywords, in jsonschema's words


def _extra_key(value: dict[str, Any], schema: Any) -> str:
    """The first key of ``value`` that its closed object ``schema`` does not admit."""
    known = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    return next(
        name
        for name in value
        if name not in known and not any(re.search(pattern, name) for pattern in patterns)
    )


def _any_of_wording(error: ValidationError, at: str, where: str) -> str:
    options: Any = error.validator_value
    value: Any = error.instance
    # When exactly one alternative has the value's type, its own error is the useful one
    # (say, the missing key of an object), not "matches none of".
    typed = [
        index
        for index, option in enumerate(options)
        if "type" in option and _type_fits(value, option["type"])
    ]
    if len(typed) == 1:
        own = [e for e in error.context or () if e.relative_schema_path[0] == typed[0]]
        if own:
            return _wording(_first(own), where)
    wanted = " or ".join(_describe(option) for option in options)
    return f"{at}: expected {wanted}, got {json_type_name(value)}"


def _type_fits(value: Any, expected: str | list[str]) -> bool:
    names = expected if isinstance(expected, list) else [expected]
    return any(_TYPES.is_type(value, name) for name in names)


def _describe(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return f"one of {schema['enum']}"
    expected = schema.get("type")
    if isinstance(expected, list):
        return " or ".join(expected)
    return str(expected) if expected else "a value"


def json_type_name(value: Any) -> str:
    """The JSON name of a decoded value's type (what error messages call it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__
