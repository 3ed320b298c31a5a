"""The coordinator port's contract (:class:`parley.ports.backend.Coordinator`), one suite for
both implementations: the test bodies that take the ``coordinator`` fixture run against
the in-process coordinator and against the Redis one, and those that take ``peer`` also
read (or lock, or adopt) through what another client sees.

What the two may do differently is written down here too, as tests of each one's
documented behaviour, named after the implementation they hold for:

- ``mark_work`` asks for a kick: always in process; on Redis not while an earlier kick
  waits for a driver, nor while a driver holds the session.
- ``coalesce``: never in process (a published event is already in readers' hands); on
  Redis while the token is the last event queued, unsent.
- What a reader sees: in process a publish at once; on Redis what was sent (by the
  flusher, ``now``, ``flush``), though ``last_seq``, ``adopt`` and ``wait_end`` send
  what the process has queued first.
- Steer lists: in process only for a turn that has a buffer, and all of its steers; on
  Redis for any turn, its newest ``STEER_TAIL`` entries (tested with Redis's
  round-trip counting and expiries in test_redis_coordinator.py), answered from a
  recent look unless ``fresh``.

What only one implementation has (the in-process buffers' memory bounds, Redis's
expiries, scripts, pub/sub and round trips) is tested in tests/unit/test_local_coordinator.py
and test_redis_coordinator.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from parley.coordination import constants as c
from parley.coordination.local_coordinator import LocalCoordinator
from parley.coordination.redis_coordinator import RedisCoordinator
from parley.ports.backend import Coordinator, SessionLock
from parley.schemas.events import Ended, Event, Queued, Started, StepCommitted, Token, ToolCalled
from parley.schemas.records import Steer, SteerKind
from tests.support.fleet import REDIS_TEST_URL, flush_redis

TURN = "turn"
SESSION = "session"


@pytest.fixture
def local_coordinator() -> LocalCoordinator:
    """The in-process coordinator alone, for what only it promises."""
    return LocalCoordinator()


@pytest.fixture
def redis_coordinator() -> Iterator[RedisCoordinator]:
    """The Redis coordinator alone, on the tests' emptied database."""
    flush_redis(REDIS_TEST_URL)
    coordinator = RedisCoordinator(REDIS_TEST_URL)
    try:
        yield coordinator
    finally:
        coordinator.close()


@contextmanager
def flusher_held(coordinator: Coordinator) -> Iterator[None]:
    """Keep the Redis coordinator's flusher thread from sending, so what is published
    stays queued until this thread sends it (``now``, ``flush`` and the calls that send
    first still work: the queue's lock is reentrant).  Enter it before the coordinator's
    first publish: the flusher then waits for that lock, which this thread holds.  Do not
    close the coordinator inside it (close waits for the flusher).  In process, nothing to
    hold: there is no queue."""
    if isinstance(coordinator, RedisCoordinator):
        with coordinator._wake:
            yield
    else:
        yield


def token(seq: int, text: str = "", turn_id: str = TURN) -> Event:
    return Event.of(turn_id, seq, Token(step=0, text=text))


def queued(seq: int, turn_id: str = TURN) -> Event:
    return Event.of(turn_id, seq, Queued(run_id="r"))


def started(seq: int, turn_id: str = TURN) -> Event:
    return Event.of(turn_id, seq, Started(run_id="r", attempt=1, worker="w"))


def end(seq: int, turn_id: str = TURN) -> Event:
    return Event.of(turn_id, seq, Ended(outcome="finished", reply="done"))


def steer(position: int, kind: SteerKind = SteerKind.SAY) -> Steer:
    return Steer(position=position, kind=kind, text=f"steer {position}")


def seqs(events: list[Event]) -> list[int]:
    return [e.seq for e in events]


# ---------------------------------------------------------------------------- locks


def test_a_session_has_one_lock_holder_until_it_lets_go(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    lock = coordinator.try_lock(SESSION)
    assert lock is not None and lock.held()
    assert coordinator.try_lock(SESSION) is None
    assert peer.try_lock(SESSION) is None  # nor another client
    other = peer.try_lock("another session")  # a lock is the session's alone
    assert other is not None
    lock.release()
    assert not lock.held()
    again = peer.try_lock(SESSION)
    assert again is not None and again.held()
    again.release()
    other.release()


def test_of_threads_racing_for_a_session_lock_one_wins(coordinator: Coordinator) -> None:
    racers = 8
    start = threading.Barrier(racers)
    won: list[SessionLock] = []

    def race() -> None:
        start.wait()
        lock = coordinator.try_lock(SESSION)
        if lock is not None:
            won.append(lock)

    threads = [threading.Thread(target=race) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(won) == 1
    won[0].release()


def test_a_session_lock_counts_the_work_marked_while_it_is_held(
    coordinator: Coordinator,
) -> None:
    coordinator.mark_work("s")  # before any driver: the kick that follows starts one
    lock = coordinator.try_lock("s")
    assert lock is not None and coordinator.try_lock("s") is None
    coordinator.mark_work("s")
    moved = lock.release()
    assert moved is not None and moved != lock.work_mark  # the driver goes round again
    again = coordinator.try_lock("s")
    assert again is not None and again.release() == again.work_mark  # nothing new


def test_a_lock_is_released_once_and_a_second_release_leaves_the_next_holder_alone(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    lock = coordinator.try_lock(SESSION)
    assert lock is not None
    assert lock.release() == lock.work_mark
    successor = peer.try_lock(SESSION)
    assert successor is not None
    assert lock.release() is None
    assert successor.held() and coordinator.try_lock(SESSION) is None
    successor.release()


def test_marking_work_publishes_its_events_and_what_was_queued_before_them(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    running = token(5, "still streaming", turn_id="running turn")
    coordinator.publish([running])
    coordinator.mark_work(SESSION, [queued(1)])
    assert peer.read_events(TURN, 0, timeout=0) == [queued(1)]
    assert peer.read_events("running turn", 0, timeout=0) == [running]


def test_the_in_process_coordinator_always_asks_for_a_kick(
    local_coordinator: LocalCoordinator,
) -> None:
    assert local_coordinator.mark_work(SESSION) is True
    assert local_coordinator.mark_work(SESSION) is True  # though that kick may still wait
    lock = local_coordinator.try_lock(SESSION)
    assert lock is not None
    assert local_coordinator.mark_work(SESSION) is True  # though a driver holds it
    assert lock.release() != lock.work_mark  # (the driver sees the work all the same)


def test_no_kick_is_needed_from_a_kick_sent_until_its_driver_lets_go(
    redis_coordinator: RedisCoordinator,
) -> None:
    coordinator = redis_coordinator
    session_id = SESSION
    assert coordinator.mark_work(session_id) is True  # first submission: kick
    assert coordinator.mark_work(session_id) is False  # that kick still waits: it will do
    lock = coordinator.try_lock(session_id)  # a driver takes the kick up
    assert lock is not None
    assert coordinator.mark_work(session_id) is False  # the driver will see this work...
    assert coordinator.try_lock(session_id) is None  # (a duplicate kick bounces)
    after = lock.release()
    assert after != lock.work_mark  # ...as letting go tells it: it goes on
    assert after == coordinator.redis.get(c.work_key(session_id))
    assert coordinator.mark_work(session_id) is True  # nobody holds it now: kick
    assert lock.release() is None  # released once


# ---------------------------------------------------------------------------- events


def test_events_are_read_in_seq_order_once_each_from_any_after(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    events = [queued(1), started(2), *(token(s, f"d{s}") for s in range(3, 7)), end(7)]
    coordinator.publish(events[:3])
    coordinator.publish(events[1:5], fence=1)  # partly published already: once each
    coordinator.publish([events[3]], fence=1)  # older than the newest: dropped
    coordinator.publish(events[5:], fence=1, now=True)
    for reader in (coordinator, peer):
        for after in range(len(events) + 2):
            assert reader.read_events(TURN, after, timeout=0) == events[after:]
        assert reader.read_events(TURN, 0, timeout=5) == events  # there: no wait
    assert peer.read_events("another turn", 0, timeout=0) == []
    assert peer.read_events(TURN, 7, timeout=0.05) == []  # waited out


def test_a_waiting_reader_gets_what_is_published_while_it_waits(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    coordinator.publish([started(1)], fence=1, now=True)
    read: list[list[Event]] = []
    reader = threading.Thread(target=lambda: read.append(peer.read_events(TURN, 1, timeout=10)))
    reader.start()
    coordinator.publish([token(2, "hello")], fence=1)  # not now: the background sends it
    reader.join(15)
    assert read == [[token(2, "hello")]]


def test_publishing_now_or_flushing_sends_what_is_queued_in_order(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    with flusher_held(coordinator):
        coordinator.publish([started(1)], fence=1)
        coordinator.publish([token(2, "a")], fence=1, now=True)  # and what was queued first
        assert peer.read_events(TURN, 0, timeout=0) == [started(1), token(2, "a")]
        coordinator.publish([token(3, "b")], fence=1)
        coordinator.flush()
        assert seqs(peer.read_events(TURN, 0, timeout=0)) == [1, 2, 3]


def test_publishing_nothing_now_still_sends_what_is_queued(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    with flusher_held(coordinator):
        coordinator.publish([started(1)], fence=1)
        coordinator.publish([], fence=1, now=True)
        assert peer.read_events(TURN, 0, timeout=0) == [started(1)]


def test_events_of_an_announcer_and_a_driver_keep_their_publishing_order(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    # Queued together, a driver's events and an announcement (fence 0) of the same turn
    # reach the buffer in the order they were published: none is taken for a re-sent one.
    with flusher_held(coordinator):
        coordinator.publish([token(1, "a")], fence=1)
        coordinator.publish([queued(2)])
        coordinator.publish([token(3, "b")], fence=1)
        coordinator.flush()
    assert seqs(peer.read_events(TURN, 0, timeout=0)) == [1, 2, 3]


def test_once_a_driver_adopted_a_turn_an_older_drivers_events_are_refused(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    coordinator.publish([queued(1)], now=True)  # an announcement, before any driver
    assert peer.adopt(TURN, fence=2) == 1
    coordinator.publish([started(2)], fence=1, now=True)  # the driver that lost the turn
    assert peer.read_events(TURN, 0, timeout=0) == [queued(1)]
    coordinator.publish([started(2), token(3, "new")], fence=2, now=True)
    assert peer.adopt(TURN, fence=1) == 3  # a stale adoption lowers nothing
    coordinator.publish([token(4, "stale")], fence=1, now=True)
    coordinator.publish([queued(4)], now=True)  # an announcement is no driver's
    assert peer.read_events(TURN, 0, timeout=0) == [
        queued(1),
        started(2),
        token(3, "new"),
        queued(4),
    ]
    assert peer.adopt(TURN, fence=3) == 4  # taken over again: now fence 2 is the stale one
    coordinator.publish([token(5, "older")], fence=2, now=True)
    coordinator.publish([token(5, "newest")], fence=3, now=True)
    assert peer.read_events(TURN, 4, timeout=0) == [token(5, "newest")]


def test_adopting_a_turn_returns_the_newest_seq_buffered_this_process_included(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    assert coordinator.adopt(TURN, fence=1) == 0  # nothing buffered
    coordinator.publish([started(1), token(2, "a")], fence=1)  # queued, perhaps unsent
    assert coordinator.adopt(TURN, fence=2) == 2
    peer.publish([started(3), token(4, "b")], fence=2, now=True)
    assert coordinator.adopt(TURN, fence=3) == 4
    assert peer.adopt("another turn", fence=1) == 0


def test_the_last_seq_is_the_newest_buffered_this_process_included(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    assert coordinator.last_seq(TURN) == 0
    coordinator.publish([started(1), token(2, "a")], fence=1)  # queued, perhaps unsent
    assert coordinator.last_seq(TURN) == 2
    assert peer.last_seq(TURN) == 2
    peer.adopt(TURN, fence=2)
    coordinator.publish([token(3, "stale")], fence=1, now=True)  # refused: not buffered
    assert peer.last_seq(TURN) == 2
    assert peer.last_seq("another turn") == 0


def test_waiting_for_an_end_gives_the_newest_end_past_after(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    assert peer.wait_end(TURN, 0, timeout=0) == 0
    assert peer.wait_end(TURN, 0, timeout=0.05) == 0  # waited out
    coordinator.publish([started(1), token(2, "a"), end(3)], fence=1)  # perhaps unsent
    assert coordinator.wait_end(TURN, 0, timeout=0) == 3  # this process's count too
    assert peer.wait_end(TURN, 0, timeout=0) == 3
    assert peer.wait_end(TURN, 2, timeout=5) == 3  # there: no wait
    assert peer.wait_end(TURN, 3, timeout=0) == 0
    # Resumed and ended again: the newest end counts.
    coordinator.publish([queued(4), started(5), end(6)], fence=2, now=True)
    assert peer.wait_end(TURN, 0, timeout=0) == 6
    assert peer.wait_end(TURN, 3, timeout=0) == 6
    assert peer.wait_end(TURN, 6, timeout=0) == 0
    # The end of a driver that lost the turn is no end.
    peer.adopt(TURN, fence=3)
    coordinator.publish([end(7)], fence=2, now=True)
    assert peer.wait_end(TURN, 6, timeout=0) == 0
    assert peer.wait_end("another turn", 0, timeout=0) == 0


def test_a_waiter_gets_an_end_published_while_it_waits(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    coordinator.publish([started(1)], fence=1, now=True)
    ended: list[int] = []
    waiter = threading.Thread(target=lambda: ended.append(peer.wait_end(TURN, 0, timeout=10)))
    waiter.start()
    coordinator.publish([token(2, "a")], fence=1, now=True)  # no end yet
    coordinator.publish([end(3)], fence=1)  # not now: the background sends it
    waiter.join(15)
    assert ended == [3]


def test_a_buffer_covers_a_reader_from_just_before_its_first_event_on(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    assert not peer.buffer_covers(TURN, 0)
    coordinator.publish([token(3, "a"), token(4, "b"), token(5, "c")], now=True)  # 1, 2 lost
    for reader in (coordinator, peer):
        assert not reader.buffer_covers(TURN, 0)
        assert not reader.buffer_covers(TURN, 1)  # seq 2 is missing
        assert reader.buffer_covers(TURN, 2)
        assert reader.buffer_covers(TURN, 4)
        assert reader.buffer_covers(TURN, 5)  # read it all: what comes next is on its way
    assert not peer.buffer_covers("another turn", 0)


def test_in_process_readers_see_a_publish_at_once(local_coordinator: LocalCoordinator) -> None:
    local_coordinator.publish([started(1), token(2, "a")], fence=1)
    assert seqs(local_coordinator.read_events(TURN, 0, timeout=0)) == [1, 2]
    assert local_coordinator.buffer_covers(TURN, 0)


def test_redis_readers_see_what_was_sent_and_driver_calls_send_first(
    redis_coordinator: RedisCoordinator,
) -> None:
    coordinator = redis_coordinator
    with flusher_held(coordinator):
        coordinator.publish([started(1), token(2, "a")], fence=1)
        assert coordinator.read_events(TURN, 0, timeout=0) == []  # queued, not sent
        assert not coordinator.buffer_covers(TURN, 0)
        assert coordinator.last_seq(TURN) == 2  # sends first
        assert seqs(coordinator.read_events(TURN, 0, timeout=0)) == [1, 2]
        coordinator.publish([end(3)], fence=1)
        assert coordinator.wait_end(TURN, 0, timeout=0) == 3  # sends first
        coordinator.publish([queued(4)])
        assert coordinator.adopt(TURN, fence=2) == 4  # sends first


# ---------------------------------------------------------------------------- coalescing


def test_a_token_already_sent_takes_no_more_text(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    sent = token(1, "a")
    coordinator.publish([sent], fence=1, now=True)
    assert coordinator.coalesce(sent, "b", fence=1) is None  # the caller publishes anew
    assert peer.read_events(TURN, 0, timeout=0) == [token(1, "a")]


def test_deltas_reach_readers_once_and_in_order_whether_or_not_they_join(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    deltas = [f"d{n} " for n in range(6)]
    with flusher_held(coordinator):  # where deltas can join, they do
        last = token(1, deltas[0])
        coordinator.publish([last], fence=1)
        next_seq = 2
        for text in deltas[1:]:
            merged = coordinator.coalesce(last, text, fence=1)
            if merged is None:
                last = token(next_seq, text)
                next_seq += 1
                coordinator.publish([last], fence=1)
            else:
                last = merged
        coordinator.flush()
    read = peer.read_events(TURN, 0, timeout=0)
    assert "".join(e.data["text"] for e in read) == "".join(deltas)
    assert seqs(read) == list(range(1, next_seq))  # gap-free


def test_the_in_process_coordinator_never_coalesces(local_coordinator: LocalCoordinator) -> None:
    newest = token(1, "a")
    local_coordinator.publish([newest], fence=1)
    assert local_coordinator.coalesce(newest, "b", fence=1) is None  # even the newest
    assert local_coordinator.read_events(TURN, 0, timeout=0) == [token(1, "a")]


def test_the_redis_coordinator_coalesces_while_the_token_is_queued_last(
    redis_coordinator: RedisCoordinator,
) -> None:
    coordinator = redis_coordinator
    with flusher_held(coordinator):
        first = token(1, "a")
        coordinator.publish([first], fence=1)
        assert coordinator.coalesce(first, "b", fence=1) is first
        assert first.data["text"] == "ab"
        call = Event.of(TURN, 2, ToolCalled(step=0, call_id="c", name="x", arguments="{}"))
        coordinator.publish([call], fence=1)
        assert coordinator.coalesce(first, "c", fence=1) is None  # no longer the last
        later = token(3, "c")
        coordinator.publish([later], fence=1)
        coordinator.flush()
        assert coordinator.coalesce(later, "d", fence=1) is None  # sent
    assert coordinator.read_events(TURN, 0, timeout=0) == [token(1, "ab"), call, token(3, "c")]
    assert coordinator.deltas_coalesced == 1


# ---------------------------------------------------------------------------- steers


def test_listed_steers_come_past_the_cursor_in_position_order_once_each(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    coordinator.publish([started(1)], fence=1, now=True)  # a running turn
    for position in (2, 1, 3, 2):  # out of order, and a push retried
        peer.push_steer(TURN, steer(position))
    assert coordinator.steers_after(TURN, 0, fresh=True) == [steer(1), steer(2), steer(3)]
    assert coordinator.steers_after(TURN, 1, fresh=True) == [steer(2), steer(3)]
    assert coordinator.steers_after(TURN, 3, fresh=True) == []
    assert coordinator.steers_after(TURN, 0) == [steer(1), steer(2), steer(3)]  # a recent look
    assert coordinator.steers_after(TURN, 2) == [steer(3)]
    assert coordinator.steers_after("another turn", 0, fresh=True) == []


def test_a_steer_pushed_through_the_same_coordinator_shows_at_once(
    coordinator: Coordinator,
) -> None:
    coordinator.publish([started(1)], fence=1, now=True)
    assert coordinator.steers_after(TURN, 0) == []
    coordinator.push_steer(TURN, steer(1, SteerKind.INTERRUPT))
    assert coordinator.steers_after(TURN, 0) == [steer(1, SteerKind.INTERRUPT)]  # not fresh


def test_publishing_while_listing_steers_does_both_in_one_call(
    coordinator: Coordinator, peer: Coordinator
) -> None:
    coordinator.publish([started(1)], fence=1)  # queued: it goes out first
    peer.push_steer(TURN, steer(1))
    peer.push_steer(TURN, steer(2))
    step = Event.of(TURN, 2, StepCommitted(step=0, text=""))
    assert coordinator.publish_listing_steers([step], 1, TURN, 1) == [steer(2)]
    assert peer.read_events(TURN, 0, timeout=0) == [started(1), step]  # sent: now
    assert coordinator.steers_after(TURN, 0) == [steer(1), steer(2)]
    peer.push_steer(TURN, steer(3))  # after this coordinator's look: the call looks again
    assert coordinator.publish_listing_steers([token(3, "a")], 1, TURN, 0) == [
        steer(1),
        steer(2),
        steer(3),
    ]
    peer.adopt(TURN, fence=2)
    # A driver that lost the turn publishes nothing, but is shown the steers all the same.
    assert coordinator.publish_listing_steers([token(4, "stale")], 1, TURN, 2) == [steer(3)]
    assert seqs(peer.read_events(TURN, 0, timeout=0)) == [1, 2, 3]


def test_the_in_process_coordinator_lists_every_steer_of_a_buffered_turn_only(
    local_coordinator: LocalCoordinator,
) -> None:
    local_coordinator.push_steer(TURN, steer(1))  # no buffer: the store has the steer
    assert local_coordinator.steers_after(TURN, 0, fresh=True) == []
    local_coordinator.publish([started(1)], fence=1)
    for position in range(2, c.STEER_TAIL + 12):
        local_coordinator.push_steer(TURN, steer(position))
    listed = local_coordinator.steers_after(TURN, 0, fresh=True)
    assert [s.position for s in listed] == list(range(2, c.STEER_TAIL + 12))  # no tail


def test_the_redis_coordinator_lists_the_steers_of_any_turn(
    redis_coordinator: RedisCoordinator,
) -> None:
    redis_coordinator.push_steer(TURN, steer(1))  # nothing published for the turn
    assert redis_coordinator.steers_after(TURN, 0, fresh=True) == [steer(1)]


# ---------------------------------------------------------------------------- close


def test_closing_sends_what_is_queued(coordinator: Coordinator, peer: Coordinator) -> None:
    coordinator.publish([started(1), token(2, "last words")], fence=1)
    coordinator.close()
    assert peer.read_events(TURN, 0, timeout=0) == [started(1), token(2, "last words")]
    coordinator.close()  # twice: nothing more to do
