"""What a client that misuses its connections gets from a real ``parley gateway``
process, over real sockets: a request head or body that does not arrive in time is
``408`` and the connection closed, a request that is not HTTP is ``400`` in the error
form, and a tenant past its bounds of requests in flight and live streams is ``429``
with ``Retry-After`` while another tenant is served.

One embedded gateway on SQLite serves the module, with short deadlines and small bounds;
the connections are the same on every deployment (the fleet's gateway is the same
application on the same server), so no other deployment is run.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.fleet import REPO
from tests.support.gateway import Gateway, Tenant, make_tokens, start_gateway
from tests.support.waiting import wait_until

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
TENANT_REQUESTS = 3
TENANT_STREAMS = 2
# How much later than its deadline a connection may be closed on a loaded machine.
SLACK_SECONDS = 4.0
GATED = {
    "when": "^gated",
    "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "ok"}],
}
ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("connections")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")},
        "PARLEY_DATABASE_URL": f"sqlite:///{directory / 'parley.db'}",
        "PARLEY_HOST": "tests.support.hosts:workspace_host",
        "PYTHONPATH": str(REPO),
    }
    started = start_gateway(
        env,
        directory,
        tokens=make_tokens([f"tenant{n}" for n in range(8)]),
        extra={
            "PARLEY_GATEWAY_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
            "PARLEY_GATEWAY_BODY_TIMEOUT": str(BODY_TIMEOUT),
            "PARLEY_GATEWAY_TENANT_REQUESTS": str(TENANT_REQUESTS),
            "PARLEY_GATEWAY_TENANT_STREAMS": str(TENANT_STREAMS),
        },
    )
    yield started
    started.stop()


@pytest.fixture
def tenant(gateway: Gateway) -> Tenant:
    fresh = gateway.tenant()
    fresh.control.script([GATED, ECHO])
    return fresh


@dataclass(frozen=True)
class RawAnswer:
    """An HTTP/1.1 response read off a socket."""

    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        """The body, which is the error form."""
        assert self.headers["content-type"] == "application/json", self.headers
        assert self.headers["x-content-type-options"] == "nosniff", self.headers
        value = json.loads(self.body)
        assert set(value) == {"error"} and set(value["error"]) == {"type", "message"}, value
        error: dict[str, Any] = value["error"]
        return error


def connect(gateway: Gateway) -> socket.socket:
    address = urlsplit(gateway.url)
    assert address.hostname is not None and address.port is not None
    return socket.create_connection((address.hostname, address.port), timeout=30)


def until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the gateway sends until it closes the connection, and when it closed
    (seconds from now)."""
    started = time.monotonic()
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received, time.monotonic() - started


def read_answer(sock: socket.socket) -> RawAnswer:
    """One response (with a Content-Length) off a connection that stays open."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += sock.recv(65536)
    answer = parse(raw)
    length = int(answer.headers["content-length"])
    body = answer.body
    while len(body) < length:
        body += sock.recv(65536)
    return RawAnswer(answer.status, answer.headers, body)


def parse(raw: bytes) -> RawAnswer:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawAnswer(int(status_line.split()[1]), headers, body)


def test_a_request_head_that_does_not_arrive_in_time_is_dropped(gateway: Gateway) -> None:
    # What the red team did: hundreds of half requests, held open.  Here 60 of them, a
    # third each of: half a request line, half the headers, nothing at all.
    halves = [b"GET /v1/sess", b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Slow: ", b""]
    held = []
    for number in range(60):
        sock = connect(gateway)
        sock.sendall(halves[number % 3])
        held.append((halves[number % 3], sock))
    # One more trickles its headers a byte at a time: busy, but its head never ends.
    with connect(gateway) as trickle:
        trickle.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Slow: ")
        trickle.settimeout(0.2)
        started = time.monotonic()
        trickled = b""
        while time.monotonic() - started < HEADER_TIMEOUT + SLACK_SECONDS:
            try:
                trickle.sendall(b"x")
                chunk = trickle.recv(65536)
            except TimeoutError:
                continue
            except OSError:  # written to after it closed: reset
                break
            trickled += chunk
            if not chunk:
                break
        assert time.monotonic() - started < HEADER_TIMEOUT + SLACK_SECONDS
        assert parse(trickled).status == 408, trickled
    # Meanwhile, and after, the gateway answers anyone else.
    with connect(gateway) as fine:
        fine.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
        answer = parse(until_closed(fine)[0])
        assert answer.status == 200 and json.loads(answer.body) == {"status": "ok", "checks": {}}
    for sent, sock in held:
        with sock:
            raw, after = until_closed(sock)
        assert after < HEADER_TIMEOUT + SLACK_SECONDS, (sent, after)
        if not sent:
            assert raw == b""  # a connection that said nothing is closed without a word
            continue
        refusal = parse(raw)
        assert refusal.status == 408 and refusal.headers["connection"] == "close"
        error = refusal.error()
        assert error["type"] == "RequestTimeout"
        assert "PARLEY_GATEWAY_HEADER_TIMEOUT" in error["message"]


def test_a_keep_alive_connection_may_idle_past_the_head_deadline(gateway: Gateway) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n"
    with connect(gateway) as sock:
        for _ in range(2):
            sock.sendall(request)
            assert read_answer(sock).status == 200
            time.sleep(HEADER_TIMEOUT + 0.5)  # idle between requests: keep-alive's business


def test_a_body_that_stops_coming_is_408_and_creates_nothing(
    gateway: Gateway, tenant: Tenant
) -> None:
    body = json.dumps({"metadata": {"note": "x" * 100}}).encode()
    head = (
        f"POST /v1/sessions HTTP/1.1\r\nHost: gateway\r\n"
        f"Authorization: Bearer {tenant.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    for sent in (b"", body[:20]):
        with connect(gateway) as sock:
            sock.sendall(head + sent)
            raw, after = until_closed(sock)
        assert after < BODY_TIMEOUT + SLACK_SECONDS, after
        refusal = parse(raw)
        assert refusal.status == 408, raw
        error = refusal.error()
        assert error["type"] == "RequestTimeout"
        assert "PARLEY_GATEWAY_BODY_TIMEOUT" in error["message"]
    assert tenant.http.get("/v1/sessions").json() == {"sessions": []}
    # (the one directory there holds the test's control files)
    assert [p.name for p in tenant.workspaces.iterdir()] == [".parley-test"]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"NOT A REQUEST\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nno colon here\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS hello, on plain HTTP
    ],
)
def test_a_request_that_is_not_http_is_400_in_the_error_form(
    gateway: Gateway, request_bytes: bytes
) -> None:
    with connect(gateway) as sock:
        sock.sendall(request_bytes)
        raw, _ = until_closed(sock)
    refusal = parse(raw)
    assert refusal.status == 400, raw
    assert refusal.headers["cache-control"] == "no-store"
    assert refusal.error()["type"] == "InvalidRequest"


def test_a_tenant_past_its_bounds_gets_429_while_another_is_served(
    gateway: Gateway, tenant: Tenant
) -> None:
    other = gateway.tenant()
    other.control.script([GATED, ECHO])
    session = tenant.new_session(workspace="workspace")
    turn = tenant.submit(session["id"], "gated job")
    tenant.control.wait_entered()
    events = f"/v1/turns/{turn['turn_id']}/events"
    with tenant.stream(turn["turn_id"]) as first, tenant.stream(turn["turn_id"]) as second:
        assert first.response.status_code == second.response.status_code == 200
        # A third stream is past TENANT_STREAMS: refused before the route runs.
        third = tenant.http.get(events)
        assert third.status_code == 429, third.text
        assert third.headers["retry-after"] == "5"
        assert third.json()["error"]["type"] == "TooManyRequests"
        assert "PARLEY_GATEWAY_TENANT_STREAMS" in third.json()["error"]["message"]
        agui = tenant.http.post("/v1/ag-ui", json={"threadId": "t", "runId": "r", "messages": []})
        assert agui.status_code == 429  # (a stream too, refused before it is read)
        # Another tenant's streams and requests are its own.
        theirs = other.new_session(workspace="workspace")
        echoed = other.submit(theirs["id"], "hello")
        assert [m.event for m in other.events(echoed["turn_id"])][-1] == "end"
        # Two streams and a wait are TENANT_REQUESTS in flight: a fourth request is refused.
        waiter = gateway.tenant(tenant.name)  # (a client of its own, in a thread of its own)
        waited: list[httpx.Response] = []
        result = f"/v1/turns/{turn['turn_id']}/result"

        def wait() -> None:
            # The listings below may hold the third place when the wait arrives: it
            # tries again until it has one.
            while (answer := waiter.http.get(result, params={"wait": 30})).status_code == 429:
                time.sleep(0.05)
            waited.append(answer)

        thread = threading.Thread(target=wait)
        thread.start()
        deadline = time.monotonic() + 10
        while True:
            listing = tenant.http.get("/v1/sessions")
            if listing.status_code == 429 or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # (the wait may not have reached the gateway yet)
        assert listing.status_code == 429, listing.text
        assert listing.headers["retry-after"] == "1"
        assert "PARLEY_GATEWAY_TENANT_REQUESTS" in listing.json()["error"]["message"]
        assert other.http.get("/v1/sessions").status_code == 200
        tenant.control.open_gate()
        thread.join(30)
        assert [answer.status_code for answer in waited] == [200]
        for stream in (first, second):
            assert [m.event for m in stream.events()][-1] == "end"
    # Ended, the streams gave their places back: once the gateway has finished their
    # responses, which may be a moment after the client read their last byte.
    replay = wait_until(
        lambda: (answer := tenant.http.get(events)).status_code != 429 and answer,
        what="the streams' places back",
    )
    assert replay.status_code == 200 and "event: end" in replay.text
    assert tenant.http.get("/v1/sessions").status_code == 200
