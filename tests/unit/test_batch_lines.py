"""A batch's input lines (src/parley/openai_api/batch_lines.py): each is read on its own, a
malformed one refused alone with OpenAI's error and the line's number, the rest kept;
an input of no lines, or of too many, is refused whole."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest

from parley.errors import InvalidRequest
from parley.openai_api import batch_lines
from parley.openai_api.batch_lines import ParsedLine, read_lines
from parley.openai_api.jsonl import jsonl_stream
from parley.schemas.batches import LineRefusal

GOOD = {"custom_id": "a", "method": "POST", "url": "/v1/responses", "body": {"input": "hi"}}


def parse_lines(lines: Iterable[tuple[int, Any]]) -> tuple[list[ParsedLine], list[LineRefusal]]:
    """The lines read, split into the accepted and the refused."""
    read = list(read_lines(lines))
    parsed = [line for line in read if isinstance(line, ParsedLine)]
    return parsed, [line for line in read if isinstance(line, LineRefusal)]


def refusal_of(value: Any) -> tuple[str, str | None]:
    parsed, refused = parse_lines([(1, value)])
    assert parsed == [] and len(refused) == 1
    return refused[0].code, refused[0].param


def test_a_good_line_is_its_prompt_its_budget_and_where_it_goes() -> None:
    body = {
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
        "max_output_tokens": 500,
        "conversation": {"id": "c-1"},
        "metadata": {"ticket": "42"},
        "instructions": "ignored",
    }
    [line], refused = parse_lines([(3, {**GOOD, "body": body})])
    assert refused == []
    assert line == ParsedLine(
        line=3,
        custom_id="a",
        prompt="hello",
        contract=line.contract,
        previous_response_id=None,
        conversation="c-1",
        metadata={"ticket": "42"},
    )
    assert line.contract is not None and line.contract.max_tokens == 500


@pytest.mark.parametrize(
    ("value", "code", "param"),
    [
        ("a string", "invalid_line", None),
        ({**GOOD, "extra": 1}, "invalid_line", "extra"),
        ({**GOOD, "custom_id": ""}, "invalid_custom_id", "custom_id"),
        ({**GOOD, "custom_id": 7}, "invalid_custom_id", "custom_id"),
        ({**GOOD, "custom_id": "x" * 201}, "invalid_custom_id", "custom_id"),
        ({**GOOD, "custom_id": "nul\x00"}, "invalid_custom_id", "custom_id"),
        ({**GOOD, "method": "GET"}, "invalid_method", "method"),
        ({**GOOD, "url": "/v1/chat/completions"}, "invalid_url", "url"),
        ({**GOOD, "body": "hi"}, "invalid_request", "body"),
        ({**GOOD, "body": {"input": "hi", "nope": 1}}, "invalid_body", "body.nope"),
        ({**GOOD, "body": {"input": "hi", "stream": "true"}}, "invalid_body", "body.stream"),
        ({**GOOD, "body": {"input": "hi", "stream": True}}, "invalid_request", "body.stream"),
        (
            {**GOOD, "body": {"input": "hi", "tools": [{"type": "function"}]}},
            "invalid_request",
            "body.tools",
        ),
        ({**GOOD, "body": {"input": "  "}}, "invalid_body", "body.input"),
        (
            {**GOOD, "body": {"input": [{"role": "system", "content": "x"}]}},
            "invalid_request",
            "body.input",
        ),
        (
            {**GOOD, "body": {"input": "hi", "metadata": {"k": float("inf")}}},
            "invalid_request",
            "body.metadata",
        ),
        (
            {**GOOD, "body": {"input": "hi", "previous_response_id": "r", "conversation": "c"}},
            "invalid_request",
            "body.previous_response_id",
        ),
    ],
)
def test_a_malformed_line_is_refused_alone_saying_why(
    value: Any, code: str, param: str | None
) -> None:
    assert refusal_of(value) == (code, param)
    parsed, refused = parse_lines([(1, GOOD), (2, value), (3, {**GOOD, "custom_id": "b"})])
    assert [p.custom_id for p in parsed] == ["a", "b"] and [r.line for r in refused] == [2]


def test_a_repeated_custom_id_refuses_the_later_line() -> None:
    parsed, refused = parse_lines([(1, GOOD), (2, GOOD)])
    assert [p.line for p in parsed] == [1]
    assert [(r.line, r.custom_id, r.code) for r in refused] == [(2, "a", "duplicate_custom_id")]


def test_jsonl_numbers_the_lines_skips_blank_ones_and_refuses_what_is_not_json() -> None:
    data = b"\n".join(
        [json.dumps(GOOD).encode(), b"", b"   ", b"{oops", b"\xff\xfe", json.dumps(GOOD).encode()]
    )
    lines = list(jsonl_stream([data + b"\n"]))
    assert [n for n, _ in lines] == [1, 4, 5, 6]
    assert [type(v) for _, v in lines] == [dict, LineRefusal, LineRefusal, dict]
    assert all(v.code == "invalid_json" for _, v in lines if isinstance(v, LineRefusal))


def test_an_input_of_no_lines_or_too_many_is_refused_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(InvalidRequest, match="no lines"):
        parse_lines(jsonl_stream([b"\n\n"]))
    monkeypatch.setattr(batch_lines, "MAX_LINES", 2)
    with pytest.raises(InvalidRequest, match="at most 2 lines"):
        parse_lines([(n, {**GOOD, "custom_id": str(n)}) for n in range(1, 4)])
