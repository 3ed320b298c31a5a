"""OpenAI's ``chat.completion`` object of a turn, as a chat-completions batch line's
output has it (docs/batches.md#over-http-with-the-openai-client): a pure function of
what parley stored.

The completion is the turn's answer: one choice whose message is the reply, ended
``stop``, or ``length`` when a budget stopped the turn (then there is no reply: its
``content`` is null).  Its ``id`` is the turn id, as a response's is.  Its message has
no ``tool_calls``: in chat completions those are calls the client is to run, and a
turn's calls are parley's own, which it ran itself (the caller has nothing to do; the
Responses form of the same turn, ``GET /v1/responses/{id}``, shows each round).  Its
``usage`` is the whole turn's, every model call of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parley.openai_api.response_objects import model_used, unix_seconds
from parley.ports.backend import CommittedStep
from parley.schemas.records import RunState, TurnRecord, TurnStatus, Usage

FINISH_REASON: dict[TurnStatus, str] = {
    TurnStatus.FINISHED: "stop",
    TurnStatus.SUCCEEDED: "stop",
    # A budget ran out (its steps, its tokens, or its steps before its check passed).
    TurnStatus.BUDGET_EXCEEDED: "length",
    TurnStatus.CHECK_FAILED: "length",
}
"""Why an answered turn's completion ended, in OpenAI's words."""


def chat_completion(
    turn: TurnRecord, run: RunState, steps: Sequence[CommittedStep]
) -> dict[str, Any]:
    """The ``ChatCompletion`` of an answered turn (one of :data:`FINISH_REASON`'s)."""
    return {
        "id": turn.turn_id,
        "object": "chat.completion",
        "created": unix_seconds(turn.created_at),
        "model": model_used(steps),
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": turn.reply if run.status.has_reply else None,
                    "refusal": None,
                    "annotations": [],
                },
                "finish_reason": FINISH_REASON[run.status],
                "logprobs": None,
            }
        ],
        "usage": completion_usage(run.usage),
        "service_tier": "default",
        "system_fingerprint": None,
    }


def completion_usage(usage: Usage) -> dict[str, Any]:
    """A ``CompletionUsage``."""
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def chat_failure(run: RunState) -> dict[str, Any]:
    """The body a chat completions endpoint answers a request it failed with (status
    500): OpenAI's error form, saying why the turn failed."""
    return {
        "error": {
            "message": run.error or "the turn failed",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
