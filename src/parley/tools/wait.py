"""The built-in ``wait`` tool (``Host(wait_tool=True)``, docs/time.md#waiting-for-an-event):
the model parks its turn until a named event, a time, or the first of them.  Its call is
answered with a :class:`~parley.ports.host.WaitFor`; the engine holds the turn, holding
nothing, and gives the call its result when the signal comes or the time passes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parley.errors import InvalidRequest
from parley.ports.host import MAX_WAIT_SECONDS, Access, ToolContext, WaitFor, check_event_name
from parley.schemas.messages import ToolDeclaration
from parley.tools.base import decode_arguments, validate

WAIT_TOOL_NAME = "wait"

WAIT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event": {
            "type": "string",
            "description": "The name of the event to wait for (someone sends it to this "
            "conversation as a signal; its payload is this call's result).",
        },
        "seconds": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_WAIT_SECONDS,
            "description": "How long to wait at most (with no event: how long to wait).",
        },
    },
    "additionalProperties": False,
}


class WaitTool:
    """The ``wait`` tool (see the module docstring): arguments ``{"event"?: string,
    "seconds"?: number}``, at least one of them."""

    @property
    def declaration(self) -> ToolDeclaration:
        """What the model sees."""
        return ToolDeclaration(
            name=WAIT_TOOL_NAME,
            description="Pause this task until an event arrives, a number of seconds "
            "passes, or whichever comes first. Nothing runs meanwhile; the result is the "
            "event's payload, or says that the time ran out.",
            parameters=WAIT_PARAMETERS,
        )

    def parse(self, arguments: str) -> dict[str, Any]:
        """The checked arguments: a known event name, a positive finite number of
        seconds, at least one of the two."""
        value = decode_arguments(arguments, WAIT_TOOL_NAME)
        validate(value, WAIT_PARAMETERS, WAIT_TOOL_NAME)
        if not value:
            raise InvalidRequest("wait: give an event, a number of seconds, or both")
        check_event_name(value.get("event"), "wait: event", optional=True)
        return dict(value)

    def accesses(self, arguments: dict[str, Any]) -> Sequence[Access]:
        """None: waiting touches nothing."""
        return ()

    def run(self, arguments: dict[str, Any], context: ToolContext) -> WaitFor:
        """Park the turn (the engine holds it)."""
        seconds = arguments.get("seconds")
        return WaitFor(arguments.get("event"), timeout=None if seconds is None else float(seconds))
