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
# An upload may take a second, or as long as this rate takes to bring its bytes.
UPLOAD_RATE = 200_000
# The uploads the gateway takes, and holds in flight: in all, and of one tenant.
MAX_FILE = 1_500_000
UPLOAD_SPOOL = 3_000_000
TENANT_UPLOADS = 2
# The capped gateway's connections: in all, and from one address.
CONNECTIONS = 6
CLIENT_CONNECTIONS = 4
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
    (directory / "tmp").mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")},
        "PARLEY_DATABASE_URL": f"sqlite:///{directory / 'parley.db'}",
        "PARLEY_HOST": "tests.support.hosts:workspace_host",
        "PYTHONPATH": str(REPO),
        # Where an upload's body is spooled: the tests look at what is left there.
        "TMPDIR": str(directory / "tmp"),
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
            "PARLEY_GATEWAY_UPLOAD_RATE": str(UPLOAD_RATE),
            "PARLEY_GATEWAY_MAX_FILE": str(MAX_FILE),
            "PARLEY_GATEWAY_UPLOAD_SPOOL": str(UPLOAD_SPOOL),
            "PARLEY_GATEWAY_TENANT_UPLOADS": str(TENANT_UPLOADS),
        },
    )
    yield started
    started.stop()


def spooled(gateway: Gateway) -> list[str]:
    """What the gateway's uploads left in its temporary directory."""
    return [path.name for path in (gateway.workspaces.parent / "tmp").iterdir()]


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway that keeps few connections open."""
    directory = tmp_path_factory.mktemp("capped")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")},
        "PARLEY_DATABASE_URL": f"sqlite:///{directory / 'parley.db'}",
        "PARLEY_HOST": "tests.support.hosts:workspace_host",
        "PYTHONPATH": str(REPO),
    }
    started = start_gateway(
        env,
        directory,
        tokens=make_tokens(["tenant"]),
        extra={
            "PARLEY_GATEWAY_CONNECTIONS": str(CONNECTIONS),
            "PARLEY_GATEWAY_CLIENT_CONNECTIONS": str(CLIENT_CONNECTIONS),
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


def connect(gateway: Gateway, source: str | None = None) -> socket.socket:
    """A connection to the gateway (from the loopback address ``source``, if given)."""
    address = urlsplit(gateway.url)
    assert address.hostname is not None and address.port is not None
    where = None if source is None else (source, 0)
    return socket.create_connection(
        (address.hostname, address.port), timeout=30, source_address=where
    )


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


def upload(token: str | None, data: bytes, name: str = "lines.jsonl") -> tuple[bytes, bytes]:
    """The head and body of ``POST /v1/files`` uploading ``data`` (with ``token``)."""
    built = httpx.Request(
        "POST",
        "http://gateway/v1/files",
        files={"file": (name, data)},
        data={"purpose": "batch"},
    )
    body = built.read()
    lines = [
        "POST /v1/files HTTP/1.1",
        "Host: gateway",
        f"Content-Type: {built.headers['content-type']}",
        f"Content-Length: {len(body)}",
    ]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), body


def openai_error(answer: RawAnswer) -> dict[str, Any]:
    """The body, which is OpenAI's error form."""
    value = json.loads(answer.body)
    assert set(value) == {"error"}, value
    assert set(value["error"]) == {"message", "type", "param", "code"}, value
    error: dict[str, Any] = value["error"]
    return error


def test_a_request_without_a_known_token_is_401_before_any_of_its_body(
    gateway: Gateway, tenant: Tenant
) -> None:
    # What the red team did: an upload's head without a token (or with a bogus one),
    # then its body a byte every few seconds: the connection was open 70 s later, and
    # with a bogus token 50 MiB went to a temporary file and no 401 came.
    declared = 50 << 20
    for authorization in ("", "Bearer tok-nobody-0123456789abcdef", f"Bearer {tenant.token}x"):
        for path, kind in (
            ("/v1/files", "multipart/form-data; boundary=x"),
            ("/v1/batches", "application/json"),
            ("/v1/sessions", "application/json"),
        ):
            head = [f"POST {path} HTTP/1.1", "Host: gateway", f"Content-Type: {kind}"]
            head.append(f"Content-Length: {declared}")
            if authorization:
                head.append(f"Authorization: {authorization}")
            with connect(gateway) as sock:
                sock.sendall(("\r\n".join(head) + "\r\n\r\n-").encode())
                raw, after = until_closed(sock)  # (no more of the body is sent)
            assert after < SLACK_SECONDS, (path, after)
            refusal = parse(raw)
            assert refusal.status == 401, (path, raw)
            assert refusal.headers["connection"] == "close"
            assert refusal.headers["www-authenticate"] == "Bearer"
            if path == "/v1/sessions":
                assert refusal.error()["type"] == "Unauthorized"
            else:  # an OpenAI route: OpenAI's form, as its client expects
                assert openai_error(refusal)["code"] == "invalid_api_key"
    assert spooled(gateway) == []


def test_an_upload_that_stops_coming_is_408_and_stores_nothing(
    gateway: Gateway, tenant: Tenant
) -> None:
    head, body = upload(tenant.token, b'{"custom_id": "one"}\n' * 100)
    with connect(gateway) as sock:
        sock.sendall(head + body[: len(body) // 2])
        raw, after = until_closed(sock)
    assert after < BODY_TIMEOUT + SLACK_SECONDS, after
    refusal = parse(raw)
    assert refusal.status == 408 and refusal.headers["connection"] == "close", raw
    error = openai_error(refusal)
    assert error["code"] == "request_timeout"
    assert "PARLEY_GATEWAY_UPLOAD_RATE" in error["message"]
    assert spooled(gateway) == []


def test_an_upload_has_as_long_as_its_size_takes_at_the_upload_rate(
    gateway: Gateway, tenant: Tenant
) -> None:
    data = b"".join(
        json.dumps({"custom_id": f"n{n}", "body": {"input": "x" * 80}}).encode() + b"\n"
        for n in range(5000)
    )
    head, body = upload(tenant.token, data)
    deadline = len(body) / UPLOAD_RATE
    assert deadline > 2 * BODY_TIMEOUT  # (else this shows nothing)
    # At twice the rate, in pieces, it arrives well within its deadline: past the
    # body's one second, which a flat deadline would have cut it at.
    started = time.monotonic()
    with connect(gateway) as sock:
        sock.sendall(head)
        pieces = 8
        for number in range(pieces):
            sock.sendall(body[number * len(body) // pieces : (number + 1) * len(body) // pieces])
            time.sleep(deadline / 2 / pieces)
        answer = read_answer(sock)
    assert time.monotonic() - started > BODY_TIMEOUT
    assert answer.status == 200, answer
    assert json.loads(answer.body)["bytes"] == len(data)
    # Half of it, and then nothing: refused at its own deadline, not at the body's.
    with connect(gateway) as sock:
        sock.sendall(head + body[: len(body) // 2])
        raw, after = until_closed(sock)
    assert deadline - 0.5 < after < deadline + SLACK_SECONDS, (deadline, after)
    assert parse(raw).status == 408
    assert spooled(gateway) == []


def test_uploads_in_flight_are_bounded_in_all_and_per_tenant(
    gateway: Gateway, tenant: Tenant
) -> None:
    other = gateway.tenant()
    big = b'{"custom_id": "big"}\n' * (1_400_000 // 21)
    # Each declares 1.4 MB: at the upload rate, 7 s to arrive, which they hold.
    first, second = connect(gateway), connect(gateway)
    try:
        for sock in (first, second):
            head, body = upload(tenant.token, big)
            sock.sendall(head + body[:1000])
        # The tenant's third is past TENANT_UPLOADS (however small).
        head, body = upload(tenant.token, b"{}\n")
        with connect(gateway) as third:
            third.sendall(head)
            refusal = parse(until_closed(third)[0])
        assert refusal.status == 429 and refusal.headers["retry-after"] == "5", refusal
        assert "PARLEY_GATEWAY_TENANT_UPLOADS" in openai_error(refusal)["message"]
        # Another tenant's as large would take the spool past UPLOAD_SPOOL...
        head, body = upload(other.token, big)
        with connect(gateway) as fourth:
            fourth.sendall(head)
            refusal = parse(until_closed(fourth)[0])
        assert refusal.status == 503 and refusal.headers["retry-after"] == "5", refusal
        error = openai_error(refusal)
        assert error["type"] == "server_error" and "PARLEY_GATEWAY_UPLOAD_SPOOL" in error["message"]
        # ...and a small one fits.
        small = other.http.post(
            "/v1/files", files={"file": ("s.jsonl", b"{}\n")}, data={"purpose": "batch"}
        )
        assert small.status_code == 200, small.text
    finally:
        first.close()
        second.close()
    # Gone, the two give their room back (once the gateway has seen them go).
    head, body = upload(other.token, big)

    def sent_whole() -> RawAnswer | None:
        try:
            with connect(gateway) as sock:
                sock.sendall(head + body)
                answer = read_answer(sock)
        except OSError:  # refused, and closed while the body was still going
            return None
        return answer if answer.status == 200 else None

    assert wait_until(sent_whole, what="the spool's room back").status == 200
    assert spooled(gateway) == []


def held_open(gateway: Gateway, source: str) -> socket.socket:
    """A keep-alive connection from ``source`` that has been answered once."""
    sock = connect(gateway, source)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")
    assert read_answer(sock).status == 200
    return sock


def answered(gateway: Gateway, source: str) -> RawAnswer:
    """What a request on a new connection from ``source`` gets (then it is closed)."""
    with connect(gateway, source) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
        raw, _ = until_closed(sock)
    return parse(raw)


def test_connections_are_capped_per_address_and_in_all(capped: Gateway) -> None:
    # Loopback has many addresses: each is a client of its own.
    mine = [held_open(capped, "127.0.0.1") for _ in range(CLIENT_CONNECTIONS)]
    try:
        answer = answered(capped, "127.0.0.1")
        assert answer.status == 429 and answer.headers["retry-after"] == "1", answer
        assert answer.headers["connection"] == "close"
        error = answer.error()
        assert error["type"] == "TooManyRequests"
        assert "PARLEY_GATEWAY_CLIENT_CONNECTIONS" in error["message"]
        # One past the cap that says nothing is not kept for the head's deadline (10 s).
        with connect(capped, "127.0.0.1") as silent:
            raw, after = until_closed(silent)
        assert raw == b"" and after < 1 + SLACK_SECONDS, after
        others = [held_open(capped, "127.0.0.2") for _ in range(CONNECTIONS - CLIENT_CONNECTIONS)]
        full = answered(capped, "127.0.0.3")
        assert full.status == 503 and full.headers["retry-after"] == "1", full
        assert full.error()["type"] == "Unavailable"
        assert "PARLEY_GATEWAY_CONNECTIONS" in full.error()["message"]
        # A connection closed gives its place back (once the gateway has seen it close).
        mine.pop().close()
        again = wait_until(
            lambda: (answer := answered(capped, "127.0.0.1")).status == 200 and answer,
            what="a place for 127.0.0.1",
        )
        assert json.loads(again.body)["status"] == "ok"
        for sock in others:
            sock.close()
    finally:
        for sock in mine:
            sock.close()


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
