"""What a test asserts of a turn's events as a reader gets them: each once, in order
(with no gap but at a takeover, where it can say so); and the text a reader shows of
its tokens."""

from __future__ import annotations

from collections.abc import Sequence

from parley.coordination.constants import TAKEOVER_SEQ_GAP
from parley.schemas.events import Event, EventKind


def assert_once_in_order(events: Sequence[Event], *, gap_free: bool = True) -> None:
    """Each event of a whole turn once and in order (seqs strictly growing); and, unless
    ``gap_free`` is false, growing by one from 1 except where a takeover's ``started``
    numbers past anything the attempt it replaced may have published.  (The
    approval-failure tests' turns, which wait across killed workers and an emptied
    Redis, were seen to go on past a gap at another event than ``started``: they check
    the order only.)"""
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs)), f"a seq twice or out of order: {seqs}"
    if not gap_free:
        return
    previous = 0
    for event in events:
        if event.seq != previous + 1:
            assert event.kind is EventKind.STARTED and event.data["attempt"] > 1, event
            assert previous < event.seq <= previous + TAKEOVER_SEQ_GAP + 1, event
        previous = event.seq


def displayed_text(events: Sequence[Event]) -> str:
    """What a reader shows of a turn's tokens: each ``step_restarted`` drops the text
    shown so far, as the provisional text it retracts."""
    shown = ""
    for event in events:
        if event.kind is EventKind.STEP_RESTARTED:
            shown = ""
        elif event.kind is EventKind.TOKEN:
            shown += event.data["text"]
    return shown
