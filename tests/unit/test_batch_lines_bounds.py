"""A batch's input read within bounds (src/parley/openai_api/jsonl.py): a line the store
could not keep, or Python could not decode, is refused alone and says why; a JSONL file
reads the same whatever parts its bytes come in, one line held at a time; and what a
refusal quotes of its line is cut short."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parley.openai_api import jsonl
from parley.openai_api.batch_lines import ParsedLine, read_lines
from parley.openai_api.jsonl import (
    MAX_MESSAGE_CHARS,
    MAX_PARAM_CHARS,
    given_lines,
    jsonl_stream,
)
from parley.schemas.batches import LineRefusal
from parley.validation import MAX_JSON_DEPTH
from tests.support.abusive_lines import ABUSIVE, nested, raw

GOOD = {"custom_id": "ok", "method": "POST", "url": "/v1/responses", "body": {"input": "hi"}}


@pytest.mark.parametrize("name", sorted(ABUSIVE))
def test_a_line_the_store_cannot_keep_is_refused_alone_saying_why(name: str) -> None:
    line, code = ABUSIVE[name]
    data = b"\n".join(
        [json.dumps(GOOD).encode(), line, json.dumps({**GOOD, "custom_id": "b"}).encode()]
    )
    read = list(read_lines(jsonl_stream([data])))
    assert [type(r) for r in read] == [ParsedLine, LineRefusal, ParsedLine], read
    refusal = read[1]
    assert isinstance(refusal, LineRefusal) and (refusal.line, refusal.code) == (2, code), refusal
    # What the store keeps of a refusal is storable text, and its custom_id one too.
    assert refusal.custom_id in (None, "c")
    json.dumps(refusal.to_json()).encode("utf-8")
    assert "\x00" not in json.dumps(refusal.to_json(), ensure_ascii=False)


def test_brackets_in_strings_are_not_nesting_and_a_bounded_nest_is_kept() -> None:
    brackets = "[" * 500 + "{" * 500
    deep_enough = {"k": json.loads(nested(MAX_JSON_DEPTH - 3))}
    lines = [
        json.dumps({**GOOD, "body": {"input": brackets}}).encode(),
        json.dumps(
            {**GOOD, "custom_id": "b", "body": {"input": "hi", "metadata": deep_enough}}
        ).encode(),
    ]
    read = list(read_lines(jsonl_stream([b"\n".join(lines)])))
    assert all(isinstance(r, ParsedLine) for r in read), read
    assert isinstance(read[0], ParsedLine) and read[0].prompt == brackets


@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_a_file_reads_the_same_whatever_parts_its_bytes_come_in(cuts: list[int]) -> None:
    data = b"\n".join(
        [
            json.dumps(GOOD).encode(),
            b"",
            b"{not json",
            raw('{"input": "a\\u0000"}'),
            json.dumps(
                {**GOOD, "custom_id": "\u00e9t\u00e9", "body": {"input": "\u2603"}}
            ).encode(),
            b"  ",
            json.dumps({**GOOD, "custom_id": "last"}).encode(),  # no newline after it
        ]
    )
    whole = list(jsonl_stream([data]))
    points = sorted({min(cut, len(data)) for cut in cuts})
    parts = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert list(jsonl_stream(parts)) == whole
    assert [n for n, _ in whole] == [1, 3, 4, 5, 7]


def test_a_line_over_the_limit_is_refused_without_being_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 1000)
    long = json.dumps({**GOOD, "body": {"input": "x" * 5000}}).encode()
    parts = [json.dumps(GOOD).encode() + b"\n" + long[:700], long[700:3000], long[3000:] + b"\n"]
    parts.append(json.dumps({**GOOD, "custom_id": "after"}).encode())
    read = list(jsonl_stream(parts))
    assert [n for n, _ in read] == [1, 2, 3]
    refusal = read[1][1]
    assert isinstance(refusal, LineRefusal) and refusal.code == "invalid_line"
    assert "1000 bytes" in refusal.message
    assert read[2][1]["custom_id"] == "after"


class Unjson:
    """Not a JSON value."""


def looped() -> dict[str, Any]:
    loop: dict[str, Any] = {"input": "hi"}
    loop["metadata"] = {"self": loop}
    return loop


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "metadata": {"k": {1, 2}}}, "body.metadata.k"),
        ({"input": "hi", "metadata": {"k": Unjson()}}, "body.metadata.k"),
        ({"input": "hi", "metadata": {7: "v"}}, "body.metadata"),
        ({"input": "hi", "metadata": {"k": 10**4400}}, "body.metadata.k"),
        ({"input": "hi", "temperature": float("nan")}, "body.temperature"),
        ({"input": ["hi", "a\x00"]}, "body.input[1]"),
        ({"input": "hi", "metadata": {"k": "\udcff"}}, "body.metadata.k"),
        (looped(), None),
    ],
)
def test_a_line_given_from_python_is_checked_as_a_file_is(
    body: dict[str, Any], param: str | None
) -> None:
    lines = [GOOD, {**GOOD, "custom_id": "bad", "body": body}, {**GOOD, "custom_id": "b"}]
    read = list(read_lines(given_lines(lines)))
    assert [type(r) for r in read] == [ParsedLine, LineRefusal, ParsedLine], read
    refusal = read[1]
    assert isinstance(refusal, LineRefusal)
    assert (refusal.custom_id, refusal.code) == ("bad", "invalid_line")
    if param is not None:
        assert refusal.param == param
    else:
        assert refusal.param is not None and refusal.param.startswith("body.metadata.self")


def test_a_refusal_quotes_little_of_its_line() -> None:
    key = "k" * 1_000_000
    lines = [
        {**GOOD, key: 1},
        {**GOOD, "custom_id": "x" * 5000},
        {**GOOD, "custom_id": "c", "body": {"input": "hi", key: 1}},
        {
            **GOOD,
            "custom_id": "d",
            "body": {"input": [{"role": "user", "content": [{"type": key}]}]},
        },
    ]
    read = list(read_lines(given_lines(lines)))
    assert all(isinstance(r, LineRefusal) for r in read), read
    for refusal in read:
        assert isinstance(refusal, LineRefusal)
        assert len(refusal.message) <= MAX_MESSAGE_CHARS
        assert refusal.param is None or len(refusal.param) <= MAX_PARAM_CHARS
    assert [r.custom_id for r in read if isinstance(r, LineRefusal)] == ["ok", None, "c", "d"]
