"""Gateway benchmark: the HTTP gateway beside the Python fleet client, on one fleet, in
one run, figures beside their floor.

    .venv/bin/python -m tests.bench.gateway [--readers 1000] [--turns 200] [--other CHECKOUT]

Needs the machine's PostgreSQL and Redis (Redis database 13, PARLEY_BENCH_REDIS_URL, is
flushed).  Starts two single-process `parley worker`s and `parley beat` (as
tests.bench.fleet does) and `parley gateway` processes on them:

i.   submit → first token: over HTTP (``POST /v1/sessions/{id}/turns`` with ``Prefer:
     stream``, then ``GET /v1/turns/{id}/events`` to the first ``token`` frame, on two
     kept-alive connections of a minimal client written on sockets, so that what is measured is
     the gateway rather than an HTTP library), alternating turn by turn with the Python
     fleet client's ``session.submit`` + ``handle.events()``: the floor;
ii.  200 one-step turns over 50 sessions, submitted over HTTP 50 at a time and waited
     for with ``GET /v1/turns/{id}/result?wait=60``, beside the same through the Python
     client (submit all, then ``wait`` each): from 50 kept-alive connections of a client
     on asyncio streams, and again from httpx (async, 50 connections), whose own CPU
     per turn is printed beside it;
iii. one slow turn followed by N concurrent SSE readers through one fresh gateway
     process: every reader gets every event; the delay from a token's arrival at a
     direct reader of Redis (the Python client in a process of its own: about when it
     was published) to its receipt by the first and the last SSE reader; the gateway's
     CPU during the turn; its memory per idle connection (RSS with N connections idle
     on a queued turn, minus RSS with none, over N); its Redis readers for the turn.

``--other CHECKOUT`` (a ``git worktree`` of the code before a change) runs a second
gateway from that checkout on the same fleet, turn for turn beside the first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import uvloop

import parley
from parley.schemas.events import EventKind
from tests.bench.common import ms, pct, start_scripted_fleet
from tests.bench.connections import AsyncConnection, Connection
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import REPO, flush_redis
from tests.support.gateway import TENANT, Gateway, start_fleet_gateway

REDIS_URL = os.environ.get("PARLEY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
TEXT = "".join(f"t{i:02d}" for i in range(70))  # 70 chunks of 3 characters
FAN_TEXT = "".join(f"f{i:03d} " for i in range(200))  # 200 tokens, 25 ms apart: 5 s
RULES = [
    {"when": "^one", "steps": [{"text": TEXT, "chunk_chars": 3}]},
    # Holds its session (and a worker) until interrupted, so the next turn stays queued.
    {"when": "^hold", "steps": [{"text": "h" * 6000, "chunk_chars": 1, "delay_ms": 10}]},
    {"when": "^fan", "steps": [{"text": FAN_TEXT, "chunk_chars": 5, "delay_ms": 25}]},
]


# ---------------------------------------------------------------- i. first token


def python_first_token(client: parley.Client, root: Path) -> tuple[float, float]:
    """When ``submit`` returned and when the first token came, from the submission."""
    session = client.open_session(root)
    start = time.perf_counter()
    handle = session.submit("one step")
    answered = time.perf_counter() - start
    first = None
    for event in handle.events():
        if first is None and event.kind is EventKind.TOKEN:
            first = time.perf_counter() - start
    assert first is not None
    return answered, first


def http_first_token(calls: Connection, streams: Connection) -> tuple[float, float]:
    """When the submission was answered and when the first token came, from the
    submission."""
    session = calls.json("POST", "/v1/sessions", {"workspace": "w"})
    start = time.perf_counter()
    path = f"/v1/sessions/{session['id']}/turns"
    # Says that its stream follows: the gateway starts following the turn with it.
    turn = calls.json("POST", path, {"prompt": "one step"}, "Prefer: stream\r\n")
    answered = time.perf_counter() - start
    return answered, streams.first_token(turn["turn_id"]) - start


def first_tokens(
    client: parley.Client, root: Path, gateways: dict[str, Gateway], count: int
) -> dict[str, list[tuple[float, float]]]:
    """The Python client's (``python``) and each gateway's (when the submission was
    answered, when the first token came), alternating turn by turn, so that every side
    sees the same machine."""
    connections = {name: (Connection(g), Connection(g)) for name, g in gateways.items()}
    try:
        samples: dict[str, list[tuple[float, float]]] = {
            "python": [],
            **{name: [] for name in gateways},
        }
        names = list(connections)
        for n in range(count):
            samples["python"].append(python_first_token(client, root))
            # The gateways take turns at going first after the floor's turn (which leaves
            # the machine busier for the one just after it).
            for name in names[n % len(names) :] + names[: n % len(names)]:
                calls, streams = connections[name]
                samples[name].append(http_first_token(calls, streams))
        return samples
    finally:
        for calls, streams in connections.values():
            calls.close()
            streams.close()


# ---------------------------------------------------------------- ii. throughput


def python_throughput(client: parley.Client, root: Path, turns: int) -> float:
    sessions = [client.open_session(root) for _ in range(50)]
    start = time.perf_counter()
    handles = [s.submit(f"one of many {n}") for n in range(turns // 50) for s in sessions]
    for handle in handles:
        assert handle.wait(120).outcome is parley.TurnStatus.FINISHED
    return len(handles) / (time.perf_counter() - start)


async def http_throughput(gateway: Gateway, turns: int) -> float:
    limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
    async with httpx.AsyncClient(
        base_url=gateway.url, headers=gateway.headers, limits=limits, timeout=90
    ) as http:
        gate = asyncio.Semaphore(50)

        async def open_one() -> str:
            answer = await http.post("/v1/sessions", json={"workspace": "w"})
            session_id: str = answer.json()["id"]
            return session_id

        async def submit(session_id: str, n: int) -> str:
            async with gate:
                answer = await http.post(
                    f"/v1/sessions/{session_id}/turns", json={"prompt": f"one of many {n}"}
                )
            assert answer.status_code == 202, answer.text
            turn_id: str = answer.json()["turn_id"]
            return turn_id

        async def wait(turn_id: str) -> None:
            async with gate:
                answer = await http.get(f"/v1/turns/{turn_id}/result", params={"wait": 60})
            assert answer.status_code == 200 and answer.json()["status"] == "finished"

        sessions = await asyncio.gather(*(open_one() for _ in range(50)))
        start = time.perf_counter()
        ids = await asyncio.gather(*(submit(s, n) for n in range(turns // 50) for s in sessions))
        await asyncio.gather(*(wait(t) for t in ids))
        return len(ids) / (time.perf_counter() - start)


async def raw_throughput(gateway: Gateway, turns: int) -> float:
    """The same as :func:`http_throughput`, from 50 connections of a client on sockets."""
    connections = [AsyncConnection(gateway) for _ in range(50)]
    try:
        sessions = [
            (await c.json("POST", "/v1/sessions", {"workspace": "w"}))[1]["id"] for c in connections
        ]
        start = time.perf_counter()

        async def submit(n: int, connection: AsyncConnection, session_id: str) -> str:
            status, turn = await connection.json(
                "POST", f"/v1/sessions/{session_id}/turns", {"prompt": f"one of many {n}"}
            )
            assert status == 202, turn
            turn_id: str = turn["turn_id"]
            return turn_id

        ids: list[str] = []
        for n in range(turns // 50):
            ids += await asyncio.gather(
                *(submit(n, c, s) for c, s in zip(connections, sessions, strict=True))
            )

        async def wait(connection: AsyncConnection, mine: list[str]) -> None:
            for turn_id in mine:
                status, turn = await connection.json("GET", f"/v1/turns/{turn_id}/result?wait=60")
                assert status == 200 and turn["status"] == "finished", turn

        await asyncio.gather(*(wait(c, ids[n::50]) for n, c in enumerate(connections)))
        return len(ids) / (time.perf_counter() - start)
    finally:
        for connection in connections:
            connection.close()


# ---------------------------------------------------------------- iii. fan-out

SEQ = re.compile(rb"^id: (\d+)", re.M)

DIRECT_READER = """
import json, sys, time, parley
client = parley.connect(sys.argv[1], redis_url=sys.argv[2])
print("ready", flush=True)
received = {}
for event in client.attach(sys.argv[3]).events():
    received[event.seq] = time.monotonic()
print(json.dumps(received), flush=True)
"""


class FanReader:
    """One SSE reader: the seqs it received and when (monotonic, per read)."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.times: list[float] = []
        self.done = False

    async def read(self, gateway: Gateway, turn_id: str) -> None:
        host, port = gateway.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"GET /v1/turns/{turn_id}/events HTTP/1.1\r\nHost: gateway\r\n"
            f"Authorization: Bearer {gateway.token}\r\n\r\n".encode()
        )
        tail = b""
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    raise ConnectionError("the gateway closed a stream before its end")
                now = time.monotonic()
                data = tail + data
                cut = data.rfind(b"\n") + 1
                complete, tail = data[:cut], data[cut:]
                for found in SEQ.finditer(complete):
                    self.seqs.append(int(found.group(1)))
                    self.times.append(now)
                if b"event: end" in complete:
                    self.done = True
                    return
        finally:
            writer.close()


def fan_out(
    gateway: Gateway, fleet_client: parley.Client, database_url: str, readers: int
) -> dict[str, Any]:
    """The fan-out figures (see the module docstring)."""
    calls = Connection(gateway)
    try:
        # Warm the gateway's paths (a submission, a stream to its end) before measuring.
        streams = Connection(gateway)
        http_first_token(calls, streams)
        streams.close()
        session = calls.json("POST", "/v1/sessions", {"workspace": "w"})["id"]
        path = f"/v1/sessions/{session}/turns"
        hold = calls.json("POST", path, {"prompt": "hold the session"})["turn_id"]
        fan = calls.json("POST", path, {"prompt": "fan out"})["turn_id"]
        assert calls.json("GET", f"/v1/turns/{fan}")["status"] == "queued"
        gateway_seen_before = gateway.redis_readers(REDIS_URL)
        time.sleep(1)
        rss_none = gateway.rss()

        direct = subprocess.Popen(
            [sys.executable, "-c", DIRECT_READER, database_url, REDIS_URL, fan],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=REPO,
        )
        assert direct.stdout is not None
        assert direct.stdout.readline().strip() == b"ready"

        async def scenario() -> dict[str, Any]:
            fans = [FanReader() for _ in range(readers)]
            tasks = []
            for n, fan_reader in enumerate(fans):
                tasks.append(asyncio.create_task(fan_reader.read(gateway, fan)))
                if n % 100 == 99:
                    await asyncio.sleep(0.05)  # connect in waves, not one SYN flood
            while not all(f.seqs for f in fans):  # each has its `queued`: idle now
                await asyncio.sleep(0.05)
            await asyncio.sleep(1)
            rss_idle = gateway.rss()
            idle_readers = gateway.redis_readers(REDIS_URL)
            cpu_before = gateway.cpu_seconds()
            own_before = time.process_time()
            calls.json("POST", f"/v1/turns/{hold}/interrupt")
            samples = []
            while not all(task.done() for task in tasks):
                samples.append(gateway.redis_readers(REDIS_URL))
                await asyncio.sleep(0.1)
            cpu = gateway.cpu_seconds() - cpu_before
            own = time.process_time() - own_before
            for task in tasks:
                task.result()
            return {
                "fans": fans,
                "rss_idle": rss_idle,
                "idle_readers": idle_readers,
                "samples": samples,
                "cpu": cpu,
                "own": own,
            }

        figures = uvloop.run(scenario())
        out, _ = direct.communicate(timeout=60)
        arrived = {int(seq): at for seq, at in json.loads(out).items()}
    finally:
        calls.close()

    truth = list(fleet_client.attach(fan).events())
    fans: list[FanReader] = figures["fans"]
    complete = sum(f.seqs == [e.seq for e in truth] for f in fans)
    tokens = [e.seq for e in truth if e.kind is EventKind.TOKEN]
    at: dict[int, list[float]] = {seq: [] for seq in tokens}
    for fan_reader in fans:
        for seq, when in zip(fan_reader.seqs, fan_reader.times, strict=True):
            if seq in at:
                at[seq].append(when)
    first = [min(at[s]) - arrived[s] for s in tokens]
    last = [max(at[s]) - arrived[s] for s in tokens]
    spread = [max(at[s]) - min(at[s]) for s in tokens]
    return {
        "readers": readers,
        "complete": complete,
        "events": len(truth),
        "tokens": len(tokens),
        "first": first,
        "last": last,
        "spread": spread,
        "cpu": figures["cpu"],
        "own": figures["own"],
        "duration": arrived[truth[-1].seq] - arrived[truth[1].seq],
        "rss_none": rss_none,
        "rss_idle": figures["rss_idle"],
        "readers_before": gateway_seen_before,
        "readers_idle": figures["idle_readers"],
        "readers_max": max(max(r for r, _ in figures["samples"]), figures["idle_readers"][0]),
        "blocked_max": max(b for _, b in figures["samples"]),
    }


# ---------------------------------------------------------------- main


def raise_file_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=200, help="a multiple of 50")
    parser.add_argument("--latency-turns", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2, help="throughput runs per side")
    parser.add_argument(
        "--other",
        type=Path,
        help="a second checkout (a git worktree of the code before a change): its gateway "
        "runs beside this one's, turn for turn",
    )
    parser.add_argument("--parts", default="i,ii,iii", help="which parts to run")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    raise_file_limit(args.readers * 2 + 1000)  # the gateway inherits it
    flush_redis(REDIS_URL)
    load_before = os.getloadavg()
    with fresh_postgres_database("bench") as database_url, tempfile.TemporaryDirectory() as tmp:
        fleet, root = start_scripted_fleet(database_url, REDIS_URL, Path(tmp), RULES)
        workspaces = Path(tmp) / "workspaces"
        checkouts = {"HTTP": REPO}
        if args.other:
            checkouts["HTTP other"] = args.other.resolve()
        gateways = {
            name: start_fleet_gateway(fleet, workspaces, checkout=c)
            for name, c in checkouts.items()
        }
        (workspaces / TENANT / "w").mkdir(parents=True, exist_ok=True)
        client = parley.connect(database_url, redis_url=REDIS_URL, queue=fleet.queue)
        first: dict[str, list[tuple[float, float]]] = {}
        sides = [side for name in gateways for side in (name, f"{name} httpx")]
        rates: dict[str, list[float]] = {"python": [], **{side: [] for side in sides}}
        cpu: dict[str, list[float]] = {side: [] for side in sides}
        clients: dict[str, list[float]] = {"python": [], **{side: [] for side in sides}}
        fans: dict[str, dict[str, Any]] = {}
        try:
            if "i" in parts:
                first_tokens(client, root, gateways, 20)  # warm up every path and worker
                first = first_tokens(client, root, gateways, args.latency_turns)
            if "ii" in parts:
                for _ in range(args.rounds):
                    own = time.process_time()
                    rates["python"].append(python_throughput(client, root, args.turns))
                    clients["python"].append((time.process_time() - own) / args.turns)
                    for name, gateway in gateways.items():
                        for side, run in (
                            (name, raw_throughput),
                            (f"{name} httpx", http_throughput),
                        ):
                            before, own = gateway.cpu_seconds(), time.process_time()
                            rates[side].append(uvloop.run(run(gateway, args.turns)))
                            cpu[side].append((gateway.cpu_seconds() - before) / args.turns)
                            clients[side].append((time.process_time() - own) / args.turns)
            if "iii" in parts:
                for name, c in checkouts.items():
                    fan_gateway = start_fleet_gateway(fleet, workspaces, checkout=c)
                    fans[name] = fan_out(fan_gateway, client, database_url, args.readers)
        finally:
            client.close()
            fleet.stop()
    report(args, load_before, first, rates, cpu, clients, fans)
    return 0


def report(
    args: argparse.Namespace,
    load_before: tuple[float, float, float],
    first: dict[str, list[tuple[float, float]]],
    rates: dict[str, list[float]],
    cpu: dict[str, list[float]],
    clients: dict[str, list[float]],
    fans: dict[str, dict[str, Any]],
) -> None:
    load = os.getloadavg()
    print(
        f"load average {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} at the "
        f"start, {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end ({os.cpu_count()} cores)"
    )
    if first:
        floor = statistics.median(f for _, f in first["python"])
        for name, pairs in first.items():
            samples = [f for _, f in pairs]
            p50 = statistics.median(samples)
            print(
                f"submit → first token, {name:<12} p50 {ms(p50)}   p95 {ms(pct(samples, 0.95))}"
                + (
                    "   (the floor)"
                    if name == "python"
                    else f"   {1e3 * (p50 - floor):+5.2f} ms over the floor, {p50 / floor:4.2f}× "
                    "(target ≤ +1 ms)"
                )
            )
        for name, pairs in first.items():
            if name == "python":
                continue
            # Each turn against the floor's turn just before it (the same moment of the
            # machine): steadier than a difference of medians while the load moves.
            paired = [f - p for (_, f), (_, p) in zip(pairs, first["python"], strict=True)]
            print(
                f"  {name:<12} minus the floor's turn before it: p50 "
                f"{1e3 * statistics.median(paired):+5.2f} ms"
            )
        for name, pairs in first.items():
            answered = statistics.median(a for a, _ in pairs)
            after = statistics.median(f - a for a, f in pairs)
            print(
                f"  of which, {name:<12} submission answered p50 {ms(answered)}, "
                f"first token after it p50 {ms(after)}"
            )
    if rates["python"]:
        floor = statistics.median(rates["python"])
        for name, runs in rates.items():
            line = (
                f"{args.turns} turns / 50 sessions, {name:<12} "
                + " ".join(f"{r:6.1f}" for r in runs)
                + " turns/s"
            )
            own = f"client {1e3 * statistics.median(clients[name]):4.2f} ms"
            if name == "python":
                line += f"   (the floor); CPU per turn: {own}"
            else:
                line += (
                    f"   {statistics.median(runs) / floor:4.2f}× the floor; CPU per turn: "
                    f"gateway {1e3 * statistics.median(cpu[name]):4.2f} ms, {own}"
                )
            print(line)
    for name, fan in fans.items():
        n = fan["readers"]
        print(
            f"one turn, {n} SSE readers through one gateway ({name}): {fan['complete']} of {n} "
            f"got all {fan['events']} events ({fan['tokens']} tokens over {fan['duration']:4.2f} s)"
        )
        for key, what in (("first", "first reader"), ("last", "last reader")):
            print(
                f"  Redis → {what:<24} p50 {ms(statistics.median(fan[key]))}   "
                f"p99 {ms(pct(fan[key], 0.99))}   max {ms(max(fan[key]))}"
            )
        print(
            f"  first → last reader           p50 {ms(statistics.median(fan['spread']))}   "
            f"p99 {ms(pct(fan['spread'], 0.99))}"
        )
        print(
            f"  gateway CPU during the turn   {fan['cpu']:5.2f} s "
            f"({1e6 * fan['cpu'] / (n * fan['events']):5.1f} µs per event per reader; "
            f"the readers' own process {fan['own']:4.2f} s)"
        )
        per_connection = (fan["rss_idle"] - fan["rss_none"]) / n
        print(
            f"  memory per idle connection    {per_connection / 1024:5.1f} KB (RSS "
            f"{fan['rss_none'] / 2**20:5.1f} MB with none, {fan['rss_idle'] / 2**20:5.1f} MB "
            f"with {n}; target ≤ 64 KB)"
        )
        print(
            f"  Redis readers for the turn    {fan['readers_max']} (the gateway's connections "
            f"that sent XREAD; {fan['readers_before'][0]} before; most blocked at once "
            f"{fan['blocked_max']}; target 1)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
