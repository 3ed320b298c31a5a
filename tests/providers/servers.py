"""Real HTTP servers on loopback that speak the providers' protocols, for the provider tests.

Each server runs a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 (ephemeral port) in a thread
and answers from a queue of planned :class:`Reply` objects, one per request: stream these
SSE frames (with pauses, a gate, a cut connection), or answer with a status and headers
(``429`` with ``Retry-After``), or sleep before answering.  Every request received is
recorded with its headers and raw body bytes so tests can assert what was sent.

No client library is mocked: the official ``openai`` and ``anthropic`` clients talk real
HTTP/1.1 to these servers.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from openai.types.chat import ChatCompletionMessageParam
from pydantic import TypeAdapter, ValidationError


@dataclass(kw_only=True)
class Reply:
    """One planned response.

    ``frames`` are SSE frames, each written (and flushed) as its own HTTP chunk; ``body``
    is a plain JSON body instead.  ``delay`` sleeps before the status line; ``gaps`` maps a
    frame index to a pause before it; ``gate`` (with ``gate_at``) blocks before that frame
    until the test sets it (and cuts the connection if it is not set within
    ``gate_timeout``); ``cut_after`` drops the connection after that many frames
    without finishing the chunked body; ``echo_key`` puts the received credential into
    the error message (as some providers do), to prove the client side redacts it."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    frames: Sequence[bytes] = ()
    body: Any = None
    delay: float = 0.0
    gaps: dict[int, float] = field(default_factory=dict)
    gate: threading.Event | None = None
    gate_at: int = 0
    gate_timeout: float = 5.0
    cut_after: int | None = None
    echo_key: bool = False


@dataclass(frozen=True, kw_only=True)
class Received:
    """A request as the server got it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed."""
        return json.loads(self.body)


class ProviderServer:
    """A scriptable server for one protocol, answering POSTs to ``path``."""

    def __init__(
        self, path: str, *, kind: str, check: Callable[[Any], list[str]] | None = None
    ) -> None:
        """``check`` names what the real endpoint would refuse in a request's JSON body:
        a request it finds fault with is answered ``400`` with those faults, as the
        provider answers, and uses no planned response."""
        self.path = path
        self.kind = kind
        self.check = check
        self.received: list[Received] = []
        self._plans: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._http = _QuietServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        # A handler still sleeping (a timeout test) must not hold up the test's teardown.
        self._http.block_on_close = False
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        """The ephemeral port."""
        return int(self._http.server_address[1])

    @property
    def base_url(self) -> str:
        """The URL a client is configured with."""
        root = f"http://127.0.0.1:{self.port}"
        return root + "/v1" if self.kind == "openai" else root

    def plan(self, *replies: Reply) -> None:
        """Queue responses for the next requests, in order."""
        with self._lock:
            self._plans.extend(replies)

    def pending(self) -> int:
        """Planned responses not yet used."""
        with self._lock:
            return len(self._plans)

    def next_plan(self) -> Reply | None:
        with self._lock:
            return self._plans.popleft() if self._plans else None

    def close(self) -> None:
        """Stop serving and release the port."""
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ProviderServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client closing its keep-alive connection (or giving up on a timeout) is normal
        # here; anything else is still reported.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler(server: ProviderServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: failures show up in the tests' assertions

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            server.received.append(
                Received(
                    method="POST",
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                )
            )
            try:
                if self.path != server.path:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                faults = server.check(json.loads(body)) if server.check else []
                if faults:
                    error = {
                        "message": "; ".join(faults),
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": None,
                    }
                    self._json(400, {"error": error})
                    return
                plan = server.next_plan()
                if plan is None:
                    self._json(500, {"error": {"message": "the test planned no response"}})
                else:
                    self._answer(plan)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (a timeout test)

        def _answer(self, plan: Reply) -> None:
            if plan.delay:
                time.sleep(plan.delay)
            if not plan.frames:
                body = plan.body
                if plan.echo_key:
                    key = self.headers.get("x-api-key") or self.headers.get("Authorization", "")
                    body = {"error": {"type": "authentication_error", "message": f"bad key {key}"}}
                self._json(plan.status, body or {}, plan.headers)
                return
            self.send_response(plan.status)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            for name, value in plan.headers.items():
                self.send_header(name, value)
            self.end_headers()
            for index, frame in enumerate(plan.frames):
                if plan.cut_after is not None and index >= plan.cut_after:
                    self._cut()
                    return
                if (
                    plan.gate is not None
                    and index == plan.gate_at
                    and not plan.gate.wait(timeout=plan.gate_timeout)
                ):
                    self._cut()  # the client never saw the earlier frames: fail the test
                    return
                if index in plan.gaps:
                    time.sleep(plan.gaps[index])
                self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                self.wfile.flush()
            if plan.cut_after is not None:
                self._cut()
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _cut(self) -> None:
            """Drop the connection in the middle of the chunked body."""
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

        def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()

    return Handler


def openai_server(*, strict: bool = False) -> ProviderServer:
    """An OpenAI-compatible server: ``POST /v1/chat/completions``.  ``strict``: it refuses
    what OpenAI's own endpoint refuses in the messages (:func:`openai_message_faults`)."""
    return ProviderServer(
        "/v1/chat/completions", kind="openai", check=openai_message_faults if strict else None
    )


_OPENAI_MESSAGES: TypeAdapter[list[ChatCompletionMessageParam]] = TypeAdapter(
    list[ChatCompletionMessageParam]
)


def openai_message_faults(body: Any) -> list[str]:
    """What OpenAI's chat-completions endpoint refuses (with a 400) in the ``messages`` of
    a request ``body``: a message that is none of the official client's message types
    (validated against them), an assistant message whose ``tool_calls`` are not each
    answered by a ``tool`` message right after it, and a ``tool`` message that answers no
    call of the assistant message before it (OpenAI's own wording, where it has one)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return ["'messages' must be a non-empty array"]
    try:
        for message in _OPENAI_MESSAGES.validate_python(messages):
            for value in message.values():
                _drain(value)  # pydantic validates iterable fields as they are read
    except ValidationError as exc:
        return [f"messages are not chat-completions messages: {exc}"]
    faults: list[str] = []
    waiting: list[str] = []  # the calls of the last assistant message not yet answered
    answering = False  # inside the run of tool messages after an assistant's calls
    for position, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            call_id = message["tool_call_id"]
            if not answering or call_id not in waiting:
                faults.append(
                    f"messages[{position}]: messages with role 'tool' must be a response "
                    f"to a preceeding message with 'tool_calls' (no call {call_id!r})"
                )
            else:
                waiting.remove(call_id)
            continue
        if waiting:
            faults.append(_unanswered(waiting))
        calls = (message.get("tool_calls") or []) if role == "assistant" else []
        waiting = [call["id"] for call in calls]
        answering = bool(waiting)
        if len(set(waiting)) != len(waiting):
            faults.append(f"messages[{position}]: duplicate tool_call ids {waiting}")
    if waiting:
        faults.append(_unanswered(waiting))
    return faults


def _unanswered(ids: list[str]) -> str:
    return (
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        + ", ".join(ids)
    )


def _drain(value: Any) -> None:
    """Read every nested value of a validated message (running the lazy validators)."""
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        return
    if isinstance(value, dict):
        for item in value.values():
            _drain(item)
        return
    for item in value:
        _drain(item)


def anthropic_server() -> ProviderServer:
    """An Anthropic Messages server: ``POST /v1/messages``."""
    return ProviderServer("/v1/messages", kind="anthropic")


# ---------------------------------------------------------------------------- OpenAI frames


def sse(data: Any, event: str | None = None) -> bytes:
    """One SSE frame."""
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def openai_chunk(
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str | None = None,
    role: str | None = None,
) -> bytes:
    """One ``chat.completion.chunk`` frame with a single choice."""
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return sse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "gpt-test",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def openai_usage(prompt: int, completion: int, cached: int = 0) -> bytes:
    """The final usage chunk (``stream_options.include_usage``): no choices."""
    return sse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "gpt-test",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
    )


DONE = sse("[DONE]")


def openai_text(
    *pieces: str, usage: tuple[int, int, int] | None = (12, 5, 0), finish: str = "stop"
) -> list[bytes]:
    """Frames streaming ``pieces`` as text, then the finish, usage and ``[DONE]``."""
    frames = [openai_chunk(role="assistant", content="")]
    frames += [openai_chunk(content=piece) for piece in pieces]
    frames.append(openai_chunk(finish=finish))
    if usage is not None:
        frames.append(openai_usage(*usage))
    frames.append(DONE)
    return frames


def openai_tool_calls(
    calls: Sequence[tuple[str, str, Sequence[str]]],
    *,
    text: Sequence[str] = (),
    usage: tuple[int, int, int] = (30, 9, 0),
) -> list[bytes]:
    """Frames streaming text, then each ``(id, name, argument_fragments)`` call split into
    fragments keyed by index (id and name in the first fragment only, as OpenAI does)."""
    frames = [openai_chunk(role="assistant", content=None)]
    frames += [openai_chunk(content=piece) for piece in text]
    for index, (call_id, name, fragments) in enumerate(calls):
        first = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        frames.append(openai_chunk(tool_calls=[first]))
        frames += [
            openai_chunk(tool_calls=[{"index": index, "function": {"arguments": fragment}}])
            for fragment in fragments
        ]
    frames.append(openai_chunk(finish="tool_calls"))
    frames.append(openai_usage(*usage))
    frames.append(DONE)
    return frames


# ---------------------------------------------------------------------------- Anthropic frames


def anthropic_message(
    *pieces: str,
    tool_uses: Sequence[tuple[str, str, Sequence[str]]] = (),
    usage: tuple[int, int, int, int] = (20, 7, 0, 0),
    stop: bool = True,
) -> list[bytes]:
    """Frames of one streamed message: text ``pieces`` in one text block, then each
    ``(id, name, json_fragments)`` as a ``tool_use`` block.  ``usage`` is (input, output,
    cache_read, cache_creation)."""
    input_tokens, output_tokens, cache_read, cache_write = usage
    frames = [
        sse(
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-test",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": input_tokens,
                        "output_tokens": 1,
                        "cache_read_input_tokens": cache_read,
                        "cache_creation_input_tokens": cache_write,
                    },
                },
            },
            "message_start",
        ),
        sse({"type": "ping"}, "ping"),
    ]
    index = 0
    if pieces:
        frames.append(
            sse(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            )
        )
        frames += [
            sse(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": piece},
                },
                "content_block_delta",
            )
            for piece in pieces
        ]
        frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    for call_id, name, fragments in tool_uses:
        frames.append(
            sse(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
                },
                "content_block_start",
            )
        )
        frames += [
            sse(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": fragment},
                },
                "content_block_delta",
            )
            for fragment in fragments
        ]
        frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    frames.append(
        sse(
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": "tool_use" if tool_uses else "end_turn",
                    "stop_sequence": None,
                },
                "usage": {"output_tokens": output_tokens},
            },
            "message_delta",
        )
    )
    if stop:
        frames.append(sse({"type": "message_stop"}, "message_stop"))
    return frames


def frames_text(frames: Iterator[bytes]) -> str:
    """All frames as one string (for debugging a failing test)."""
    return b"".join(frames).decode()
