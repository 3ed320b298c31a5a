"""The AG-UI events and names of :class:`~parley.gateway.projections.agui.AgUiRun` that
depend on nothing but what they show: the ``CUSTOM`` events' names, a step's name, the
interrupt a call waiting for a person becomes, and the ``resume`` payload it asks for."""

from __future__ import annotations

from typing import Any

from parley.schemas.events import (
    ApprovalRequested,
    Checked,
    Compacted,
    Steered,
    Throttled,
    WaitingForEvent,
)

CUSTOM_STEER = "parley.steer"
CUSTOM_REFUSAL = "parley.refusal"
CUSTOM_CHECK = "parley.check"
CUSTOM_STEP_RESTARTED = "parley.step_restarted"
CUSTOM_APPROVAL_REQUESTED = "parley.approval_requested"
CUSTOM_APPROVAL_ANSWERED = "parley.approval_answered"
CUSTOM_THROTTLED = "parley.throttled"
CUSTOM_WAITING = "parley.waiting"
CUSTOM_COMPACTED = "parley.compacted"
CUSTOM_AGENT_STARTED = "parley.agent_started"
CUSTOM_AGENT_ENDED = "parley.agent_ended"
APPROVAL_RESPONSE_SCHEMA = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
}
"""What a ``resume`` entry's ``payload`` may say: ``approved: false`` denies a ``resolved``
entry, ``reason`` is a denial's reason."""


def step_name(index: int) -> str:
    """The ``stepName`` of parley's step ``index``."""
    return f"step {index}"


def custom_event(name: str, value: dict[str, Any]) -> dict[str, Any]:
    """A ``CUSTOM`` event named ``name`` (one of the ``CUSTOM_*`` names)."""
    return {"type": "CUSTOM", "name": name, "value": value}


def approval_interrupt(asked: ApprovalRequested, call_id: str, turn_id: str) -> dict[str, Any]:
    """The interrupt of a ``RUN_FINISHED`` for the call ``asked`` waits on (AG-UI's
    ``call_id``): its id is the approval id, and a ``resume`` entry answers it."""
    interrupt: dict[str, Any] = {
        "id": asked.approval_id,
        "reason": "tool_approval",
        "message": f"{asked.tool} waits for your approval ({asked.rule or 'asked'})",
        "toolCallId": call_id,
        "responseSchema": APPROVAL_RESPONSE_SCHEMA,
        "metadata": {
            "parley": {
                "turnId": turn_id,
                "tool": asked.tool,
                "arguments": asked.arguments,
                "accesses": [dict(a) for a in asked.accesses],
                "rule": asked.rule,
            }
        },
    }
    if asked.expires_at:
        interrupt["expiresAt"] = asked.expires_at
    return interrupt


def compacted_value(payload: Compacted) -> dict[str, Any]:
    """What a view shows of a compaction (the same keys in every protocol)."""
    return {
        "compactionId": payload.compaction_id,
        "throughTurnId": payload.through_turn_id,
        "strategy": payload.strategy,
        "text": payload.text,
        "tokensBefore": payload.tokens_before,
        "tokensAfter": payload.tokens_after,
    }


def notice_event(
    payload: Steered | Checked | Throttled | WaitingForEvent | Compacted,
) -> dict[str, Any]:
    """The ``CUSTOM`` event of a steer, a contract check, a wait for provider capacity or
    for an event (holding no worker: not hung), shown beside the messages."""
    if isinstance(payload, Steered):
        return custom_event(CUSTOM_STEER, {"position": payload.position, "text": payload.text})
    if isinstance(payload, Throttled):
        return custom_event(CUSTOM_THROTTLED, {"model": payload.model, "seconds": payload.seconds})
    if isinstance(payload, WaitingForEvent):
        value = {"callId": payload.call_id, "event": payload.event, "until": payload.until}
        return custom_event(CUSTOM_WAITING, value)
    if isinstance(payload, Compacted):
        return custom_event(CUSTOM_COMPACTED, compacted_value(payload))
    checked = {"passed": payload.passed, "exitCode": payload.exit_code, "output": payload.output}
    return custom_event(CUSTOM_CHECK, checked)
