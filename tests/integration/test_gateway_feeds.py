"""The gateway's shared feeds (``parley/gateway/feeds.py``) on an embedded client: a
subscriber from any seq gets every later event once, in order, whatever the feed had read
when it came."""

from __future__ import annotations

import asyncio
from pathlib import Path

import parley
from parley.gateway.feeds import Feeds
from schemas.events import EventKind
from tests.helpers import scripted_host

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
