"""A batch's input lines, as OpenAI's Batch API has them: ``{"custom_id", "method":
"POST", "url": <the batch's endpoint>, "body": <a request to it>}``, one JSON object per
line.  Each line is read on its own: a malformed one is refused alone (it goes to the
batch's error file, with why), never the batch.

What a line's body may say is what ``POST /v1/responses`` takes
(:mod:`parley.openai_api.response_requests`), less what makes no sense in a batch
(``stream``, and answers to approval requests, which go to their own response); or, in
a batch of chat completions, what :mod:`parley.openai_api.chat_requests` reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from parley.errors import InvalidRequest
from parley.openai_api.chat_requests import chat_turn
from parley.openai_api.errors import OpenAIError
from parley.openai_api.jsonl import line_refusal
from parley.openai_api.response_requests import (
    ResponseCreate,
    answers_of,
    check_supported,
    conversation_id,
    prompt_of,
)
from parley.schemas.batches import Endpoint, LineRefusal, SeededHistory
from parley.schemas.records import TaskContract
from parley.store.ids import storable
from parley.validation import MAX_REQUEST_ID, check_metadata

ENDPOINT = Endpoint.RESPONSES
"""The endpoint a batch's lines name unless it says otherwise."""
MAX_LINES = 100_000
"""The most lines a batch may have."""
LINE_KEYS = frozenset({"custom_id", "method", "url", "body"})


@dataclass(frozen=True, kw_only=True)
class ParsedLine:
    """A line that reads as a request: where it goes is resolved later (its
    ``previous_response_id`` or ``conversation``, if any, must be the tenant's; a chat
    completion has neither, and opens a session with its ``history``)."""

    line: int
    custom_id: str
    prompt: str
    contract: TaskContract | None
    previous_response_id: str | None
    conversation: str | None
    metadata: dict[str, Any] = field(default_factory=dict)
    history: SeededHistory | None = None


def read_lines(
    lines: Iterable[tuple[int, Any]], endpoint: Endpoint = ENDPOINT
) -> Iterator[ParsedLine | LineRefusal]:
    """Read every line (``(number, decoded JSON or a refusal)``, as
    :mod:`parley.openai_api.jsonl` gives them) as it comes: a request to ``endpoint``,
    or the refusal of one that is not, or whose ``custom_id`` an earlier line has.
    :class:`InvalidRequest` once there are too many, or at the end if there were none."""
    seen: set[str] = set()
    count = 0
    for number, value in lines:
        count += 1
        if count > MAX_LINES:
            raise InvalidRequest(f"a batch has at most {MAX_LINES} lines")
        line = value if isinstance(value, LineRefusal) else _parse(number, value, endpoint)
        if isinstance(line, ParsedLine) and line.custom_id in seen:
            line = line_refusal(
                number,
                line.custom_id,
                "duplicate_custom_id",
                f"custom_id {line.custom_id!r} is an earlier line's: each line's is "
                "unique in its file",
                "custom_id",
            )
        if isinstance(line, ParsedLine):
            seen.add(line.custom_id)
        yield line
    if count == 0:
        raise InvalidRequest("the batch has no lines")


def _parse(number: int, value: Any, endpoint: Endpoint) -> ParsedLine | LineRefusal:
    try:
        return _read_line(number, value, endpoint)
    except OpenAIError as exc:
        detail = exc.body.error
        custom_id = value.get("custom_id") if isinstance(value, dict) else None
        return line_refusal(
            number, custom_id, detail.code or "invalid_request", detail.message, detail.param
        )


def _read_line(number: int, value: Any, endpoint: Endpoint) -> ParsedLine:
    """The line ``value`` as a request, or :class:`OpenAIError` saying why not."""
    if not isinstance(value, dict):
        raise OpenAIError(400, "a line is a JSON object", code="invalid_line")
    unknown = sorted(set(value) - LINE_KEYS)
    if unknown:
        raise OpenAIError(400, f"unknown key {unknown[0]!r}", param=unknown[0], code="invalid_line")
    custom_id = value.get("custom_id")
    if (
        not isinstance(custom_id, str)
        or not custom_id
        or len(custom_id) > MAX_REQUEST_ID
        or not storable(custom_id)
    ):
        raise OpenAIError(
            400,
            f"custom_id must be a string of 1 to {MAX_REQUEST_ID} characters",
            param="custom_id",
            code="invalid_custom_id",
        )
    if value.get("method") != "POST":
        raise OpenAIError(400, "method must be POST", param="method", code="invalid_method")
    if value.get("url") != endpoint:
        raise OpenAIError(
            400, f"url must be {endpoint} (the batch's endpoint)", param="url", code="invalid_url"
        )
    try:
        if endpoint is Endpoint.CHAT_COMPLETIONS:
            return _chat_line(number, custom_id, value.get("body"))
        body = _request(value.get("body"))
        prompt = prompt_of(body.input)
        conversation = None if body.conversation is None else conversation_id(body.conversation)
    except OpenAIError as exc:
        # What the Responses route names a parameter is, in a line, the body's.
        detail = exc.body.error
        if detail.param is not None and not detail.param.startswith("body"):
            detail.param = f"body.{detail.param}"
        raise
    return ParsedLine(
        line=number,
        custom_id=custom_id,
        prompt=prompt,
        contract=(
            TaskContract(max_tokens=body.max_output_tokens)
            if body.max_output_tokens is not None
            else None
        ),
        previous_response_id=body.previous_response_id,
        conversation=conversation,
        metadata=_metadata(body.metadata),
    )


def _chat_line(number: int, custom_id: str, body: Any) -> ParsedLine:
    """A chat completion's line: a turn in a session of its own, which starts with the
    conversation before the line's prompt (chat completions are stateless)."""
    turn = chat_turn(body)
    return ParsedLine(
        line=number,
        custom_id=custom_id,
        prompt=turn.prompt,
        contract=None if turn.max_tokens is None else TaskContract(max_tokens=turn.max_tokens),
        previous_response_id=None,
        conversation=None,
        metadata=_metadata(turn.metadata),
        history=turn.history,
    )


def _request(body: Any) -> ResponseCreate:
    if not isinstance(body, dict):
        raise OpenAIError(400, "body must be a Responses request (an object)", param="body")
    try:
        request = ResponseCreate.model_validate(body)
    except ValidationError as exc:
        problem = exc.errors()[0]
        # The parameter, not the branch of its type that pydantic tried last.
        where = str((problem.get("loc") or ("body",))[0])
        raise OpenAIError(
            400,
            f"body.{where}: {problem.get('msg', 'invalid')}",
            param=f"body.{where}",
            code="invalid_body",
        ) from None
    check_supported(request)
    if request.stream:
        raise OpenAIError(400, "a batch's lines are not streamed", param="body.stream")
    if answers_of(request.input):
        raise OpenAIError(
            400,
            "answers to approval requests go to their response, not into a batch",
            param="body.input",
        )
    return request


def _metadata(metadata: dict[str, Any] | None) -> dict[str, Any]:
    if metadata is None:
        return {}
    try:
        check_metadata(metadata)
    except InvalidRequest as exc:
        raise OpenAIError(400, str(exc), param="body.metadata") from None
    return dict(metadata)
