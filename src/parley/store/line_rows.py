"""The rows a batch's lines are accepted as (docs/batches.md): for a line that opens a
session, its session, turn, run and ``queued`` event, every column given (``COPY``
applies no Python defaults), and the conversation the session starts with, if any; the
binds of a line that continues a session; the line's own row, or its refusal's."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from parley.schemas.batches import LinePlan, LineRefusal
from parley.schemas.events import Event, Queued
from parley.schemas.records import TurnStatus
from parley.store import statements as q
from parley.store.rows import event_row
from parley.store.seeding import SeededRows, seed_row, seeded_rows
from parley.store.session_titles import title_of_prompt


def history_rows(plan: LinePlan, now: datetime) -> SeededRows | None:
    """The turns the session a line opens starts with (None: it starts empty)."""
    if plan.history is None:
        return None
    return seeded_rows(plan.session_id, plan.history.turns, now)


def history_seed_row(plan: LinePlan, now: datetime) -> dict[str, Any]:
    """The row that keeps a line's imported messages as given (``Session.seeded``)."""
    assert plan.history is not None
    return seed_row(plan.session_id, plan.history.messages, None, now)


def opened_session_row(
    plan: LinePlan,
    tenant: str | None,
    batch_id: str,
    now: datetime,
    history: SeededRows | None = None,
) -> dict[str, Any]:
    """The session a line of the batch ``batch_id`` opens (its head the last turn of
    ``history``, if any, which its line's turn is counted after)."""
    seeded = len(history.records) if history is not None else 0
    return {
        "id": plan.session_id,
        "root": plan.root,
        "metadata": plan.metadata,
        "head_turn_id": history.head if history is not None else None,
        "fence": 0,
        "turn_count": seeded + 1,
        "tokens_used": 0,
        "token_ceiling": None,
        "prefix_generation": 0,
        "created_at": now,
        "tenant": tenant,
        "retention_seconds": None,
        "webhook_url": None,
        "last_active_at": now,
        "title": title_of_prompt(plan.prompt),
        "batch_id": batch_id,
    }


def turn_row(plan: LinePlan, turn_id: str, ordinal: int, now: datetime) -> dict[str, Any]:
    """A line's turn."""
    return {
        "id": turn_id,
        "session_id": plan.session_id,
        "parent_id": None,
        "ordinal": ordinal,
        "prompt": plan.prompt,
        "request_id": plan.custom_id,
        "created_at": now,
    }


def run_row(
    plan: LinePlan, tenant: str | None, turn_id: str, run_id: str, position: int, now: datetime
) -> dict[str, Any]:
    """A line's queued run, every column given (``COPY`` applies no Python defaults):
    waiting for its place in the batch window, under its session's ``tenant``."""
    return {
        "id": run_id,
        "turn_id": turn_id,
        "session_id": plan.session_id,
        "status": TurnStatus.QUEUED.value,
        "attempts": 0,
        "stalled_attempts": 0,
        "contract": plan.contract.to_json() if plan.contract else None,
        "host_context": None,
        "steps": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_tokens": 0,
        "steer_count": 0,
        "steer_cursor": 0,
        "inbox_open": True,
        "last_seq": 1,
        "queued_at": now,
        "queue_position": position,
        "approval_count": 0,
        "priority": "batch",
        "not_before": None,
        "waiting_since": now,
        "waiting_for": q.WAITING_IN_LINE,
        "tenant": tenant or "",
        "placed_at": None,
    }


def run_binds(
    plan: LinePlan, turn_id: str, run_id: str, position: int, now: datetime
) -> dict[str, Any]:
    """INSERT_RUN's binds for a line that continues its session."""
    return {
        "b_run_id": run_id,
        "b_turn_id": turn_id,
        "b_session_id": plan.session_id,
        "b_contract": plan.contract.to_json() if plan.contract else None,
        "b_host_context": None,
        "b_trace_context": None,
        "b_now": now,
        "b_position": position,
        "b_priority": "batch",
        "b_not_before": None,
    }


def turn_binds(row: dict[str, Any]) -> dict[str, Any]:
    """INSERT_TURN's binds of a turn row."""
    return {
        "b_turn_id": row["id"],
        "b_session_id": row["session_id"],
        "b_position": row["ordinal"],
        "b_prompt": row["prompt"],
        "b_request_id": row["request_id"],
        "b_now": row["created_at"],
    }


def queued_row(turn_id: str, run_id: str, now: datetime) -> dict[str, Any]:
    """A line's ``queued`` event."""
    queued = Event.of(turn_id, 1, Queued(run_id=run_id))
    return {**event_row(queued), "created_at": now}


def line_row(plan: LinePlan, turn_id: str) -> dict[str, Any]:
    """A line that became a turn."""
    return {
        "line": plan.line,
        "custom_id": plan.custom_id,
        "turn_id": turn_id,
        "session_id": plan.session_id,
        "opened_session": plan.opens_session,
        "error": None,
    }


def refused_row(refusal: LineRefusal) -> dict[str, Any]:
    """A line refused alone (in the error file)."""
    return {
        "line": refusal.line,
        "custom_id": refusal.custom_id,
        "turn_id": None,
        "session_id": None,
        "opened_session": False,
        "error": refusal.to_json(),
    }
