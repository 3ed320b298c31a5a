"""The HTTP gateway on a fleet under failure, with real processes: a worker killed with
SIGKILL while a browser-like reader follows the turn over SSE, the reader moving to a
second gateway (or its gateway killed under it), fifty readers of one turn through one
gateway (one Redis reader between them), a reader that reads nothing for a while, and
a submission that says it streams (its feed, started with it, gives the stream all).

The module shares one database, Redis database and fleet (two workers, the sweeper and
two `parley gateway` processes); a test that kills a process gets a fresh one back."""

from __future__ import annotations

import asyncio
import fcntl
import http.client
import os
import signal
import socket
import struct
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import parley
from parley.schemas.events import Event, EventKind
from tests.support.databases import fresh_postgres_database
from tests.support.events import assert_once_in_order, displayed_text
from tests.support.fleet import Fleet, flush_redis
from tests.support.gateway import TENANT, TOKEN, Gateway, start_fleet_gateway
from tests.support.helpers import Control
from tests.support.sse import FrameParser, Reader
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

REDIS_URL = os.environ.get("PARLEY_TEST_CHAOS_REDIS_URL", "redis://127.0.0.1:6379/10")
STREAMED = "".join(f"w{i:03d} " for i in range(150))  # 150 chunks, 20 ms apart: 3 s a try
GATED_TEXT = "".join(f"g{i:03d} " for i in range(200))
# 4 MB in 4000 tokens, 1 ms apart: with the committed step's and the end's copies over
# 8 MB of SSE, more than the kernel's send buffer (at most 4 MB here) can hold for a
# reader that reads nothing, so the rest waits in the gateway.
LONG_TEXT = "".join(f"{i:05d}" + "-" * 995 for i in range(4000))
RULES = [
    {
        "when": "^stream",
        "steps": [
            {"tool_calls": [{"name": "list_files"}]},
            {"text": STREAMED, "chunk_chars": 5, "delay_ms": 20},
        ],
    },
    {
        "when": "^gated",
        "steps": [
            {"tool_calls": [{"name": "wait_for_gate"}]},
            {"text": GATED_TEXT, "chunk_chars": 5, "delay_ms": 5},
        ],
    },
    {
        "when": "^long",
        "steps": [
            {"tool_calls": [{"name": "wait_for_gate"}]},
            {"text": LONG_TEXT, "chunk_chars": 1000, "delay_ms": 1},
        ],
    },
]


class GatewayFleet:
    """Two workers, the sweeper and two gateways on one database and Redis database,
    and a Python fleet client of the same fleet (to read the truth beside the HTTP)."""

    def __init__(self, database_url: str, tmp: Path) -> None:
        self.workspaces = tmp / "workspaces"
        self.fleet = Fleet(database_url=database_url, redis_url=REDIS_URL, log_dir=tmp)
        self.workers = [self.fleet.start_worker() for _ in range(2)]
        self.fleet.start_beat()
        self.fleet.wait_ready()
        self.gateways = [start_fleet_gateway(self.fleet, self.workspaces) for _ in range(2)]
        # Sessions' roots are <workspaces>/alpha/x: the host reads its script beside them.
        self.control = Control(self.workspaces / TENANT / "x")
        self.control.script(RULES)
        self.client = parley.connect(database_url, redis_url=REDIS_URL, queue=self.fleet.queue)

    def replenish(self) -> None:
        """A fresh worker for each killed one, a fresh gateway for each killed one."""
        # (A dead process stays in the fleet's list, so that log names stay unique.)
        for n, worker in enumerate(self.workers):
            if worker.poll() is not None:
                self.workers[n] = self.fleet.start_worker()
                log = self.fleet.log_of(self.workers[n])

                def ready(log: Path = log) -> bool:
                    return b"ready." in log.read_bytes()

                wait_until(ready, what="a new worker")
        for n, gateway in enumerate(self.gateways):
            if gateway.process.poll() is not None:
                gateway.stop()  # (its HTTP clients)
                self.gateways[n] = start_fleet_gateway(self.fleet, self.workspaces)

    def kill_driver(self, turn_id: str) -> int:
        """SIGKILL the whole `parley worker` (process group) whose process drives the
        turn now; the pid of that process."""
        worker = self.client.store.run_state(turn_id).worker
        assert worker is not None
        pid = int(worker.split(":")[1])
        group = os.getpgid(pid)
        victim = next(w for w in self.workers if w.pid == group)
        os.killpg(group, signal.SIGKILL)
        victim.wait(10)
        return pid

    def stored_events(self, turn_id: str) -> list[Event]:
        """What the Python fleet client reads of the turn from the start, now."""
        return list(self.client.attach(turn_id).events())

    def close(self) -> None:
        self.client.close()
        for gateway in self.gateways:
            gateway.stop()
        self.fleet.stop()


@pytest.fixture(scope="module")
def fleet_with_gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFleet]:
    with fresh_postgres_database("gateway") as url:
        flush_redis(REDIS_URL)
        harness = GatewayFleet(url, tmp_path_factory.mktemp("gateway-fleet"))
        try:
            yield harness
        finally:
            harness.close()


@pytest.fixture
def gwf(fleet_with_gateways: GatewayFleet) -> Iterator[GatewayFleet]:
    fleet_with_gateways.replenish()
    fleet_with_gateways.control.reset_gate()
    yield fleet_with_gateways
    fleet_with_gateways.control.open_gate()  # a failed test must not leave a turn waiting


def start_turn(gateway: Gateway, prompt: str) -> str:
    """A turn of a new session of the gateway's tenant (in ``workspaces/alpha/x``): its id."""
    alpha = gateway.tenant(TENANT)
    turn: dict[str, Any] = alpha.submit(alpha.new_session(workspace="x")["id"], prompt)
    return str(turn["turn_id"])


def is_step_token(event: Event, step: int) -> bool:
    return event.kind is EventKind.TOKEN and event.data["step"] == step


def assert_taken_over_and_whole(
    gwf: GatewayFleet, gateway: Gateway, turn_id: str, seen: list[Event], victim: int
) -> None:
    """What a reader that followed a turn through its worker's death must have seen:
    each event once and in order, both attempts, the restart announced after the dead
    attempt's tokens and before the new ones, the committed reply as displayed text, and
    exactly what the Python client reads of the turn."""
    assert_once_in_order(seen)
    assert seen[-1].kind is EventKind.END
    kinds = [e.kind for e in seen]
    assert [e.data["attempt"] for e in seen if e.kind is EventKind.STARTED] == [1, 2]
    restarted = kinds.index(EventKind.STEP_RESTARTED)
    assert seen[restarted].data == {"index": 1, "reason": "resumed"}
    assert any(is_step_token(e, 1) for e in seen[:restarted]), "no token before the kill"
    assert any(is_step_token(e, 1) for e in seen[restarted:]), "no token after the restart"
    finished = gateway.tenant(TENANT).result(turn_id, wait=60)
    assert finished["status"] == "finished"
    assert finished["reply"] == STREAMED
    assert displayed_text(seen) == finished["reply"]  # tokens shown, replaced on restart
    assert [e.to_json() for e in seen] == [e.to_json() for e in gwf.stored_events(turn_id)]
    state = gwf.client.store.run_state(turn_id)
    assert state.attempts == 2
    assert state.worker is not None and int(state.worker.split(":")[1]) != victim
    assert [s.index for s in gwf.client.store.steps_of(turn_id)] == [0, 1]


# ---------------------------------------------------------------- a. a worker dies


def test_a_sse_reader_follows_a_turn_through_its_workers_death(gwf: GatewayFleet) -> None:
    gateway = gwf.gateways[0]
    turn_id = start_turn(gateway, "stream through a crash")
    reader = Reader(turn_id, TOKEN)
    following = threading.Thread(
        target=reader.follow, args=([gateway.url],), kwargs={"deadline": time.monotonic() + 90}
    )
    following.start()
    wait_until(lambda: any(is_step_token(e, 1) for e in reader.events), what="step 1's tokens")
    victim = gwf.kill_driver(turn_id)
    following.join(90)
    assert not following.is_alive()
    assert_taken_over_and_whole(gwf, gateway, turn_id, reader.events, victim)


# ---------------------------------------------------------------- b. another gateway


@pytest.mark.parametrize("leaving", ["closes-the-stream", "gateway-killed"])
def test_b_a_reader_moves_to_another_gateway_mid_turn(gwf: GatewayFleet, leaving: str) -> None:
    first, second = gwf.gateways
    turn_id = start_turn(first, "stream through a crash")
    reader = Reader(turn_id, TOKEN)
    victim = 0
    redone = 0

    def until(event: Event) -> bool:
        nonlocal victim, redone
        if victim == 0 and is_step_token(event, 1):
            victim = gwf.kill_driver(turn_id)  # mid-stream, with the reader connected
        if EventKind.STEP_RESTARTED in {e.kind for e in reader.events} and is_step_token(event, 1):
            redone += 1
        if redone < 5:
            return False
        if leaving == "gateway-killed":
            first.kill()  # the reader learns of it from its socket
            return False
        return True  # it closes the stream itself

    assert not reader.read(first.url, until=until)
    on_first = len(reader.events)
    assert reader.drops == (1 if leaving == "gateway-killed" else 0)
    assert reader.read(second.url), "the second gateway's stream ended before the end"
    assert reader.connections == 2
    assert reader.origins == [first.url] * on_first + [second.url] * (len(reader.events) - on_first)
    assert reader.events[on_first].seq > reader.events[on_first - 1].seq
    assert_taken_over_and_whole(gwf, second, turn_id, reader.events, victim)


# ---------------------------------------------------------------- c. one reader


async def read_stream(http: httpx.AsyncClient, url: str, into: list[Event]) -> None:
    """One subscriber: every event of the stream, to its end."""
    parser = FrameParser()
    async with http.stream("GET", url, headers={"Authorization": f"Bearer {TOKEN}"}) as answer:
        assert answer.status_code == 200
        async for line in answer.aiter_lines():
            frame = parser.feed(line)
            if frame is not None:
                into.append(frame.event)
                if frame.event.kind is EventKind.END:
                    return


def test_c_fifty_subscribers_of_one_turn_share_one_redis_reader(gwf: GatewayFleet) -> None:
    subscribers = 50
    gateway = start_fleet_gateway(gwf.fleet, gwf.workspaces)  # a fresh process: nothing else read
    turn_id = start_turn(gateway, "gated, then stream")
    gwf.control.wait_entered()
    url = f"{gateway.url}/v1/turns/{turn_id}/events"
    seen: list[list[Event]] = [[] for _ in range(subscribers)]
    readers: list[tuple[int, int]] = []

    def sample() -> None:
        readers.append(gateway.redis_readers(REDIS_URL))

    async def scenario() -> None:
        limits = httpx.Limits(max_connections=subscribers)
        async with httpx.AsyncClient(limits=limits, timeout=60) as http:
            tasks = [asyncio.create_task(read_stream(http, url, into)) for into in seen]
            while not all(any(e.kind is EventKind.TOOL_CALL for e in s) for s in seen):
                await asyncio.sleep(0.01)
            for _ in range(40):  # waiting at the gate: 1 s of samples
                sample()
                await asyncio.sleep(0.025)
            gwf.control.open_gate()
            while not all(task.done() for task in tasks):
                sample()
                await asyncio.sleep(0.025)
            await asyncio.gather(*tasks)

    asyncio.run(scenario())
    truth = [e.to_json() for e in gwf.stored_events(turn_id)]
    # A second of tokens: the workers' flusher sends a turn's deltas once per 50 ms
    # (PARLEY_STREAM_FLUSH_SECONDS), so some twenty token events.
    assert truth[-1]["kind"] == "end" and len(truth) > 20
    for events in seen:
        assert [e.to_json() for e in events] == truth
    # One Redis reader for the whole turn, whatever the number of subscribers, counted
    # from outside the process: one connection of the gateway ever sent XREAD (the pool
    # they come from grows only while reads overlap), and it blocks in it most of the time.
    assert max(reading for reading, _ in readers) == 1
    blocked = [blocked for _, blocked in readers]
    assert max(blocked) == 1 and blocked.count(1) > len(blocked) // 2
    gateway.stop()


# ---------------------------------------------------------------- d. a slow reader


def fionread(sock: socket.socket) -> int:
    """Bytes waiting in the socket's receive buffer."""
    raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, struct.pack("i", 0))
    value: int = struct.unpack("i", raw)[0]
    return value


def test_d_a_subscriber_that_reads_nothing_holds_up_no_one(gwf: GatewayFleet) -> None:
    gateway = gwf.gateways[0]
    turn_id = start_turn(gateway, "long, at the gate")
    gwf.control.wait_entered()
    path = f"/v1/turns/{turn_id}/events"

    # The slow one: a socket with a small receive buffer, its request sent, its
    # response's headers read, and then nothing read at all for a while.
    slow_sock = socket.socket()
    slow_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = gateway.url.removeprefix("http://").split(":")
    slow_sock.connect((host, int(port)))
    slow = http.client.HTTPConnection(host, int(port), timeout=60)
    slow.sock = slow_sock
    slow.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
    slow_answer = slow.getresponse()
    assert slow_answer.status == 200

    # Beside it: a Python fleet client reading Redis directly, and three SSE readers.
    direct: dict[int, float] = {}

    def read_directly() -> None:
        for event in gwf.client.attach(turn_id).events():
            direct[event.seq] = time.monotonic()

    direct_thread = threading.Thread(target=read_directly)
    direct_thread.start()
    fast: list[list[Event]] = [[], [], []]
    received: list[dict[int, float]] = [{}, {}, {}]

    async def read_fast(http: httpx.AsyncClient, n: int) -> None:
        parser = FrameParser()
        async with http.stream(
            "GET", f"{gateway.url}{path}", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as answer:
            async for line in answer.aiter_lines():
                frame = parser.feed(line)
                if frame is not None:
                    received[n][frame.event.seq] = time.monotonic()
                    fast[n].append(frame.event)
                    if frame.event.kind is EventKind.END:
                        return

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            tasks = [asyncio.create_task(read_fast(http, n)) for n in range(3)]
            while not all(any(e.kind is EventKind.TOOL_CALL for e in f) for f in fast):
                await asyncio.sleep(0.01)
            gwf.control.open_gate()
            _, late = await asyncio.wait(tasks, timeout=30)  # some 5 s when all is well
            for task in late:
                task.cancel()
            assert not late, f"{len(late)} of the fast readers were held up past 30 s"
            await asyncio.gather(*tasks)

    asyncio.run(scenario())
    direct_thread.join(30)
    assert gwf.client.store.run_state(turn_id).status is parley.TurnStatus.FINISHED
    # By now the slow reader's socket holds what its small buffer takes, the gateway's
    # kernel send queue what it takes (at most 4 MB), and the rest waits in the gateway.
    held_by_reader = fionread(slow_sock) + 8192  # (and what http.client buffered)
    held_by_kernel = gateway.send_queue(slow_sock.getsockname()[1])

    truth = [e.to_json() for e in gwf.stored_events(turn_id)]
    assert truth[-1]["kind"] == "end"
    for events in fast:
        assert [e.to_json() for e in events] == truth
    # Each fast reader had every event within a second of a reader of Redis itself.
    lags = sorted(r[seq] - direct[seq] for r in received for seq in r)
    median = lags[len(lags) // 2]
    assert lags[-1] < 1.0, f"a fast reader lagged {lags[-1]:.3f} s (median {median:.4f} s)"

    time.sleep(1)  # and the slow one still reads nothing
    slow_events: list[Event] = []
    parser = FrameParser()
    total = 0
    while not slow_events or slow_events[-1].kind is not EventKind.END:
        raw = slow_answer.readline()
        assert raw, "the slow reader's stream closed before its end"
        total += len(raw)
        frame = parser.feed(raw.decode().rstrip("\r\n"))  # CRLF, LF or CR
        if frame is not None:
            slow_events.append(frame.event)
    slow.close()
    assert [e.to_json() for e in slow_events] == truth  # late, but whole and in order
    # It really was behind, in the gateway itself: more than a megabyte of its stream was
    # in neither socket while the others read to the end.
    in_gateway = total - held_by_reader - held_by_kernel
    assert in_gateway > 1 << 20, (total, held_by_reader, held_by_kernel)


# ---------------------------------------------------------------- e. a streamed submission


@pytest.mark.parametrize("pause", [0.0, 1.0])
def test_e_a_streamed_submissions_feed_on_redis_gives_its_stream_every_event(
    gwf: GatewayFleet, pause: float
) -> None:
    # Prefer: stream starts the turn's feed with the submission (reading Redis); the
    # stream that comes at once, or a second into the turn, gets it all from seq 1, and
    # so does a reader through the other gateway, which started no feed of it.
    submitting, other = gwf.gateways
    alpha = submitting.tenant(TENANT)
    session = alpha.new_session(workspace="x")["id"]
    answer = alpha.json(
        "POST", f"/v1/sessions/{session}/turns", {"prompt": "stream"}, headers={"Prefer": "stream"}
    )
    assert answer.status_code == 202, answer.text
    assert answer.headers["Preference-Applied"] == "stream"
    turn_id = answer.json()["turn_id"]
    time.sleep(pause)
    seen = alpha.event_json(turn_id)
    truth = [e.to_json() for e in gwf.stored_events(turn_id)]
    assert seen[0]["seq"] == 1 and seen[-1]["kind"] == "end"
    assert seen == truth
    assert other.tenant(TENANT).event_json(turn_id) == truth
