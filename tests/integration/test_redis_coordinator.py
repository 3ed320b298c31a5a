"""The Redis coordinator against the machine's Redis: deltas that pile up behind a send
join one token event, and so do a turn's deltas within the flush interval (other turns'
in between), a stream slower than that still sends each delta, nothing is merged across
another event, a work mark cannot come back to a driver's value, buffers and steer lists
expire, a server that lost its scripts gets them again, and a steer list is read in as few
round trips as it can be.  What it promises as a coordinator is tested, with the
in-process one, in test_coordinator_contract.py."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from parley.coordination import constants as c
from parley.coordination.redis_clients import open_client
from parley.coordination.redis_coordinator import RedisCoordinator
from parley.engine.emitter import Emitter
from parley.schemas.events import (
    Ended,
    Event,
    EventKind,
    Queued,
    Started,
    StepCommitted,
    Token,
    ToolCalled,
)
from parley.schemas.records import Steer, SteerKind
from tests.support.fleet import REDIS_TEST_URL, flush_redis
from tests.support.redis_cluster import RedisClusterNodes

STARTED = Started(run_id="r", attempt=1, worker="w")


@pytest.fixture(params=["server", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    """The tests' Redis database, or the run's Redis Cluster, emptied."""
    if request.param == "server":
        flush_redis(REDIS_TEST_URL)
        return REDIS_TEST_URL
    nodes: RedisClusterNodes = request.getfixturevalue("cluster_nodes")
    nodes.flushall()
    return nodes.url


@pytest.fixture
def coordinator(redis_url: str) -> Iterator[RedisCoordinator]:
    coordinator = RedisCoordinator(redis_url)
    yield coordinator
    coordinator.close()


def _buffered(coordinator: RedisCoordinator, turn_id: str) -> list[tuple[int, str, str]]:
    coordinator.flush()
    return [
        (e.seq, e.kind.value, e.data.get("text", ""))
        for e in coordinator.read_events(turn_id, 0, timeout=0)
    ]


def _wait_sent(coordinator: RedisCoordinator, events: int) -> None:
    """Wait (up to 5 s) until the coordinator has sent ``events`` events."""
    deadline = time.monotonic() + 5
    while coordinator.events_sent < events and time.monotonic() < deadline:
        time.sleep(0.005)


def test_deltas_queued_behind_a_send_join_one_token_event(coordinator: RedisCoordinator) -> None:
    turn_id = str(uuid.uuid4())
    emitter = Emitter(turn_id, 1, coordinator, fence=1)
    deltas = [f"t{i:02d}" for i in range(70)]
    emitter.emit_delta(0, deltas[0])
    coordinator.flush()  # the first delta goes out alone, as the engine sends it
    with coordinator._sending:  # a send in flight: whatever arrives meanwhile waits
        for text in deltas[1:]:
            emitter.emit_delta(0, text)
    events = _buffered(coordinator, turn_id)
    assert events == [(1, "token", "t00"), (2, "token", "".join(deltas[1:]))]
    assert coordinator.deltas_coalesced == 68
    assert emitter.next_seq == 3  # seqs stay gap-free


def test_a_queued_token_event_stops_growing_past_its_limit(coordinator: RedisCoordinator) -> None:
    turn_id = str(uuid.uuid4())
    emitter = Emitter(turn_id, 1, coordinator, fence=1)
    with coordinator._sending:
        for _ in range(10):
            emitter.emit_delta(0, "x" * 1000)
    texts = [text for _seq, _kind, text in _buffered(coordinator, turn_id)]
    assert "".join(texts) == "x" * 10_000
    assert [len(t) for t in texts] == [5000, 5000]  # merging stops once 4096 is passed


def test_deltas_within_the_flush_interval_travel_as_one_event(
    coordinator: RedisCoordinator,
) -> None:
    """The flusher sends at most once per interval (0.05 s by default): a stream slower
    than the flusher, which each delta used to cost an event of, costs an event per
    interval, its text whole."""
    turn_id = str(uuid.uuid4())
    emitter = Emitter(turn_id, 1, coordinator, fence=1)
    deltas = [f"d{n}" for n in range(10)]
    for text in deltas:
        emitter.emit_delta(0, text)
        time.sleep(0.002)
    events = _buffered(coordinator, turn_id)
    assert "".join(text for _seq, _kind, text in events) == "".join(deltas)
    assert len(events) <= 3, events  # (the first after a quiet spell goes at once)


def test_deltas_of_interleaved_turns_each_join_their_own_token_event(
    coordinator: RedisCoordinator,
) -> None:
    """Turns streaming side by side in one process: a turn's delta joins its queued token
    event though another turn's was queued after it."""
    emitters = [Emitter(str(uuid.uuid4()), 1, coordinator, fence=1) for _ in range(3)]
    with coordinator._sending:  # a send in flight: whatever arrives meanwhile waits
        for n in range(5):
            for emitter in emitters:
                emitter.emit_delta(0, f"{n}")
    for emitter in emitters:
        assert _buffered(coordinator, emitter.turn_id) == [(1, "token", "01234")]
        assert emitter.next_seq == 2


def test_a_send_now_takes_only_its_own_turns_queued_events_along(
    coordinator: RedisCoordinator,
) -> None:
    """A driver's send now (a first token, an end) carries its turn's queued events, not
    every turn's: the others keep joining their token events until the flusher sends."""
    coordinator = RedisCoordinator(coordinator.url, flush_seconds=30)
    try:
        warm, queued, sent = (Emitter(str(uuid.uuid4()), 1, coordinator) for _ in range(3))
        warm.emit_delta(0, "w")
        _wait_sent(coordinator, 1)  # by the flusher: its next send is 30 s away
        queued.emit_delta(0, "q1")
        sent.emit_delta(0, "now", now=True)
        queued.emit_delta(0, "q2")
        assert coordinator.read_events(queued.turn_id, 0, timeout=0) == []
        assert [e.data["text"] for e in coordinator.read_events(sent.turn_id, 0, 0)] == ["now"]
        assert _buffered(coordinator, queued.turn_id) == [(1, "token", "q1q2")]
    finally:
        coordinator.close()


def test_with_no_flush_interval_a_slow_stream_sends_every_delta_as_its_own_event(
    coordinator: RedisCoordinator,
) -> None:
    coordinator = RedisCoordinator(coordinator.url, flush_seconds=0)
    try:
        test_a_slow_stream_sends_every_delta_as_its_own_event(coordinator)
    finally:
        coordinator.close()


def test_a_slow_stream_sends_every_delta_as_its_own_event(coordinator: RedisCoordinator) -> None:
    turn_id = str(uuid.uuid4())
    emitter = Emitter(turn_id, 1, coordinator, fence=1)
    for n in range(5):
        emitter.emit_delta(0, f"d{n}")
        _wait_sent(coordinator, n + 1)  # the flusher sends it before the next delta comes
    assert [text for _seq, _kind, text in _buffered(coordinator, turn_id)] == [
        "d0",
        "d1",
        "d2",
        "d3",
        "d4",
    ]
    assert coordinator.deltas_coalesced == 0


def test_deltas_never_join_a_token_event_across_another_event_or_step(
    coordinator: RedisCoordinator,
) -> None:
    turn_id = str(uuid.uuid4())
    emitter = Emitter(turn_id, 1, coordinator, fence=1)
    with coordinator._sending:
        emitter.emit_delta(0, "a")
        emitter.emit_delta(0, "b")
        emitter.emit(ToolCalled(step=0, call_id="c", name="x", arguments="{}"))
        emitter.emit_delta(0, "c")
        emitter.emit_delta(1, "d")
        emitter.allocate(StepCommitted(step=1, text=""))  # numbered, published later
        emitter.emit_delta(1, "e")  # after a seq was taken: a new event, never a merge
    assert _buffered(coordinator, turn_id) == [
        (1, "token", "ab"),
        (2, "tool_call", ""),
        (3, "token", "c"),
        (4, "token", "d"),
        (6, "token", "e"),
    ]


def test_a_work_mark_that_expired_during_a_drive_cannot_return_to_the_drivers_value(
    coordinator: RedisCoordinator,
) -> None:
    # A turn running longer than the mark's life: a counter would count back up to the
    # value the driver read, and the driver would let go over the new submission.
    session_id = str(uuid.uuid4())
    coordinator.mark_work(session_id)
    lock = coordinator.try_lock(session_id)
    assert lock is not None and lock.work_mark is not None
    coordinator.redis.delete(c.work_key(session_id))  # expired
    coordinator.mark_work(session_id)  # submitted while the driver holds the session
    assert lock.release() != lock.work_mark


def test_the_sweeper_leaves_a_session_to_a_fresh_kick_or_a_live_lock_only(
    coordinator: RedisCoordinator,
) -> None:
    idle, kicked, driven, late = (str(uuid.uuid4()) for _ in range(4))
    assert coordinator.mark_work(kicked) is True  # its kick is still in the queue
    assert coordinator.mark_work(driven) is True
    assert coordinator.try_lock(driven) is not None  # a driver holds it
    assert coordinator.mark_work(late) is True
    # That kick was sent longer ago than the grace: lost, or its driver died.
    age_ms = 1000 * c.KICK_GRACE_SECONDS + 100
    coordinator.redis.pexpire(c.kick_pending_key(late), 1000 * c.KICK_PENDING_SECONDS - age_ms)
    assert coordinator.unattended([idle, kicked, driven, late]) == [idle, late]
    assert coordinator.unattended([]) == []


def test_a_driver_that_hands_its_session_over_leaves_no_gap_for_the_sweeper(
    coordinator: RedisCoordinator,
) -> None:
    """Letting go to hand over raises the kick-pending flag in the same step (the kick
    follows); plain letting go lowers it, so the next submission kicks."""
    handed, done = str(uuid.uuid4()), str(uuid.uuid4())
    for session_id in (handed, done):
        assert coordinator.mark_work(session_id) is True  # the kick that started a drive
        lock = coordinator.try_lock(session_id)
        assert lock is not None
        lock.release(handing_over=session_id == handed)
    assert coordinator.unattended([handed, done]) == [done]
    assert coordinator.redis.ttl(c.kick_pending_key(handed)) > c.KICK_PENDING_SECONDS - 2
    assert coordinator.mark_work(done) is True and coordinator.mark_work(handed) is False


def test_a_turns_buffer_expires_a_day_after_its_driver_last_spoke_or_an_hour_after_its_end(
    coordinator: RedisCoordinator,
) -> None:
    turn_id = str(uuid.uuid4())
    announcer = Emitter(turn_id, 1, coordinator)
    announcer.emit(Queued(run_id="r"))  # a turn that may never end
    coordinator.flush()
    stream = c.events_key(turn_id)
    assert c.IDLE_BUFFER_SECONDS - 5 < coordinator.redis.ttl(stream) <= c.IDLE_BUFFER_SECONDS
    # A running turn keeps its whole buffer: each event of its driver gives it a day again
    # (here after the better part of a day in a tool), so its first tokens do not go.
    coordinator.redis.expire(stream, 100)
    emitter = Emitter(turn_id, 2, coordinator, fence=1)
    emitter.emit(STARTED)
    coordinator.flush()
    assert c.IDLE_BUFFER_SECONDS - 5 < coordinator.redis.ttl(stream) <= c.IDLE_BUFFER_SECONDS
    coordinator.redis.expire(stream, 100)
    coordinator.publish([Event(turn_id=turn_id, seq=3, kind=EventKind.QUEUED, data={})])
    coordinator.flush()  # an announcement does not: only a driver shows the turn runs
    assert coordinator.redis.ttl(stream) <= 100
    emitter = Emitter(turn_id, 4, coordinator, fence=1)
    emitter.emit(Ended(outcome="finished"))
    coordinator.flush()
    assert c.ENDED_BUFFER_SECONDS - 5 < coordinator.redis.ttl(stream) <= c.ENDED_BUFFER_SECONDS
    # The ends stream is for waiters that blocked before the end: it goes within a minute.
    ends = coordinator.redis.ttl(c.ends_key(turn_id))
    assert 0 < ends <= c.ENDS_STREAM_SECONDS < c.ENDED_BUFFER_SECONDS
    coordinator.publish([Event(turn_id=turn_id, seq=9, kind=EventKind.TOKEN, data={})])
    coordinator.flush()  # a late event does not bring the day back
    assert coordinator.redis.ttl(stream) <= c.ENDED_BUFFER_SECONDS


def test_a_drivers_replay_period_is_how_long_the_turns_it_ends_stay_replayable(
    redis_url: str,
) -> None:
    coordinator = RedisCoordinator(redis_url, replay_seconds=120)
    try:
        turn_id = str(uuid.uuid4())
        emitter = Emitter(turn_id, 1, coordinator)
        emitter.emit(Queued(run_id="r"))
        emitter.emit(Ended(outcome="cancelled"))
        coordinator.flush()
        stream = c.events_key(turn_id)
        assert 110 < coordinator.redis.ttl(stream) <= 120
        # Resumed, the turn runs again: its buffer must last the run, not the replay.
        assert coordinator.adopt(turn_id, fence=2) == 2
        assert coordinator.redis.ttl(stream) > c.IDLE_BUFFER_SECONDS - 5
        coordinator.redis.expire(stream, 60)  # (as if it had ended again)
        assert coordinator.adopt(turn_id, fence=1) == 2  # a stale driver gives no new life
        assert coordinator.redis.ttl(stream) <= 60
    finally:
        coordinator.close()


def test_a_server_that_lost_its_scripts_gets_them_loaded_again(
    coordinator: RedisCoordinator,
) -> None:
    turn_id, session_id = str(uuid.uuid4()), str(uuid.uuid4())
    emitter = Emitter(turn_id, 1, coordinator)
    emitter.emit(Queued(run_id="r"))
    coordinator.flush()
    assert coordinator.mark_work(session_id) is True
    coordinator.redis.script_flush()  # what a restarted server knows of them
    # The kick flag is still set, yet the pipeline (with the append of the event the mark
    # carries, as a submission's carries its `queued`) ran twice: kick rather than guess.
    after = emitter.allocate(Token(step=0, text="after"))
    assert coordinator.mark_work(session_id, [after]) is True
    assert [text for _seq, _kind, text in _buffered(coordinator, turn_id)] == ["", "after"]
    coordinator.redis.script_flush()
    emitter.emit_delta(0, "again")  # the flusher's own pipelines recover too
    assert [text for _seq, _kind, text in _buffered(coordinator, turn_id)] == [
        "",
        "after",
        "again",
    ]


def test_a_steer_list_is_read_once_and_then_answered_from_publish_replies_until_it_grows(
    coordinator: RedisCoordinator,
) -> None:
    reads: list[str] = []
    lrange = coordinator.redis.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = lrange(*args, **kwargs)
        original = pipe.lrange

        def counted(key: str, *rest: Any) -> Any:
            reads.append(key)
            return original(key, *rest)

        pipe.lrange = counted
        return pipe

    coordinator.redis.pipeline = counting_pipeline
    sender = RedisCoordinator(coordinator.url)  # another process: a client that steers
    turn_id = str(uuid.uuid4())
    say = Steer(position=1, kind=SteerKind.SAY, text="hello")
    try:
        sender.push_steer(turn_id, say)
        assert coordinator.steers_after(turn_id, 0, fresh=True) == [say]
        assert len(reads) == 1
        emitter = Emitter(turn_id, 1, coordinator, fence=1)
        time.sleep(0.15)  # the read is no longer fresh, but a publish reply is...
        emitter.emit(STARTED, now=True)
        assert coordinator.steers_after(turn_id, 0) == [say]  # ...and the list is as long
        assert coordinator.steers_after(turn_id, 1) == []  # past the cursor: nothing
        assert len(reads) == 1

        stop = Steer(position=2, kind=SteerKind.INTERRUPT, text="")
        sender.push_steer(turn_id, stop)
        sender.push_steer(turn_id, stop)  # a retried push lists it twice: read once
        emitter.emit(STARTED, now=True)  # the reply: the list grew
        assert coordinator.steers_after(turn_id, 1) == [stop]
        assert len(reads) == 2
        assert coordinator.steers_after(turn_id, 0, fresh=True) == [say, stop]
        assert len(reads) == 3
    finally:
        sender.close()


def test_a_streaming_turn_hears_of_its_steer_list_from_the_flush_of_its_tokens(
    redis_url: str,
) -> None:
    """While a token event of the turn waits for the flusher, or is being sent, an old
    look at its steer list still answers (no round trip per delta): the send's reply
    reports the list's length, and a grown list is read then.  With nothing of the turn
    queued, an old look is read again."""
    coordinator = RedisCoordinator(redis_url, flush_seconds=1.0)  # a slow flusher
    sender = RedisCoordinator(redis_url)
    reads: list[str] = []
    watching: list[bool] = []  # set: the next pipeline looks at the list as it is sent
    looked_in_flight: list[tuple[list[Steer], int]] = []
    pipeline = coordinator.redis.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = pipeline(*args, **kwargs)
        original, execute = pipe.lrange, pipe.execute

        def counted(key: str, *rest: Any) -> Any:
            reads.append(key)
            return original(key, *rest)

        def execute_looking(*args: Any, **kwargs: Any) -> Any:
            if watching:
                watching.clear()
                looked_in_flight.append((coordinator.steers_after(turn_id, 1), len(reads)))
            return execute(*args, **kwargs)

        pipe.lrange, pipe.execute = counted, execute_looking
        return pipe

    coordinator.redis.pipeline = counting_pipeline
    turn_id = str(uuid.uuid4())
    say = Steer(position=1, kind=SteerKind.SAY, text="hello")
    stop = Steer(position=2, kind=SteerKind.INTERRUPT, text="")
    try:
        sender.push_steer(turn_id, say)
        assert coordinator.steers_after(turn_id, 0, fresh=True) == [say]
        emitter = Emitter(turn_id, 1, coordinator, fence=1)
        emitter.emit(STARTED, now=True)  # its reply: the list as long as read
        emitter.emit_delta(0, "a")  # sent at once (after a quiet spell)...
        deadline = time.monotonic() + 5
        while coordinator._pending and time.monotonic() < deadline:
            time.sleep(0.01)
        emitter.emit_delta(0, "b")  # ...and this one waits up to a second for the next
        time.sleep(0.15)  # every look is older than STEERS_RECHECK_SECONDS
        assert coordinator.steers_after(turn_id, 0) == [say]
        assert len(reads) == 1
        sender.push_steer(turn_id, stop)
        assert coordinator.steers_after(turn_id, 1) == []  # not heard of before the flush
        watching.append(True)
        coordinator.flush()  # its reply: the list grew
        assert looked_in_flight == [([], 1)]  # while it was sent: the old look, no read
        assert coordinator.steers_after(turn_id, 1) == [stop]
        assert len(reads) == 2
        time.sleep(0.15)  # nothing of the turn queued: an old look is read again
        assert coordinator.steers_after(turn_id, 1) == [stop]
        assert len(reads) == 3
    finally:
        sender.close()
        coordinator.close()


def test_a_steer_list_shows_only_its_newest_entries_and_nothing_once_redis_is_gone(
    coordinator: RedisCoordinator,
) -> None:
    turn_id = str(uuid.uuid4())
    for position in range(1, c.STEER_TAIL + 11):
        coordinator.push_steer(turn_id, Steer(position=position, kind=SteerKind.SAY, text="s"))
    listed = coordinator.steers_after(turn_id, 0, fresh=True)
    assert [s.position for s in listed] == list(range(11, c.STEER_TAIL + 11))
    coordinator.redis.flushdb()  # (every primary's, on a cluster)
    assert coordinator.steers_after(turn_id, 0, fresh=True) == []
    broken = RedisCoordinator("redis://127.0.0.1:1/0")  # nothing listens there
    try:
        broken.push_steer(turn_id, Steer(position=1, kind=SteerKind.SAY, text="lost"))
        assert broken.steers_after(turn_id, 0, fresh=True) == []
    finally:
        broken.close()


def test_every_published_event_also_reaches_the_turns_pub_sub_channel_once(
    coordinator: RedisCoordinator,
) -> None:
    # For a UI that subscribes instead of reading the buffer: each message is a JSON list
    # of events, the same events the buffer holds, in order; a stale driver's are refused
    # on both.  On a cluster the channel is a sharded one, heard on the turn's node.
    turn_id = str(uuid.uuid4())
    channel = c.deltas_channel(turn_id)
    listener: Any = open_client(coordinator.url, max_connections=4, socket_timeout=5)
    subscription = listener.pubsub(ignore_subscribe_messages=True)
    if coordinator.cluster:
        subscription.ssubscribe(channel)
        holder = listener.get_node_from_key(channel)  # (each node counts its own)

    def listening() -> int:
        if coordinator.cluster:
            return int(listener.pubsub_shardnumsub(channel, target_nodes=holder)[0][1])
        return int(listener.pubsub_numsub(channel)[0][1])

    def receive() -> Any:
        if coordinator.cluster:
            return subscription.get_sharded_message(timeout=0.5)
        return subscription.get_message(timeout=0.5)

    try:
        if not coordinator.cluster:
            subscription.subscribe(channel)
        deadline = time.monotonic() + 5  # subscribed for sure before anything is published
        while listening() < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert coordinator.adopt(turn_id, fence=2) == 0
        emitter = Emitter(turn_id, 1, coordinator, fence=2)
        emitter.emit(STARTED)
        for n in range(30):
            emitter.emit_delta(0, f"d{n} ")
        stale = Emitter(turn_id, 100, coordinator, fence=1)
        stale.emit_delta(0, "from a driver that lost the turn", now=True)
        emitter.emit(Ended(outcome="finished"), now=True)
        heard: list[Event] = []
        deadline = time.monotonic() + 5
        while (not heard or heard[-1].kind is not EventKind.END) and time.monotonic() < deadline:
            message = receive()
            if message is not None:
                heard += [Event.from_json(item) for item in json.loads(message["data"])]
    finally:
        subscription.close()
        listener.close()

    assert heard == coordinator.read_events(turn_id, 0, timeout=0)
    assert [e.seq for e in heard] == list(range(1, len(heard) + 1))
    tokens = "".join(e.data["text"] for e in heard if e.kind is EventKind.TOKEN)
    assert tokens == "".join(f"d{n} " for n in range(30))
