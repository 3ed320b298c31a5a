"""The gateway's shared feeds (``src/parley/gateway/feeds.py``) on an embedded client: a
subscriber from any seq gets every later event once, in order, whatever the feed had read
when it came."""

from __future__ import annotations

import asyncio
from pathlib import Path

import parley
from parley.gateway.feeds import Feeds
from parley.schemas.events import Event, EventKind
from tests.support.helpers import scripted_host

TEXT = "".join(f"t{i:02d} " for i in range(40))


def test_a_subscriber_from_a_seq_gets_only_what_follows_it_on_a_fresh_feed(
    tmp_path: Path,
) -> None:
    rules = [{"when": ".*", "steps": [{"text": TEXT, "chunk_chars": 4}]}]
    client = parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host=scripted_host(rules))
    try:
        root = tmp_path / "root"
        root.mkdir()
        handle = client.open_session(root).submit("go")
        handle.wait(30)
        everything = [e.seq for e in handle.events()]
        assert len(everything) > 10 and everything[-1] > 10

        async def subscribe(after: int) -> list[int]:
            feeds = Feeds(client)  # a new process's: it has read nothing of the turn
            try:
                return [e.seq async for e in feeds.subscribe(handle.turn_id, after)]
            finally:
                feeds.close()

        for after in (0, 1, 10, everything[-2]):
            seen = asyncio.run(subscribe(after))
            assert seen == [seq for seq in everything if seq > after], after
        # And a subscriber past the end gets nothing, but the stream ends.
        assert asyncio.run(subscribe(everything[-1])) == []
    finally:
        client.close()


def test_subscribers_of_one_feed_from_different_seqs(tmp_path: Path) -> None:
    rules = [{"when": ".*", "steps": [{"text": TEXT, "chunk_chars": 4, "delay_ms": 5}]}]
    client = parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host=scripted_host(rules))
    try:
        root = tmp_path / "root"
        root.mkdir()
        handle = client.open_session(root).submit("go")

        async def scenario() -> list[list[int]]:
            feeds = Feeds(client)

            async def one(after: int) -> list[int]:
                return [e.seq async for e in feeds.subscribe(handle.turn_id, after)]

            try:
                return await asyncio.gather(*(one(after) for after in (0, 3, 7, 12)))
            finally:
                feeds.close()

        results = asyncio.run(scenario())
        everything = [e.seq for e in handle.events()]
        assert everything[-1] == max(results[0])
        for after, seen in zip((0, 3, 7, 12), results, strict=True):
            assert seen == [seq for seq in everything if seq > after], after
        assert [e.kind for e in handle.events()][-1] is EventKind.END
    finally:
        client.close()


def test_frames_are_each_event_encoded_once_in_order(tmp_path: Path) -> None:
    rules = [{"when": ".*", "steps": [{"text": TEXT, "chunk_chars": 4, "delay_ms": 2}]}]
    client = parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host=scripted_host(rules))
    try:
        root = tmp_path / "root"
        root.mkdir()
        handle = client.open_session(root).submit("go")
        encoded: list[int] = []

        def encode(event: Event) -> bytes:
            encoded.append(event.seq)
            return f"{event.seq};".encode()

        async def scenario() -> tuple[list[bytes], list[bytes], list[bytes]]:
            feeds = Feeds(client)

            async def one(after: int, pause: float) -> list[bytes]:
                chunks = []
                async for chunk in feeds.frames(handle.turn_id, after, encode):
                    chunks.append(chunk)
                    await asyncio.sleep(pause)  # a slower one gets more per chunk
                return chunks

            try:
                return await asyncio.gather(one(0, 0), one(0, 0.02), one(5, 0))
            finally:
                feeds.close()

        fast, slow, late = asyncio.run(scenario())
        everything = [e.seq for e in handle.events()]
        for chunks, after in ((fast, 0), (slow, 0), (late, 5)):
            seqs = [int(s) for s in b"".join(chunks).decode().split(";") if s]
            assert seqs == [seq for seq in everything if seq > after]
        assert sorted(encoded) == everything  # once each, for all three subscribers
        assert len(slow) < len(fast)
    finally:
        client.close()
