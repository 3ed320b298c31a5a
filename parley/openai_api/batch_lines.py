"""A batch's input lines, as OpenAI's Batch API has them over Responses:
``{"custom_id", "method": "POST", "url": "/v1/responses", "body": <a Responses
request>}``, one JSON object per line.  Each line is read on its own: a malformed one is
refused alone (it goes to the batch's error file, with why), never the batch.

What a line's body may say is what ``POST /v1/responses`` takes
(:mod:`parley.openai_api.response_requests`), less what makes no sense in a batch
(``stream``, and answers to approval requests, which go to their own response).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from parley.errors import InvalidRequest
from parley.openai_api.errors import OpenAIError
from parley.openai_api.response_requests import (
    ResponseCreate,
    answers_of,
    check_supported,
    conversation_id,
    prompt_of,
)
from parley.validation import MAX_REQUEST_ID, check_metadata
from schemas.batches import LineRefusal
from schemas.records import TaskContract
from workers.store.ids import storable

ENDPOINT = "/v1/responses"
"""The one endpoint a batch's lines may name (parley's turns are Responses)."""
MAX_LINES = 100_000
"""The most lines a batch may have."""
LINE_KEYS = frozenset({"custom_id", "method", "url", "body"})


@dataclass(frozen=True, kw_only=True)
class ParsedLine:
    """A line that reads as a Responses request: where it goes is resolved later (its
    ``previous_response_id`` or ``conversation``, if any, must be the tenant's)."""

    line: int
    custom_id: str
    prompt: str
    contract: TaskContract | None
    previous_response_id: str | None
    conversation: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


def jsonl_lines(data: bytes) -> Iterator[tuple[int, Any]]:
    """The lines of a JSONL file's bytes with their numbers (from 1), each decoded, or
    the :class:`LineRefusal` that says why it cannot be; blank lines are skipped."""
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            yield number, json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            yield (
                number,
                LineRefusal(
                    line=number, custom_id=None, code="invalid_json", message=f"not JSON: {exc}"
                ),
            )


def parse_lines(lines: Iterable[tuple[int, Any]]) -> tuple[list[ParsedLine], list[LineRefusal]]:
    """Read every line (``(number, decoded JSON or a refusal)``): those that are
    Responses requests, and the refusals of those that are not, or whose ``custom_id``
    an earlier line has.  :class:`InvalidRequest` if there are none, or too many."""
    parsed: list[ParsedLine] = []
    refused: list[LineRefusal] = []
    seen: set[str] = set()
    count = 0
    for number, value in lines:
        count += 1
        if count > MAX_LINES:
            raise InvalidRequest(f"a batch has at most {MAX_LINES} lines")
        line = value if isinstance(value, LineRefusal) else _parse(number, value)
        if isinstance(line, ParsedLine) and line.custom_id in seen:
            line = LineRefusal(
                line=number,
                custom_id=line.custom_id,
                code="duplicate_custom_id",
                message=f"custom_id {line.custom_id!r} is an earlier line's: each line's is "
                "unique in its file",
                param="custom_id",
            )
        if isinstance(line, ParsedLine):
            seen.add(line.custom_id)
            parsed.append(line)
        else:
            refused.append(line)
    if count == 0:
        raise InvalidRequest("the batch has no lines")
    return parsed, refused


def _parse(number: int, value: Any) -> ParsedLine | LineRefusal:
    custom_id = value.get("custom_id") if isinstance(value, dict) else None
    custom = custom_id if isinstance(custom_id, str) else None
    try:
        return _read_line(number, value)
    except OpenAIError as exc:
        detail = exc.body.error
        return LineRefusal(
            line=number,
            custom_id=custom,
            code=detail.code or "invalid_request",
            message=detail.message,
            param=detail.param,
        )


def _read_line(number: int, value: Any) -> ParsedLine:
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
    if value.get("url") != ENDPOINT:
        raise OpenAIError(
            400, f"url must be {ENDPOINT} (the batch's endpoint)", param="url", code="invalid_url"
        )
    try:
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
