"""The gateway's checks that run before any route: a body's depth (read without parsing
it, on the event loop, before any token is checked), and which requests count as a
tenant's streams."""

from __future__ import annotations

import time

import pytest
from starlette.types import Scope

from parley.gateway.errors import MAX_BODY_DEPTH, nests_deeper_than
from parley.gateway.tenant_limits import is_stream


def test_depth_is_counted_outside_strings() -> None:
    deep = b"[" * (MAX_BODY_DEPTH + 1) + b"]" * (MAX_BODY_DEPTH + 1)
    assert nests_deeper_than(deep, MAX_BODY_DEPTH)
    assert not nests_deeper_than(deep[1:-1], MAX_BODY_DEPTH)
    quoted = b'{"text": "' + b"[" * 500 + b'\\"{{{"}'
    assert not nests_deeper_than(quoted, 1)


def test_a_body_of_escaped_quotes_is_read_in_linear_time() -> None:
    """An opening quote then escaped quotes to the end of a 1 MiB body: a string pattern
    that had to fail was tried from each quote to the end (some 40 minutes of the
    event loop, for every tenant)."""
    body = b'"' + b'\\"' * 500_000
    started = time.process_time()
    assert not nests_deeper_than(body, MAX_BODY_DEPTH)
    assert time.process_time() - started < 5  # seconds where it took tens of minutes


def scope(method: str, path: str, query: str = "") -> Scope:
    return {"type": "http", "method": method, "path": path, "query_string": query.encode()}


@pytest.mark.parametrize(
    ("method", "path", "query", "stream"),
    [
        ("GET", "/v1/turns/t/events", "", True),
        ("POST", "/v1/ag-ui", "", True),
        ("GET", "/v1/responses/r", "stream=true", True),
        ("GET", "/v1/responses/r", "", False),
        ("POST", "/v1/responses", "", True),  # (it waits for its turn unless background)
        ("GET", "/v1/turns/t/result", "wait=30", False),  # a request, bounded at 60 s
        ("GET", "/v1/turns/t", "", False),
    ],
)
def test_streams_count_as_streams(method: str, path: str, query: str, stream: bool) -> None:
    assert is_stream(scope(method, path, query)) is stream
