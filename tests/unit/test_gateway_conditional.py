"""Conditional GETs (src/parley/gateway/conditional.py) around a small Starlette app, in
process: which answers are tagged, what a 304 keeps of the 200's headers, and which
If-None-Match values name a tag."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from parley.gateway.conditional import ConditionalGet, entity_tag, none_match


async def listing(_: Request) -> Response:
    return JSONResponse({"sessions": []}, headers={"Cache-Control": "no-store"})


async def streamed(_: Request) -> Response:
    async def pieces() -> AsyncIterator[bytes]:
        yield b'{"a": '
        yield b"1}"

    return StreamingResponse(pieces(), media_type="application/json")


async def text(_: Request) -> Response:
    return PlainTextResponse("hello")


async def created(_: Request) -> Response:
    return JSONResponse({"id": "x"}, status_code=201)


def client() -> TestClient:
    app = Starlette(
        routes=[
            Route("/list", listing),
            Route("/streamed", streamed),
            Route("/text", text),
            Route("/list", created, methods=["POST"]),
        ]
    )
    app.add_middleware(ConditionalGet)
    return TestClient(app)


def test_a_json_answer_is_tagged_and_a_304_keeps_its_headers_but_the_bodys() -> None:
    http = client()
    first = http.get("/list")
    tag = first.headers["etag"]
    assert tag == entity_tag(first.content)
    again = http.get("/list", headers={"If-None-Match": tag})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == tag and again.headers["cache-control"] == "no-store"
    assert "content-type" not in again.headers
    assert http.get("/list", headers={"If-None-Match": '"other"'}).status_code == 200


def test_only_a_get_s_json_answer_in_one_piece_is_tagged() -> None:
    http = client()
    streamed = http.get("/streamed", headers={"If-None-Match": "*"})
    assert streamed.status_code == 200 and streamed.json() == {"a": 1}
    assert "etag" not in streamed.headers
    plain = http.get("/text", headers={"If-None-Match": "*"})
    assert plain.status_code == 200 and "etag" not in plain.headers
    made = http.post("/list", headers={"If-None-Match": "*"})
    assert made.status_code == 201 and "etag" not in made.headers


@pytest.mark.parametrize(
    ("header", "names"),
    [
        ('"t"', True),
        ('W/"t"', True),
        ('"a", "t"', True),
        ("  *  ", True),
        ('"a","b"', False),
        ("t", False),
        ('"t-2"', False),
        ("", False),
    ],
)
def test_if_none_match_names_a_tag_weakly_in_a_list_or_as_any(header: str, names: bool) -> None:
    assert none_match(header, '"t"') is names
