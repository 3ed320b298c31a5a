"""Conditional GETs (docs/http.md#8-polling-with-etags): the JSON answer to a GET carries
a strong ``ETag``, the hash of its body, and the same GET sent with ``If-None-Match``
naming it is answered ``304 Not Modified``, without the body.

A client that polls a list (the web page's sidebar reads the tenant's sessions and
batches every few seconds) then gets a short answer while nothing changed.  The tag is
the body's hash, so every gateway process of a fleet gives the same one for the same
answer, and none keeps anything between requests: the route runs as always, and a 304
saves the bytes and the client's work, not the read.  (Starlette tags files only; a
JSON answer is tagged here, around every route, rather than by each.)
"""

from __future__ import annotations

import base64
import hashlib

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# What a 304 leaves out of the 200's headers: it has no body (RFC 9110 §15.4.5).
_BODY_HEADERS = (b"content-length", b"content-type")


def entity_tag(body: bytes) -> str:
    """The strong entity tag of an answer's body: a quoted hash of it."""
    digest = hashlib.blake2b(body, digest_size=16).digest()
    return '"' + base64.urlsafe_b64encode(digest).rstrip(b"=").decode() + '"'


def none_match(header: str, tag: str) -> bool:
    """Whether an ``If-None-Match`` value names ``tag``: ``*`` names any, and a tag
    compares weakly, a ``W/`` prefix aside (RFC 9110 §13.1.2)."""
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == tag:
            return True
    return False


def _is_json(start: Message) -> bool:
    kind = Headers(raw=start["headers"]).get("content-type", "")
    return kind.split(";")[0].strip().lower() == "application/json"


def _not_modified(start: Message) -> Message:
    """The 304 in place of a 200 whose start was ``start``: its headers (the tag, the
    caching and sniffing rules), but none about a body."""
    headers = [(k, v) for k, v in start["headers"] if k.lower() not in _BODY_HEADERS]
    return {**start, "status": 304, "headers": headers}


class ConditionalGet:
    """Tags every ``200`` JSON answer to a GET sent in one piece, and answers ``304`` in
    its place when the request's ``If-None-Match`` names the tag (see the module
    docstring).  A JSON answer streamed in several pieces goes out untagged, as it
    comes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        wanted = Headers(scope=scope).get("if-none-match")
        held: Message | None = None  # a JSON answer's start, until its body is known

        async def sending(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                if message["status"] == 200 and _is_json(message):
                    held = message
                    return
            elif held is not None and message["type"] == "http.response.body":
                start, held = held, None
                if not message.get("more_body", False):
                    tag = entity_tag(message.get("body", b""))
                    MutableHeaders(scope=start)["ETag"] = tag
                    if wanted is not None and none_match(wanted, tag):
                        await send(_not_modified(start))
                        await send({"type": "http.response.body", "body": b""})
                        return
                await send(start)
            await send(message)

        await self.app(scope, receive, sending)
