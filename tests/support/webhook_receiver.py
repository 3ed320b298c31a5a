"""A real HTTP server on loopback that receives parley's webhooks for tests: it records
every POST (raw body and headers) and answers as the test says: ``ok`` (200), ``fail``
(500), or ``hang`` (no answer until the test lets go, so the deliverer times out)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from parley.webhooks import DELIVERY_HEADER, SIGNATURE_HEADER, verify

HANG_LIMIT_SECONDS = 30


@dataclass(frozen=True)
class Received:
    """One POST as it arrived, and what the receiver answered."""

    path: str
    headers: dict[str, str]
    body: bytes
    answer: str

    @property
    def payload(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.body)
        return value

    @property
    def delivery_id(self) -> str | None:
        return self.headers.get(DELIVERY_HEADER.lower())

    def signed_by(self, secret: str) -> bool:
        return verify(secret, self.body, self.headers.get(SIGNATURE_HEADER.lower()))


class Receiver:
    """The server; ``mode`` is the answer to every request after the ``plan``'s."""

    def __init__(self, mode: str = "ok", plan: tuple[str, ...] = ()) -> None:
        self.mode = mode
        self.plan = list(plan)
        self.received: list[Received] = []
        self._guard = threading.Lock()
        self._released = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                answer = receiver._next_answer()
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver._guard:
                    receiver.received.append(Received(self.path, headers, body, answer))
                if answer == "hang":
                    receiver._released.wait(HANG_LIMIT_SECONDS)
                status = 200 if answer in ("ok", "hang") else 500
                with contextlib.suppress(OSError):  # a client that gave up has gone
                    payload = b"ok" if status == 200 else b"receiver failed on purpose"
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the test reads what arrived, not a log."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/hooks/parley"

    def _next_answer(self) -> str:
        with self._guard:
            return self.plan.pop(0) if self.plan else self.mode

    def release(self) -> None:
        """Let every hanging request answer (the deliverer gave up on it already)."""
        self._released.set()

    def requests(self) -> list[Received]:
        with self._guard:
            return list(self.received)

    def answered_ok(self) -> dict[str, Received]:
        """The requests it answered 200 promptly, by delivery id."""
        return {r.delivery_id or "": r for r in self.requests() if r.answer == "ok"}

    def wait_for(self, count: int, timeout: float = 60, answer: str | None = None) -> None:
        """Until ``count`` requests (answered ``answer``, if given) arrived."""
        deadline = time.monotonic() + timeout
        while sum(answer in (None, r.answer) for r in self.requests()) < count:
            assert time.monotonic() < deadline, f"only {len(self.requests())} webhook(s) came"
            time.sleep(0.05)

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def receiver(mode: str = "ok", plan: tuple[str, ...] = ()) -> Iterator[Receiver]:
    """A :class:`Receiver`, closed after."""
    server = Receiver(mode, plan)
    try:
        yield server
    finally:
        server.close()
