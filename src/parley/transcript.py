"""Typed durable rows of a conversation and their projections (docs/transcript.md):
``rows``, ``native``, ``to_messages`` (checked), ``display``, and the rows' JSON form.
``Session.transcript()`` returns the history path's rows, and ``CommitReceipt.delta``
the rows a committed turn appended.  The conversion contract a host codec keeps is in
``docs/transcript.md``.  (The rows live in ``parley.engine.transcript``, where the engine
builds a receipt's delta; this is their public name.)"""

from parley.engine.transcript import (
    AssistantRow,
    DisplayLine,
    InputRow,
    PartialRow,
    PromptRow,
    Row,
    ToolResultRow,
    display,
    from_json,
    native,
    rows,
    to_json,
    to_messages,
)
from parley.schemas.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    ToolResult,
    UserMessage,
)

__all__ = [
    "AssistantMessage",
    "AssistantRow",
    "DisplayLine",
    "InputRow",
    "Message",
    "PartialRow",
    "PromptRow",
    "Row",
    "ToolCall",
    "ToolMessage",
    "ToolResult",
    "ToolResultRow",
    "UserMessage",
    "display",
    "from_json",
    "native",
    "rows",
    "to_json",
    "to_messages",
]
