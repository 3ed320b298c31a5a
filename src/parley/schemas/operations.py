"""Records of running a deployment (docs/operations.md): what pruning removed, and the state of each
webhook delivery in the outbox."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class DeliveryState(StrEnum):
    """Where a webhook delivery stands: ``pending`` (not delivered yet, retried while
    attempts remain), ``delivered`` (a receiver answered 2xx) or ``given_up`` (every
    attempt failed)."""

    PENDING = "pending"
    DELIVERED = "delivered"
    GIVEN_UP = "given_up"


@dataclass(frozen=True, kw_only=True)
class WebhookDelivery:
    """One row of the webhook outbox: a turn's end as it is posted to ``url``, and how
    its delivery went.  ``delivery_id`` is the idempotency key a receiver sees."""

    delivery_id: str
    session_id: str
    turn_id: str
    run_id: str
    url: str
    outcome: str
    reply: str | None
    error: str | None
    steps: int
    input_tokens: int
    output_tokens: int
    ended_at: datetime
    created_at: datetime
    attempts: int
    next_attempt_at: datetime
    last_attempt_at: datetime | None
    last_status: int | None
    """The HTTP status of the latest attempt (None: no answer, or none made yet)."""
    last_error: str | None
    delivered_at: datetime | None
    given_up_at: datetime | None
    kind: str | None = None
    """``a2a`` for an A2A push notification (docs/protocols.md#5-a2a); None for the
    session's (or host's) own webhook."""
    token: str | None = None
    """An A2A push's token, sent back to its receiver (``X-A2A-Notification-Token``)."""

    @property
    def state(self) -> DeliveryState:
        """Pending, delivered or given up."""
        if self.delivered_at is not None:
            return DeliveryState.DELIVERED
        if self.given_up_at is not None:
            return DeliveryState.GIVEN_UP
        return DeliveryState.PENDING

    def payload(self) -> dict[str, Any]:
        """The JSON object posted (docs/operations.md#webhooks); for an A2A push, the
        ended task as A2A's ``StreamResponse`` (docs/protocols.md#5-a2a)."""
        if self.kind == "a2a":
            return self._a2a_task()
        return {
            "delivery_id": self.delivery_id,
            "event": "turn.ended",
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "run_id": self.run_id,
            "outcome": self.outcome,
            "reply": self.reply,
            "error": self.error,
            "steps": self.steps,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
            "ended_at": self.ended_at.isoformat(),
        }

    def _a2a_task(self) -> dict[str, Any]:
        state = A2A_STATES.get(self.outcome, "TASK_STATE_FAILED")
        task: dict[str, Any] = {
            "id": self.turn_id,
            "contextId": self.session_id,
            "status": {"state": state, "timestamp": self.ended_at.isoformat()},
            "metadata": {"parley": {"deliveryId": self.delivery_id, "outcome": self.outcome}},
        }
        if self.reply:
            parts = [{"text": self.reply}]
            task["artifacts"] = [{"artifactId": "reply", "name": "reply", "parts": parts}]
        if state != "TASK_STATE_COMPLETED":
            text = f"{self.outcome}: {self.error}" if self.error else self.outcome
            task["status"]["message"] = {
                "messageId": f"{self.turn_id}:status",
                "contextId": self.session_id,
                "taskId": self.turn_id,
                "role": "ROLE_AGENT",
                "parts": [{"text": text}],
            }
        return {"task": task}


A2A_STATES = {
    "succeeded": "TASK_STATE_COMPLETED",
    "finished": "TASK_STATE_COMPLETED",
    "cancelled": "TASK_STATE_CANCELED",
}
"""An ended turn's outcome as an A2A task state (any other: failed)."""


@dataclass(frozen=True, kw_only=True)
class PrunedSession:
    """An ended session whose rows pruning deleted (in one transaction)."""

    session_id: str
    root: str
    turns: int
    last_active_at: datetime
    """Its newest activity: the newest end of its turns, else its creation."""
    workspace: str | None = None
    """What became of its workspace when pruning was asked to remove it: ``removed``,
    or why it was kept; None when it was not asked (or in a dry run)."""


@dataclass(frozen=True, kw_only=True)
class PruneReport:
    """What one prune did."""

    pruned: tuple[PrunedSession, ...]
    """The sessions deleted (or, in a dry run, those that would be)."""
    became_active: int = 0
    """Sessions that qualified but had a turn submitted (or ended) as they were about to
    be deleted: kept, whole."""
    awaiting_webhooks: int = 0
    """Ended sessions past their time kept because a webhook of theirs is not delivered
    yet (they are pruned once it is delivered or given up)."""
    batches: tuple[str, ...] = ()
    """The batches that ended before the cut, deleted with their files (their sessions
    are among ``pruned``, as any ended session); in a dry run, those that would be."""
    uploads: tuple[str, ...] = ()
    """The uploads made before the cut that no batch was made from, deleted (in a dry
    run, those that would be)."""
    dry_run: bool = False
