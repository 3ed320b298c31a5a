"""The soak's users: a sustained rate of turns over many sessions, mixed as users mix them,
through either gateway, every request retried the way a careful client retries it (the
same request id for a submission; another gateway when one is down).  Everything they do
and see goes into the :class:`Journal`."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.soak.journal import Answer, Batch, Head, Journal, Reader, Say, TreeSnapshot, Turn

KINDS: dict[str, float] = {
    "reply": 0.38,
    "tools": 0.18,
    "approve": 0.08,
    "steer": 0.14,
    "interrupt": 0.08,
    "branch": 0.06,
    "queued": 0.08,
}
"""How often each kind of turn is submitted.  ``queued`` is a reply submitted to a session
whose turn still runs (it waits its turn); ``branch`` moves the head back first."""
READER_SHARE = 0.35
"""Turns someone follows over SSE."""
RECONNECT_CHANCE = 0.3
"""A reader drops its connection after a few events, and reconnects with Last-Event-ID."""
RETRY_SECONDS = 120.0
"""How long a client keeps retrying one request through outages."""
RESULT_WAIT = 20
BATCH_EVERY = 20.0
BATCH_LINES = 0.05
"""A batch every ``BATCH_EVERY`` seconds carries this share of the turns asked in that time."""
SNAPSHOT_EVERY = 15.0
RETRYABLE = {500, 502, 503, 504}


class GaveUp(Exception):
    """A request got no answer through every retry."""


@dataclass
class Load:
    """``rate`` turns a second over ``sessions`` sessions."""

    urls: list[str]
    token: str
    journal: Journal
    rate: float
    sessions: int
    seed: int = 0
    faults_at: float = float("inf")
    """Wall time the first fault is due: turns before it are the calm baseline."""
    rng: random.Random = field(init=False)
    clients: dict[str, httpx.AsyncClient] = field(init=False, default_factory=dict)
    session_ids: list[str] = field(init=False, default_factory=list)
    busy: dict[str, int] = field(init=False, default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(init=False, default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # -- requests ---------------------------------------------------------------------

    def _client(self, url: str) -> httpx.AsyncClient:
        if url not in self.clients:
            self.clients[url] = httpx.AsyncClient(
                base_url=url,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=httpx.Timeout(RESULT_WAIT + 15, connect=3),
                limits=httpx.Limits(max_connections=400, max_keepalive_connections=100),
            )
        return self.clients[url]

    async def request(
        self, method: str, path: str, *, unsent_only: bool = False, **options: Any
    ) -> httpx.Response:
        """The request's answer from whichever gateway gives one, retrying through outages
        (``unsent_only``: only when the request cannot have arrived, for what must not be
        sent twice).  An answer other than a 5xx is returned as it is."""
        deadline = time.monotonic() + RETRY_SECONDS
        attempt = 0
        while True:
            url = self.urls[(attempt + self.rng.randrange(len(self.urls))) % len(self.urls)]
            attempt += 1
            try:
                answer = await self._client(url).request(method, path, **options)
                if answer.status_code not in RETRYABLE:
                    return answer
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
                pass
            except httpx.TransportError:
                if unsent_only:
                    raise
            if time.monotonic() > deadline:
                raise GaveUp(f"{method} {path}: no answer in {RETRY_SECONDS} s")
            await asyncio.sleep(min(0.1 * attempt, 1.0))

    async def post(self, path: str, body: Any = None, **options: Any) -> httpx.Response:
        return await self.request("POST", path, json=body, **options)

    # -- the run ----------------------------------------------------------------------

    async def open_sessions(self) -> None:
        async def one(number: int) -> None:
            answer = await self.post("/v1/sessions", {"title": f"soak {number}"})
            assert answer.status_code == 201, answer.text
            session_id = answer.json()["id"]
            self.session_ids.append(session_id)
            self.busy[session_id] = 0
            self.locks[session_id] = asyncio.Lock()

        for start in range(0, self.sessions, 100):
            await asyncio.gather(*(one(n) for n in range(start, min(start + 100, self.sessions))))

    async def run(self, stop_at: float) -> None:
        """Submit until ``stop_at`` (monotonic), then wait for every turn begun to end."""
        background = [
            asyncio.create_task(self._every(BATCH_EVERY, self._batch)),
            asyncio.create_task(self._every(SNAPSHOT_EVERY, self._snapshot)),
        ]
        next_at = time.monotonic()
        while time.monotonic() < stop_at:
            next_at += self.rng.expovariate(self.rate)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            self._spawn(self._arrival())
        for task in background:
            task.cancel()
        while self.tasks:
            await asyncio.wait(list(self.tasks))

    def _spawn(self, work: Awaitable[None]) -> None:
        async def guarded() -> None:
            try:
                await work
            except GaveUp as exc:
                self.journal.errors.append(str(exc))
            except Exception as exc:  # (a client's own failure is the run's failure too)
                self.journal.errors.append(f"{type(exc).__name__}: {exc}")

        task = asyncio.create_task(guarded())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _every(self, seconds: float, action: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(seconds * self.rng.uniform(0.8, 1.2))
            self._spawn(action())

    async def _arrival(self) -> None:
        kind = self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        self.journal.arrivals += 1
        if kind == "queued":
            busy = [s for s, n in self.busy.items() if n]
            session_id = self.rng.choice(busy) if busy else self._idle_session()
        else:
            session_id = self._idle_session()
        if session_id is None:
            self.journal.errors.append("no idle session for an arrival: too few sessions")
            return
        self.busy[session_id] += 1
        try:
            await FLOWS[kind](self, session_id)
        finally:
            self.busy[session_id] -= 1

    def _idle_session(self) -> str | None:
        for _ in range(20):
            session_id = self.rng.choice(self.session_ids)
            if not self.busy[session_id]:
                return session_id
        return None

    # -- one turn ---------------------------------------------------------------------

    async def submit(self, session_id: str, kind: str) -> Turn:
        """Submit a turn and return its record (the journal has it); a reader follows it
        at once, for a share of the turns."""
        async with self.locks[session_id]:
            return await self._submit(session_id, kind, branched_from=None)

    async def _submit(self, session_id: str, kind: str, *, branched_from: str | None) -> Turn:
        """:meth:`submit`, the session's lock held: the order submissions are accepted in
        is the order the journal keeps."""
        request_id = uuid.uuid4().hex
        prompt = f"{kind} {request_id[:8]}"
        body = {"prompt": prompt, "request_id": request_id}
        submitted_at = time.time()
        answer = await self.post(f"/v1/sessions/{session_id}/turns", body)
        if answer.status_code not in (200, 202):
            raise GaveUp(f"submission refused {answer.status_code}: {answer.text}")
        turn = Turn(
            turn_id=answer.json()["turn_id"],
            session_id=session_id,
            kind=kind,
            prompt=prompt,
            request_id=request_id,
            submitted_at=submitted_at,
            calm=submitted_at < self.faults_at,
            branched_from=branched_from,
        )
        self.journal.accept(turn)
        if self.rng.random() < 0.1:  # a client that did not see its answer sends it again
            again = await self.post(f"/v1/sessions/{session_id}/turns", body)
            turn.repeats.append(again.json().get("turn_id", f"status {again.status_code}"))
        if self.rng.random() < READER_SHARE:
            self._spawn(self.follow(turn))
        return turn

    async def wait_end(self, turn: Turn) -> None:
        while True:
            answer = await self.request(
                "GET", f"/v1/turns/{turn.turn_id}/result", params={"wait": RESULT_WAIT}
            )
            if answer.status_code == 200:
                turn.outcome = answer.json()["status"]
                turn.ended_at = time.time()
                return
            assert answer.status_code == 202, answer.text

    async def follow(self, turn: Turn) -> None:
        """Read the turn's events to its end over SSE, through either gateway, sometimes
        dropping the connection and coming back with ``Last-Event-ID``."""
        reader = Reader(turn.turn_id)
        self.journal.readers.append(reader)
        deadline = time.monotonic() + RETRY_SECONDS * 3
        while not reader.ended and time.monotonic() < deadline:
            drop_after = self.rng.randint(1, 6) if self.rng.random() < RECONNECT_CHANCE else None
            await self._read(turn, reader, drop_after)
            if not reader.ended:
                await asyncio.sleep(self.rng.uniform(0, 0.3))

    async def _read(self, turn: Turn, reader: Reader, drop_after: int | None) -> None:
        headers = {"Accept": "text/event-stream"}
        if reader.seqs:
            headers["Last-Event-ID"] = str(reader.seqs[-1])
        url = self.rng.choice(self.urls)
        reader.connections += 1
        seen = 0
        try:
            async with self._client(url).stream(
                "GET", f"/v1/turns/{turn.turn_id}/events", headers=headers
            ) as answer:
                if answer.status_code != 200:
                    await answer.aread()
                    await asyncio.sleep(0.2)
                    return
                seq, kind = None, None
                async for line in answer.aiter_lines():
                    if line.startswith("id: "):
                        seq = int(line[4:])
                    elif line.startswith("event: "):
                        kind = line[7:]
                    elif not line and seq is not None:
                        reader.seqs.append(seq)
                        reader.kinds.append(str(kind))
                        if kind == "token" and turn.first_token is None:
                            turn.first_token = time.time() - turn.submitted_at
                        if kind == "end":
                            reader.ended = True
                            return
                        seq, kind, seen = None, None, seen + 1
                        if drop_after is not None and seen >= drop_after:
                            return
        except httpx.TransportError:
            await asyncio.sleep(0.2)

    # -- flows ------------------------------------------------------------------------

    async def reply(self, session_id: str) -> None:
        await self.wait_end(await self.submit(session_id, "reply"))

    async def tools(self, session_id: str) -> None:
        await self.wait_end(await self.submit(session_id, "tools"))

    async def steer(self, session_id: str) -> None:
        turn = await self.submit(session_id, "steer")
        await asyncio.sleep(self.rng.uniform(0.1, 1.2))
        text = f"also consider {uuid.uuid4().hex[:10]}"
        try:
            answer = await self.post(
                f"/v1/turns/{turn.turn_id}/say", {"text": text}, unsent_only=True
            )
            status = {202: "accepted", 409: "ended"}.get(answer.status_code, "refused")
        except httpx.TransportError:
            status = "unknown"
        turn.says.append(Say(text, status))
        await self.wait_end(turn)

    async def interrupt(self, session_id: str) -> None:
        turn = await self.submit(session_id, "interrupt")
        await asyncio.sleep(self.rng.uniform(0.3, 2.0))
        await self.post(f"/v1/turns/{turn.turn_id}/interrupt")
        await self.wait_end(turn)
        if turn.outcome == "cancelled":
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))
            answer = await self.post(f"/v1/turns/{turn.turn_id}/resume")
            if answer.status_code == 202:
                turn.resumes += 1
                turn.outcome = None
                await self.wait_end(turn)
            elif answer.status_code != 409:  # (409: a later turn of the session follows it)
                self.journal.errors.append(f"resume of {turn.turn_id}: {answer.status_code}")

    async def approve(self, session_id: str) -> None:
        turn = await self.submit(session_id, "approve")
        while True:
            answer = await self.request("GET", f"/v1/turns/{turn.turn_id}")
            details = answer.json()
            if details["pending_approvals"] or details["status"] not in ("queued", "running"):
                break
            await asyncio.sleep(0.5)
        for pending in details["pending_approvals"]:
            await asyncio.sleep(self.rng.uniform(1.0, 3.0))  # a person reads it
            decision = "approve" if self.rng.random() < 0.75 else "deny"
            path = f"/v1/turns/{turn.turn_id}/approvals/{pending['approval_id']}"
            first = await self.post(path, {"decision": decision})
            record = Answer(pending["approval_id"], decision, first.status_code)
            if self.rng.random() < 0.3:  # a second click
                record.repeat_status = (await self.post(path, {"decision": decision})).status_code
            turn.answers.append(record)
        await self.wait_end(turn)

    async def branch(self, session_id: str) -> None:
        earlier = self.journal.order.get(session_id, [])
        if len(earlier) < 2:
            await self.reply(session_id)
            return
        target = self.rng.choice(earlier[:-1])
        async with self.locks[session_id]:  # (no other submission between the two)
            answer = await self.post(f"/v1/sessions/{session_id}/branch", {"turn_id": target})
            if answer.status_code != 200:
                self.journal.errors.append(f"branch to {target}: {answer.status_code}")
                return
            turn = await self._submit(session_id, "reply", branched_from=target)
        await self.wait_end(turn)

    # -- alongside --------------------------------------------------------------------

    async def _batch(self) -> None:
        count = max(2, round(self.rate * BATCH_EVERY * BATCH_LINES))
        custom_ids = [f"line-{uuid.uuid4().hex[:12]}" for _ in range(count)]
        lines = "".join(
            json.dumps(
                {
                    "custom_id": custom_id,
                    "method": "POST",
                    "url": "/v1/responses",
                    "body": {"input": f"batch {custom_id}"},
                }
            )
            + "\n"
            for custom_id in custom_ids
        )
        upload = await self.request(
            "POST",
            "/v1/files",
            data={"purpose": "batch"},
            files={"file": ("soak.jsonl", lines.encode(), "application/jsonl")},
        )
        if upload.status_code != 200:
            self.journal.errors.append(f"batch upload: {upload.status_code} {upload.text}")
            return
        body = {
            "input_file_id": upload.json()["id"],
            "endpoint": "/v1/responses",
            "completion_window": "24h",
        }
        key = {"Idempotency-Key": uuid.uuid4().hex}  # a retry must not make a second batch
        created = await self.post("/v1/batches", body, headers=key)
        if created.status_code != 200:
            self.journal.errors.append(f"batch create: {created.status_code} {created.text}")
            return
        self.journal.batches.append(Batch(created.json()["id"], custom_ids))

    async def _snapshot(self) -> None:
        for session_id in self.rng.sample(self.session_ids, min(5, len(self.session_ids))):
            answer = await self.request("GET", f"/v1/sessions/{session_id}/tree")
            turns = [
                (t["turn_id"], t["parent_id"], t["prompt"], t["status"])
                for t in answer.json()["turns"]
            ]
            self.journal.snapshots.append(TreeSnapshot(session_id, turns))

    async def finish(self, timeout: float) -> None:
        """After the run: wait for the batches to end, and record every session's head and
        history as the gateway answers them."""
        deadline = time.monotonic() + timeout
        for batch in self.journal.batches:
            while time.monotonic() < deadline:
                batch.status = (await self.request("GET", f"/v1/batches/{batch.batch_id}")).json()[
                    "status"
                ]
                if batch.status in ("completed", "failed", "cancelled", "expired"):
                    break
                await asyncio.sleep(1)

        async def head(session_id: str) -> None:
            session = (await self.request("GET", f"/v1/sessions/{session_id}")).json()
            history = (await self.request("GET", f"/v1/sessions/{session_id}/history")).json()
            turns = [t["turn_id"] for t in history["turns"]]
            self.journal.heads.append(Head(session_id, session["head_turn_id"], turns))

        for start in range(0, len(self.session_ids), 50):
            await asyncio.gather(*(head(s) for s in self.session_ids[start : start + 50]))

    async def close(self) -> None:
        for client in self.clients.values():
            await client.aclose()


FLOWS: dict[str, Callable[[Load, str], Awaitable[None]]] = {
    "reply": Load.reply,
    "queued": Load.reply,  # (a reply: only the session it goes to differs)
    "tools": Load.tools,
    "steer": Load.steer,
    "interrupt": Load.interrupt,
    "approve": Load.approve,
    "branch": Load.branch,
}
