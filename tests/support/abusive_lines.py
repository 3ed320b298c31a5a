"""Lines of a batch's input that once failed the whole batch (a 5xx from the gateway, a
traceback in the CLI): each must be refused alone (docs/batches.md#lines).  Raw bytes,
escapes kept as written, with the refusal's code each gets."""

from __future__ import annotations

import json

from parley.validation import MAX_JSON_DEPTH

GOOD = {"custom_id": "ok", "method": "POST", "url": "/v1/responses", "body": {"input": "hi"}}
HEAD = '{"custom_id": "c", "method": "POST", "url": "/v1/responses", '


def raw(body: str, *, head: str = HEAD) -> bytes:
    """A line whose body is ``body``, JSON as written (escapes kept as they are)."""
    return f'{head}"body": {body}}}'.encode()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# Each of these once failed the whole batch (a 5xx, or a traceback in the CLI).
ABUSIVE: dict[str, tuple[bytes, str]] = {
    "a custom_id over 200 characters": (
        json.dumps({**GOOD, "custom_id": "x" * 201}).encode(),
        "invalid_custom_id",
    ),
    "a NUL in the custom_id": (
        b'{"custom_id": "a\\u0000b", "method": "POST", "url": "/v1/responses", '
        b'"body": {"input": "hi"}}',
        "invalid_line",
    ),
    "a lone surrogate in the custom_id": (
        b'{"custom_id": "a\\ud800", "method": "POST", "url": "/v1/responses", '
        b'"body": {"input": "hi"}}',
        "invalid_line",
    ),
    "a NUL in a key of the line": (
        raw('{"input": "hi"}', head=HEAD + '"x\\u0000": 1, '),
        "invalid_line",
    ),
    "a lone surrogate in a key of the body": (
        raw('{"input": "hi", "x\\udc00": 1}'),
        "invalid_line",
    ),
    "a NUL in a metadata key": (
        raw('{"input": "hi", "metadata": {"k\\u0000": "v"}}'),
        "invalid_line",
    ),
    "a lone surrogate in the instructions": (
        raw('{"input": "hi", "instructions": "\\ud800"}'),
        "invalid_line",
    ),
    "a NUL in the prompt": (raw('{"input": "a\\u0000"}'), "invalid_line"),
    "JSON nested a thousand deep": (
        raw('{"input": "hi", "metadata": {"k": ' + nested(1000) + "}}"),
        "invalid_line",
    ),
    "nesting deeper than the store's bound": (
        raw('{"input": "hi", "metadata": {"k": ' + nested(MAX_JSON_DEPTH) + "}}"),
        "invalid_line",
    ),
    "an integer of 4,301 digits": (
        raw('{"input": "hi", "max_output_tokens": ' + "9" * 4301 + "}"),
        "invalid_line",
    ),
    "an integer of 101 digits": (
        raw('{"input": "hi", "top_logprobs": ' + "9" * 101 + "}"),
        "invalid_line",
    ),
    "a number out of range": (raw('{"input": "hi", "temperature": 1e999}'), "invalid_line"),
    "NaN": (raw('{"input": "hi", "temperature": NaN}'), "invalid_json"),
    "-Infinity": (raw('{"input": "hi", "temperature": -Infinity}'), "invalid_json"),
    "a surrogate encoded in UTF-8": (
        raw('{"input": "hi", "instructions": "?"}').replace(b"?", b"\xed\xa0\x80"),
        "invalid_json",
    ),
    "bytes that are not UTF-8": (b'{"custom_id": "\xff"}', "invalid_json"),
}
