"""An OpenAI-compatible server that behaves like a provider account, for the admission
tests and the benchmark: its limits are a :class:`~tests.providers.account.ProviderAccount`
(requests and tokens buckets refilled continuously), each admitted call streams its answer
for a set time, and every response carries OpenAI's rate-limit headers.

``POST /v1/chat/completions`` (``stream: true`` with ``stream_options.include_usage``, or
not streamed) is checked against the account as it arrives: refused, it is answered ``429``
with OpenAI's error body, ``retry-after`` (whole seconds, rounded up) and
``retry-after-ms``; admitted, it streams ``chunks`` text chunks spaced evenly over
``stream_seconds``, then ``finish_reason: stop`` and a usage chunk.  A last user message
saying ``use tool <name>`` is answered with one call of that tool instead (the next
request, carrying its result, gets text), so multi-step turns can run against it.  Every
response, 200 or 429, has ``x-ratelimit-limit-requests``/``-tokens``, ``-remaining-`` and
``-reset-`` (Go durations: ``1s``, ``6m0s``, ``20ms``) for each limit the account has.  In
the quota mode every call is refused with ``insufficient_quota``; after ``refuse(n)``
the next ``n`` calls are refused for their rate (a 429 out of phase).

In process::

    with RateLimitedServer(rpm=1200, tpm=None, stream_seconds=1.0) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x")
        ...
        server.stats().admitted

As its own process (the fleet's workers are other processes; the benchmark wants the
server off the client's core): ``python -m tests.providers.rate_limited_server --rpm 1200
--stream-seconds 1 --port 0`` prints its base URL on its first line of stdout, serves
``GET /stats`` (JSON), ``POST /stats/reset`` and ``POST /mode`` (``{"mode": "quota"}``),
``POST /refuse`` (``{"calls": n}``), until it is terminated; :func:`server_process` runs it
so from a test.

A stdlib ``ThreadingHTTPServer`` (a thread per connection, a deep listen backlog) sustains
the hundreds of concurrent streams and ~50 calls a second a fleet test needs: the streams
mostly sleep between chunks.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.providers.account import BucketState, Decision, ProviderAccount, Stats

PATH = "/v1/chat/completions"
MODEL = "gpt-test"
ORGANIZATION = "org-parley-tests"
TOOL_REQUEST = re.compile(r"\buse tool ([A-Za-z0-9_.-]+)")
"""In the last user message: answer with one call of that tool."""

LISTEN_BACKLOG = 1024
"""Connections the kernel queues before the server accepts them: a fleet opening a hundred
at once must not see refused or delayed connects (the stdlib's default is 5)."""


@dataclass(frozen=True, kw_only=True)
class Behaviour:
    """How admitted calls are answered: ``chunks`` text chunks over ``stream_seconds``."""

    stream_seconds: float = 1.0
    chunks: int = 10

    def __post_init__(self) -> None:
        if not self.stream_seconds >= 0:
            raise ValueError(f"stream_seconds must be >= 0, not {self.stream_seconds!r}")
        if self.chunks < 1:
            raise ValueError(f"chunks must be at least 1, not {self.chunks!r}")


class RateLimitedServer:
    """The server in a thread of this process, on 127.0.0.1 (``port`` 0: any free one)."""

    def __init__(
        self,
        *,
        rpm: int | None = 1200,
        tpm: int | None = None,
        stream_seconds: float = 1.0,
        chunks: int = 10,
        burst: float = 1.0,
        port: int = 0,
    ) -> None:
        self.account = ProviderAccount(rpm=rpm, tpm=tpm, burst=burst)
        self.behaviour = Behaviour(stream_seconds=stream_seconds, chunks=chunks)
        self._http = _Server(("127.0.0.1", port), _handler(self.account, self.behaviour))
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    @property
    def base_url(self) -> str:
        """What a client is configured with (``.../v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> Stats:
        return self.account.stats()

    def reset_stats(self) -> None:
        self.account.reset_stats()

    def set_mode(self, mode: str) -> None:
        """``"quota"``: every call is refused with ``insufficient_quota``; ``"normal"``."""
        self.account.set_mode(mode)

    def refuse(self, calls: int) -> None:
        """Refuse the next ``calls`` calls for their rate, whatever the buckets hold."""
        self.account.refuse(calls)

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> RateLimitedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Server(ThreadingHTTPServer):
    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True
    block_on_close = False  # a stream still running must not hold up a test's teardown

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up (a cancelled call, a closed pool) is normal here.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


# ---------------------------------------------------------------------------- requests


def _handler(account: ProviderAccount, behaviour: Behaviour) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the stats say what happened

        def do_GET(self) -> None:
            if self.path == "/stats":
                self._json(200, account.stats().to_json())
            else:
                self._json(404, _error(f"no route GET {self.path}", "invalid_request_error"))

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                if self.path == PATH:
                    self._complete(body)
                elif self.path == "/mode":
                    self._mode(body)
                elif self.path == "/refuse":
                    self._refuse(body)
                elif self.path == "/stats/reset":
                    account.reset_stats()
                    self._json(200, {"reset": True})
                else:
                    self._json(404, _error(f"no route POST {self.path}", "invalid_request_error"))
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client hung up mid-answer

        def _mode(self, body: bytes) -> None:
            try:
                account.set_mode(json.loads(body)["mode"])
            except (ValueError, KeyError, TypeError) as exc:
                self._json(400, _error(f'expected {{"mode": "normal" | "quota"}}: {exc}'))
                return
            self._json(200, {"mode": account.mode})

        def _refuse(self, body: bytes) -> None:
            try:
                account.refuse(json.loads(body)["calls"])
            except (ValueError, KeyError, TypeError) as exc:
                self._json(400, _error(f'expected {{"calls": <a whole number >= 0>}}: {exc}'))
                return
            self._json(200, {"refusing": json.loads(body)["calls"]})

        def _complete(self, body: bytes) -> None:
            try:
                call = Call.parse(body)
            except ValueError as exc:
                self._json(400, _error(str(exc), "invalid_request_error"))
                return
            decision = account.admit(call.tokens)
            headers = rate_limit_headers(decision)
            if not decision.admitted:
                headers.update(_retry_headers(decision))
                self._json(429, refusal_body(decision, call.tokens), headers)
                return
            account.stream_started()
            try:
                if call.stream:
                    self._stream(call, headers)
                else:
                    time.sleep(behaviour.stream_seconds)
                    self._json(200, answer_body(call, behaviour), headers)
            finally:
                account.stream_ended()

        def _stream(self, call: Call, headers: dict[str, str]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            frames = answer_frames(call, behaviour)
            gap = behaviour.stream_seconds / len(frames.timed)
            for frame in frames.timed:
                time.sleep(gap)
                self._chunk(frame)
            for frame in frames.closing:
                self._chunk(frame)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _chunk(self, frame: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            self.wfile.flush()

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


@dataclass(frozen=True, kw_only=True)
class Call:
    """One chat-completions request as the account counts it."""

    stream: bool
    include_usage: bool
    prompt_tokens: int
    max_tokens: int
    tool: str | None
    """The tool the last user message asks to be called, if it does."""

    @property
    def tokens(self) -> int:
        """What OpenAI counts against the tokens limit when the call arrives: the prompt's
        estimate plus the output it may ask for."""
        return self.prompt_tokens + self.max_tokens

    @classmethod
    def parse(cls, body: bytes) -> Call:
        """The request body; ValueError saying what is wrong with it."""
        try:
            request = json.loads(body)
        except ValueError as exc:
            raise ValueError(f"the body is not JSON: {exc}") from None
        messages = request.get("messages") if isinstance(request, dict) else None
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty array")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise ValueError("each message must be an object with a 'role'")
        ceiling = request.get("max_completion_tokens", request.get("max_tokens")) or 0
        if isinstance(ceiling, bool) or not isinstance(ceiling, int) or ceiling < 0:
            raise ValueError(f"max_tokens must be a whole number, not {ceiling!r}")
        options = request.get("stream_options") or {}
        last = messages[-1]
        wanted = TOOL_REQUEST.search(_text(last)) if last["role"] == "user" else None
        return cls(
            stream=request.get("stream") is True,
            include_usage=isinstance(options, dict) and options.get("include_usage") is True,
            prompt_tokens=estimate_prompt_tokens(messages),
            max_tokens=ceiling,
            tool=wanted.group(1) if wanted else None,
        )


def estimate_prompt_tokens(messages: Sequence[dict[str, Any]]) -> int:
    """Characters of every message's text and tool-call arguments, over four."""
    chars = 0
    for message in messages:
        chars += len(_text(message))
        for call in message.get("tool_calls") or ():
            function = (call.get("function") if isinstance(call, dict) else None) or {}
            chars += len(str(function.get("name", ""))) + len(str(function.get("arguments", "")))
    return max(1, math.ceil(chars / 4))


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


# ---------------------------------------------------------------------------- answers


@dataclass(frozen=True)
class Frames:
    """A streamed answer: the frames spaced over the stream's time, then those sent at
    once at its end (finish, usage, ``[DONE]``)."""

    timed: list[bytes]
    closing: list[bytes]


def answer_frames(call: Call, behaviour: Behaviour) -> Frames:
    pieces = _pieces(behaviour)
    if call.tool is not None:
        timed = [_chunk({"role": "assistant", "content": None})] * max(1, behaviour.chunks - 1)
        timed.append(_chunk({"tool_calls": [_tool_call(call.tool)]}))
        finish = "tool_calls"
    else:
        timed = [_chunk({"content": piece}) for piece in pieces]
        timed[0] = _chunk({"role": "assistant", "content": pieces[0]})
        finish = "stop"
    closing = [_chunk({}, finish=finish)]
    if call.include_usage:
        closing.append(_sse(_completion_chunk([], usage=_usage(call, behaviour))))
    closing.append(_sse("[DONE]"))
    return Frames(timed=timed, closing=closing)


def answer_body(call: Call, behaviour: Behaviour) -> dict[str, Any]:
    """The non-streamed answer."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(_pieces(behaviour))}
    finish = "stop"
    if call.tool is not None:
        message = {"role": "assistant", "content": None, "tool_calls": [_tool_call(call.tool)]}
        finish = "tool_calls"
    return {
        "id": "chatcmpl-rl",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": _usage(call, behaviour),
    }


def _pieces(behaviour: Behaviour) -> list[str]:
    return [f"word{n} " for n in range(behaviour.chunks)]


def _usage(call: Call, behaviour: Behaviour) -> dict[str, Any]:
    completion = 1 if call.tool is not None else behaviour.chunks
    return {
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": call.prompt_tokens + completion,
    }


def _tool_call(name: str) -> dict[str, Any]:
    return {
        "index": 0,
        "id": f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": "{}"},
    }


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return _sse(_completion_chunk([{"index": 0, "delta": delta, "finish_reason": finish}]))


def _completion_chunk(choices: list[Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-rl",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL,
        "choices": choices,
        "usage": usage,
    }


def _sse(data: Any) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


# ---------------------------------------------------------------------------- limits


def rate_limit_headers(decision: Decision) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers for each limit the account has."""
    headers: dict[str, str] = {}
    for name, state in (("requests", decision.requests), ("tokens", decision.tokens)):
        if state is None:
            continue
        headers[f"x-ratelimit-limit-{name}"] = str(state.limit)
        headers[f"x-ratelimit-remaining-{name}"] = str(state.remaining)
        headers[f"x-ratelimit-reset-{name}"] = go_duration(state.reset)
    return headers


def go_duration(seconds: float) -> str:
    """Seconds as OpenAI writes them: ``20ms`` under a second, ``1.5s``, ``6m0s``,
    ``1h0m0s``."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


def _retry_headers(decision: Decision) -> dict[str, str]:
    if decision.refused not in ("requests", "tokens"):
        return {}  # no wait mends a spent quota or a call larger than the limit
    return {
        "retry-after": str(max(1, math.ceil(decision.retry_after))),
        "retry-after-ms": str(max(1, math.ceil(decision.retry_after * 1000))),
    }


def refusal_body(decision: Decision, tokens: int) -> dict[str, Any]:
    """OpenAI's error body for a refused call."""
    if decision.refused == "quota":
        return {
            "error": {
                "message": "You exceeded your current quota, please check your plan and "
                "billing details.",
                "type": "insufficient_quota",
                "param": None,
                "code": "insufficient_quota",
            }
        }
    state: BucketState | None
    if decision.refused == "too_large":
        state = decision.tokens
        limit = state.limit if state else 0
        message = (
            f"Request too large for {MODEL} in organization {ORGANIZATION} on tokens per "
            f"min (TPM): Limit {limit}, Requested {tokens}."
        )
        return _error(message, "tokens", code="rate_limit_exceeded")
    kind = decision.refused
    state = decision.requests if kind == "requests" else decision.tokens
    unit = "requests per min (RPM)" if kind == "requests" else "tokens per min (TPM)"
    limit = state.limit if state else 0
    requested = 1 if kind == "requests" else tokens
    message = (
        f"Rate limit reached for {kind} in organization {ORGANIZATION} on {unit}: Limit "
        f"{limit}, Requested {requested}. Please try again in "
        f"{go_duration(decision.retry_after)}."
    )
    return _error(message, kind, code="rate_limit_exceeded")


def _error(
    message: str, kind: str = "invalid_request_error", code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# ---------------------------------------------------------------------------- a process


class ServerProcess:
    """The server running as its own process: its base URL, and its stats and mode over
    HTTP."""

    def __init__(self, process: subprocess.Popen[str], base_url: str) -> None:
        self.process = process
        self.base_url = base_url
        self._root = base_url.removesuffix("/v1")

    def stats(self) -> Stats:
        with urllib.request.urlopen(f"{self._root}/stats", timeout=10) as response:
            return Stats.from_json(json.load(response))

    def reset_stats(self) -> None:
        self._post("/stats/reset", {})

    def set_mode(self, mode: str) -> None:
        self._post("/mode", {"mode": mode})

    def refuse(self, calls: int) -> None:
        self._post("/refuse", {"calls": calls})

    def _post(self, path: str, body: Any) -> None:
        request = urllib.request.Request(
            f"{self._root}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10):
            pass


@contextmanager
def server_process(*arguments: str, start_timeout: float = 30.0) -> Iterator[ServerProcess]:
    """Run ``python -m tests.providers.rate_limited_server`` with ``arguments`` (the
    command line's, e.g. ``"--rpm", "1200"``) from the repository, and stop it after."""
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.providers.rate_limited_server", *arguments],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready = threading.Event()
        lines: list[str] = []

        def first_line() -> None:
            assert process.stdout is not None
            lines.append(process.stdout.readline().strip())
            ready.set()

        threading.Thread(target=first_line, daemon=True).start()
        if not ready.wait(start_timeout) or not lines[0].startswith("http://"):
            raise RuntimeError(
                f"the rate-limited server did not start (exit code {process.poll()}, "
                f"first line {lines[:1]!r})"
            )
        yield ServerProcess(process, lines[0])
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _limit(text: str) -> int | None:
    if text.lower() in ("none", "0", ""):
        return None
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a limit is a positive number or none, not {text}")
    return value


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.providers.rate_limited_server",
        description="An OpenAI-compatible server with an account's rate limits.",
    )
    parser.add_argument("--rpm", type=_limit, default=1200, help="requests a minute (none)")
    parser.add_argument("--tpm", type=_limit, default=None, help="tokens a minute (none)")
    parser.add_argument("--burst", type=float, default=1.0, help="seconds of rate a bucket holds")
    parser.add_argument("--stream-seconds", type=float, default=1.0)
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--port", type=int, default=0)
    options = parser.parse_args(argv)
    try:
        server = RateLimitedServer(
            rpm=options.rpm,
            tpm=options.tpm,
            stream_seconds=options.stream_seconds,
            chunks=options.chunks,
            burst=options.burst,
            port=options.port,
        )
    except ValueError as exc:
        parser.error(str(exc))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(server.base_url, flush=True)
    stop.wait()
    server.close()


if __name__ == "__main__":
    main()
