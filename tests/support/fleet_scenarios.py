"""Fleet scenarios more than one deployment is held to (the failure suite's fleet, and
the same fleet behind PgBouncer): each drives a :class:`~tests.support.chaos.Chaos`
fleet and asserts what must hold."""

from __future__ import annotations

import os
import signal
import threading
import time

import parley
from parley.schemas.events import EventKind
from tests.support.chaos import Chaos
from tests.support.events import assert_once_in_order


def steers_and_rejoining_readers(chaos: Chaos, *, sessions: int = 6, turns: int = 3) -> None:
    """``turns`` turns queued in each of ``sessions`` sessions, each steered before it
    starts, each followed by a reader that drops its stream after five events and comes
    back: every steer lands at its turn's first boundary, every reader sees each event
    once and in order, and each session's turns run in submission order, each under the
    one before."""
    chaos.control.script(
        [
            {
                "when": "busy",
                "steps": [
                    {
                        # A quarter of a second, so that the say sent right after the
                        # submission finds the turn at its first step however loaded
                        # the machine (it ended first once, on the shared topology).
                        "text": "reading the workspace ",
                        "chunk_chars": 3,
                        "delay_ms": 30,
                        "tool_calls": [{"name": "list_files"}],
                    },
                    {"text": "re: {last_message}", "chunk_chars": 3, "delay_ms": 2},
                ],
            }
        ]
    )
    opened = [chaos.client.open_session(chaos.workspace) for _ in range(sessions)]
    handles = []
    for n in range(turns):
        for session in opened:
            handle = session.submit(f"busy {n}")
            handle.say(f"steer for turn {n}")  # queued: lands at the first boundary
            handles.append(handle)

    seen: dict[str, list[parley.Event]] = {}

    def read_with_a_reconnect(handle: parley.TurnHandle) -> None:
        events: list[parley.Event] = []
        for event in handle.events():  # drop the connection after 5 events...
            events.append(event)
            if len(events) == 5:
                break
        events.extend(handle.events(after=events[-1].seq))  # ...and come back
        seen[handle.turn_id] = events

    readers = [threading.Thread(target=read_with_a_reconnect, args=(h,)) for h in handles]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(90)
    for handle in handles:
        result = handle.wait(60)
        prompt = handle.record().prompt
        assert result.reply == f"re: steer for turn {prompt.split()[-1]}"
        events = seen[handle.turn_id]
        assert_once_in_order(events)
        assert events[-1].kind is EventKind.END
    for session in opened:
        history = session.history()
        assert [t.prompt for t in history] == [f"busy {n}" for n in range(turns)]
        parents = [None] + [t.turn_id for t in history[:-1]]
        assert [t.parent_id for t in history] == parents


def killed_during_a_tool_call(chaos: Chaos) -> tuple[parley.TurnHandle, float]:
    """A worker SIGKILLed while its turn's second step runs a tool: another worker
    takes the turn over and redoes that step (its tool runs again), and the turn
    finishes with every step once.  Returns the turn, for what a caller checks more,
    and the seconds from the kill to its end."""
    chaos.control.script(
        [
            {
                "when": "crash",
                "steps": [
                    {"tool_calls": [{"name": "list_files"}]},
                    {"tool_calls": [{"name": "wait_for_gate"}]},
                    {"text": "done"},
                ],
            }
        ]
    )
    handle = chaos.client.open_session(chaos.workspace).submit("crash inside a tool")
    chaos.control.wait_entered()
    victim = chaos.driver_pid(handle.turn_id)
    os.killpg(chaos.worker_group_of(victim), signal.SIGKILL)
    killed_at = time.monotonic()
    chaos.control.open_gate()
    result = handle.wait(60)
    recovered_in = time.monotonic() - killed_at
    assert (result.turn_id, result.run_id) == (handle.turn_id, handle.run_id)
    assert result.outcome is parley.TurnStatus.FINISHED and result.reply == "done"
    assert [s.index for s in chaos.client.store.steps_of(handle.turn_id)] == [0, 1, 2]
    state = chaos.client.store.run_state(handle.turn_id)
    assert state.attempts == 2 and chaos.driver_pid(handle.turn_id) != victim
    assert chaos.control.gate_calls == 2  # the uncommitted step ran its tool again
    return handle, recovered_in


def submit_load(chaos: Chaos, sessions: int, turns: int) -> list[list[parley.TurnHandle]]:
    """``turns`` two-step turns (a tool, then streamed text) queued in each of
    ``sessions`` sessions: the handles, by session."""
    chaos.control.script(
        [
            {
                "when": "load",
                "steps": [
                    {
                        "text": "working ",
                        "chunk_chars": 2,
                        "delay_ms": 5,
                        "tool_calls": [{"name": "list_files"}],
                    },
                    {"text": "done: {prompt}", "chunk_chars": 4, "delay_ms": 5},
                ],
            }
        ]
    )
    opened = [chaos.client.open_session(chaos.workspace) for _ in range(sessions)]
    return [[s.submit(f"load {n} of {s.id[:8]}") for n in range(turns)] for s in opened]


def assert_completed_once_in_order(chaos: Chaos, load: list[list[parley.TurnHandle]]) -> None:
    """Every turn of ``load`` finished, each step once, with its reply, and each
    session's turns in submission order."""
    for handles in load:
        results = [h.wait(90) for h in handles]
        assert all(r.outcome is parley.TurnStatus.FINISHED for r in results)
        for handle, result in zip(handles, results, strict=True):
            assert [s.index for s in chaos.client.store.steps_of(handle.turn_id)] == [0, 1]
            assert result.reply == f"done: {handle.record().prompt}"
        session = chaos.client.session(handles[0].session_id)
        assert [t.turn_id for t in session.history()] == [h.turn_id for h in handles]
