"""``McpTool``: one tool of a connected MCP server, as a parley tool."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any

import mcp_types

from parley.errors import InvalidRequest, McpError
from parley.mcp.connection import McpConnection
from parley.ports.host import Access, ToolContext
from parley.schemas.messages import ToolDeclaration
from parley.tools.base import decode_arguments, validate

# The JSON Schema keywords parley checks before a call, and the types it knows.  Anything
# else in a server's schema (anyOf, $ref, formats, bounds …) is left to the server, which
# validates its arguments anyway: a weaker local check never refuses a valid call.
_CHECKED_TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object"})


class McpTool:
    """A remote tool: ``run`` calls it on its server (waiting at most the server's call
    timeout) and returns the text of the result.

    - The declaration is the server's own (description and input schema), under
      ``name``, which is the server's tool name with the spec's ``tool_prefix`` and any
      character a model provider would refuse replaced by ``_``.
    - ``accesses`` is one ``mcp`` access of ``<server>/<tool>`` (the server's tool name),
      so a :class:`parley.Policy` allows MCP tools through ``allow_mcp`` globs (e.g.
      ``"**"`` or ``"github/*"``) and refuses them by default; ``deny_tools`` denies one
      by its exposed name.
    - A result the server marks ``is_error``, a timeout or a lost connection raises
      :class:`McpError` with the server's message, so the engine reports an error result
      to the model and the turn goes on.
    """

    def __init__(self, *, name: str, remote: mcp_types.Tool, connection: McpConnection) -> None:
        self.name = name
        self.remote = remote
        self.connection = connection
        schema = dict(remote.input_schema)
        schema.setdefault("type", "object")
        if schema["type"] != "object":
            raise McpError(
                f"MCP server {connection.name!r}: tool {remote.name!r} takes "
                f"{schema['type']!r}, but a tool's parameters must be a JSON object"
            )
        # Some providers reject an object schema without properties.
        schema.setdefault("properties", {})
        self._parameters = schema
        self._checked = _checkable(schema)
        self._declaration = ToolDeclaration(
            name=name,
            description=remote.description or remote.title or f"{remote.name} (MCP)",
            parameters=schema,
        )

    def __repr__(self) -> str:
        return f"McpTool({self.name!r}, server={self.server!r})"

    @property
    def server(self) -> str:
        """The name of the server the tool lives on."""
        return self.connection.name

    @property
    def declaration(self) -> ToolDeclaration:
        """What the model sees: the server's description and input schema."""
        return self._declaration

    @property
    def policy_path(self) -> str:
        """The path of the ``mcp`` access the policy checks: ``<server>/<tool>``."""
        return f"{self.server}/{self.remote.name}"

    def parse(self, arguments: str) -> dict[str, Any]:
        """Decode the model's argument text and check it against the schema's plain
        constraints (types, required, enums, closed objects)."""
        value = decode_arguments(arguments, self.name)
        if not isinstance(value, dict):
            raise InvalidRequest(f"{self.name}: arguments must be a JSON object")
        validate(value, self._checked, self.name)
        return value

    def accesses(self, arguments: dict[str, Any]) -> Sequence[Access]:
        """One ``mcp`` access of ``<server>/<tool>``: the call runs outside the workspace,
        under its own rule (not ``allow_execute``, whose globs match command lines)."""
        return (Access(mode="mcp", path=self.policy_path),)

    def run(self, arguments: dict[str, Any], context: ToolContext) -> str:
        """Call the tool on its server; raise :class:`McpError` on an error result."""
        result = self.connection.call(self.remote.name, arguments)
        text = render_result(result)
        if result.is_error:
            raise McpError(
                text or f"tool {self.remote.name!r} of MCP server {self.server!r} failed"
            )
        return text


def render_result(result: mcp_types.CallToolResult) -> str:
    """The text of a tool result: text blocks as they are, anything else summarised in one
    bracketed line; the structured content (as JSON) when there is no content at all."""
    parts = [_render_block(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _render_block(block: mcp_types.ContentBlock) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return f"[{block.type}: {block.mime_type}, {_size(block.data)}]"
    if isinstance(block, mcp_types.ResourceLink):
        kind = f", {block.mime_type}" if block.mime_type else ""
        return f"[resource link: {block.uri} ({block.name}{kind})]"
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return f"[resource {resource.uri}]\n{resource.text}"
        kind = resource.mime_type or "binary"
        return f"[resource {resource.uri}: {kind}, {_size(resource.blob)}]"
    return f"[{getattr(block, 'type', type(block).__name__)} content]"  # pragma: no cover


def _size(data: str) -> str:
    try:
        return f"{len(base64.b64decode(data, validate=True))} bytes"
    except (binascii.Error, ValueError):
        return f"{len(data)} base64 characters"


def _checkable(schema: Any) -> dict[str, Any]:
    """The part of a JSON schema that :func:`parley.tools.base.validate` checks exactly:
    each keyword kept is a constraint on its own, so dropping the rest only weakens it."""
    if not isinstance(schema, dict):
        return {}
    kept: dict[str, Any] = {}
    if isinstance(schema.get("type"), str) and schema["type"] in _CHECKED_TYPES:
        kept["type"] = schema["type"]
    if isinstance(schema.get("enum"), list):
        kept["enum"] = schema["enum"]
    properties = schema.get("properties")
    if isinstance(properties, dict):
        kept["properties"] = {key: _checkable(value) for key, value in properties.items()}
    required = schema.get("required")
    if isinstance(required, list) and all(isinstance(key, str) for key in required):
        kept["required"] = required
    if schema.get("additionalProperties") is False:
        kept["additionalProperties"] = False
    if isinstance(schema.get("items"), dict):
        kept["items"] = _checkable(schema["items"])
    return kept
