"""A tool built from a Python function and a JSON schema, with its arguments validated
before the function runs (a validation error goes back to the model, nothing runs)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from parley.errors import InvalidRequest
from schemas.messages import ToolDeclaration
from workers.ports import Access, ToolContext

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
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
        try:
            value = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"{self.name}: arguments are not valid JSON ({exc.msg})") from exc
        validate(value, self.parameters, self.name)
        return dict(value)

    def accesses(self, arguments: dict[str, Any]) -> Sequence[Access]:
        """What the call touches."""
        return self.access(arguments)

    def run(self, arguments: dict[str, Any], context: ToolContext) -> str:
        """Call the function."""
        return self.function(arguments, context)


def validate(value: Any, schema: dict[str, Any], where: str) -> None:
    """Check ``value`` against the subset of JSON Schema tools declare: ``type``,
    ``properties``, ``required``, ``additionalProperties: false``, ``items``, ``enum``."""
    expected = schema.get("type")
    if expected is not None:
        kinds = _JSON_TYPES.get(expected)
        if kinds is None:
            raise InvalidRequest(f"{where}: schema type {expected!r} is not supported")
        # JSON has no separate boolean-as-integer: True is not an integer argument.
        if not isinstance(value, kinds) or (
            expected in ("integer", "number") and isinstance(value, bool)
        ):
            raise InvalidRequest(f"{where}: expected {expected}, got {type(value).__name__}")
    if "enum" in schema and value not in schema["enum"]:
        raise InvalidRequest(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        properties: dict[str, Any] = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                raise InvalidRequest(f"{where}: missing required argument {name!r}")
        for name, item in value.items():
            if name in properties:
                validate(item, properties[name], f"{where}.{name}")
            elif schema.get("additionalProperties", True) is False:
                raise InvalidRequest(f"{where}: unexpected argument {name!r}")
    if isinstance(value, list) and "items" in schema:
        for position, item in enumerate(value):
            validate(item, schema["items"], f"{where}[{position}]")
