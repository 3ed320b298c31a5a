"""The Batch object and a batch's output and error lines (src/parley/openai_api/
batch_objects.py, chat_objects.py), read with the official ``openai`` client's own
models: a chat-completions line's body is a ``ChatCompletion`` (the reply, ``stop``, or
no content and ``length`` for a budget, the turn's usage, no tool calls: they were
parley's own); a failed one is a 500 with OpenAI's error; a cancelled line of either
endpoint has no response and says why (``batch_cancelled``, or ``cancelled`` when its
turn was interrupted on its own); the Batch object names the model that ran the lines
and what the ended ones spent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from openai.types import Batch as OpenAIBatch
from openai.types.chat import ChatCompletion

from parley.openai_api.batch_objects import batch_object, result_line
from parley.ports.backend import CommittedStep
from parley.schemas.batches import (
    BatchCounts,
    BatchHeader,
    BatchLine,
    BatchRecord,
    BatchStatus,
    Endpoint,
)
from parley.schemas.messages import StepPayload, ToolCall, ToolResult
from parley.schemas.records import RunState, TurnRecord, TurnStatus, Usage
from parley.store.batches import RenderedTurn

CREATED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CALL = ToolCall(id="call_1", name="read_file", arguments='{"path": "a"}')
STEPS = (
    CommittedStep(
        index=0,
        payload=StepPayload(
            tool_calls=(CALL,),
            tool_results=(ToolResult(call_id="call_1", name="read_file", content="A"),),
            model="openai:gpt-4o-mini",
        ),
    ),
    CommittedStep(index=1, payload=StepPayload(text="It says A.", model="openai:gpt-4o-mini")),
)


def rendered(
    status: TurnStatus,
    *,
    reply: str | None = None,
    steps: tuple[CommittedStep, ...] = STEPS,
    attempts: int = 1,
    error: str | None = None,
    ended_at: datetime | None = CREATED + timedelta(seconds=5),
) -> RenderedTurn:
    turn = TurnRecord(
        turn_id="7d0c5b5e-0000-4000-8000-000000000001",
        session_id="s-1",
        parent_id=None,
        prompt="what does a say?",
        status=status,
        reply=reply,
        run_id="r-1",
        request_id="line-1",
        created_at=CREATED,
    )
    run = RunState(
        run_id="r-1",
        turn_id=turn.turn_id,
        session_id="s-1",
        status=status,
        attempts=attempts,
        steps=len(steps),
        usage=Usage(input_tokens=120, output_tokens=30, cached_tokens=20),
        steer_cursor=0,
        contract=None,
        reply=reply,
        partial=None,
        error=error,
        ended_at=ended_at,
    )
    return RenderedTurn(turn=turn, run=run, steps=steps, approvals=())


LINE = BatchLine(
    line=1,
    custom_id="line-1",
    turn_id="7d0c5b5e-0000-4000-8000-000000000001",
    session_id="s-1",
    status=TurnStatus.FINISHED,
    error=None,
    ended_at=None,
)


def header(endpoint: Endpoint, cancelled: datetime | None = None) -> BatchHeader:
    return BatchHeader(batch_id="batch_1", endpoint=endpoint, cancelling_at=cancelled)


def test_a_chat_lines_output_is_a_chat_completion_the_client_parses() -> None:
    turn = rendered(TurnStatus.FINISHED, reply="It says A.")
    row = result_line(header(Endpoint.CHAT_COMPLETIONS), LINE, turn)

    assert row["error"] is None and row["custom_id"] == "line-1"
    response = row["response"]
    assert response["status_code"] == 200 and response["request_id"] == turn.turn.turn_id
    completion = ChatCompletion.model_validate(response["body"])
    assert completion.object == "chat.completion" and completion.id == turn.turn.turn_id
    assert completion.created == int(CREATED.timestamp())
    assert completion.model == "openai:gpt-4o-mini"
    [choice] = completion.choices
    assert (choice.index, choice.finish_reason) == (0, "stop")
    assert choice.message.role == "assistant" and choice.message.content == "It says A."
    # The turn's tool round was parley's own (it ran it): not a call for the client.
    assert choice.message.tool_calls is None
    assert "tool_calls" not in response["body"]["choices"][0]["message"]
    usage = completion.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (120, 30, 150)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 20


@pytest.mark.parametrize("status", [TurnStatus.BUDGET_EXCEEDED, TurnStatus.CHECK_FAILED])
def test_a_chat_line_a_budget_stopped_has_no_content_and_ends_length(status: TurnStatus) -> None:
    row = result_line(header(Endpoint.CHAT_COMPLETIONS), LINE, rendered(status))
    completion = ChatCompletion.model_validate(row["response"]["body"])
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content is None
    assert row["error"] is None and row["response"]["status_code"] == 200


def test_a_failed_chat_line_is_a_500_with_openais_error() -> None:
    turn = rendered(TurnStatus.FAILED, error="ProviderError: overloaded")
    row = result_line(header(Endpoint.CHAT_COMPLETIONS), LINE, turn)
    assert row["response"]["status_code"] == 500
    assert row["response"]["body"] == {
        "error": {
            "message": "ProviderError: overloaded",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert row["error"] == {"code": "failed", "message": "ProviderError: overloaded"}


def test_a_failed_responses_line_keeps_the_response_post_v1_responses_answers() -> None:
    turn = rendered(TurnStatus.FAILED, error="ProviderError: overloaded")
    row = result_line(header(Endpoint.RESPONSES), LINE, turn)
    assert row["response"]["status_code"] == 200
    assert row["response"]["body"]["status"] == "failed"
    assert row["error"]["code"] == "failed"


@pytest.mark.parametrize("endpoint", list(Endpoint))
@pytest.mark.parametrize(
    ("steps", "attempts", "after_cancel", "code", "words"),
    [
        ((), 0, True, "batch_cancelled", "the batch was cancelled before this line committed"),
        (STEPS, 1, True, "batch_cancelled", "while this line ran: it stopped after 2 committed"),
        (STEPS, 1, False, "cancelled", "was interrupted while this line ran"),
        ((), 1, None, "cancelled", "was interrupted before this line committed"),
    ],
)
def test_a_cancelled_line_has_no_response_and_says_why(
    endpoint: Endpoint,
    steps: tuple[CommittedStep, ...],
    attempts: int,
    after_cancel: bool | None,
    code: str,
    words: str,
) -> None:
    ended = CREATED + timedelta(seconds=5)
    cancel = {True: ended, False: ended + timedelta(seconds=1), None: None}[after_cancel]
    turn = rendered(TurnStatus.CANCELLED, steps=steps, attempts=attempts, ended_at=ended)
    row = result_line(header(endpoint, cancel), LINE, turn)

    # As OpenAI's lines the batch's cancel stopped: no response (no status_code 200).
    assert row["response"] is None
    assert row["error"]["code"] == code and words in row["error"]["message"]
    assert row["id"] == f"batch_req_{turn.turn.turn_id}" and row["custom_id"] == "line-1"
    if steps:
        assert turn.turn.turn_id in row["error"]["message"]  # where what it did is read


def test_the_batch_object_names_the_model_that_ran_the_lines_and_what_they_spent() -> None:
    record = BatchRecord(
        batch_id="batch_1",
        tenant="acme",
        input_file_id="file-1",
        output_file_id="file-2",
        error_file_id="file-3",
        endpoint=Endpoint.CHAT_COMPLETIONS,
        completion_window="24h",
        metadata=None,
        request_id=None,
        status=BatchStatus.IN_PROGRESS,
        errors=None,
        created_at=CREATED,
        cancelling_at=None,
        ended_at=None,
        counts=BatchCounts(total=3, completed=2, running=1),
        usage=Usage(input_tokens=500, output_tokens=40, cached_tokens=100),
        model="openai:gpt-4o-mini",
    )
    wire: dict[str, Any] = batch_object(record)
    batch = OpenAIBatch.model_validate(wire)

    assert batch.endpoint == "/v1/chat/completions" and batch.model == "openai:gpt-4o-mini"
    assert batch.usage is not None
    assert (batch.usage.input_tokens, batch.usage.output_tokens) == (500, 40)
    assert batch.usage.total_tokens == 540
    assert batch.usage.input_tokens_details.cached_tokens == 100
    assert batch.usage.output_tokens_details.reasoning_tokens == 0
    unrun = batch_object(BatchRecord(**{**record.__dict__, "model": None, "usage": Usage()}))
    assert unrun["model"] is None and unrun["usage"]["total_tokens"] == 0
