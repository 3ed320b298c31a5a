"""Drive the store the way a driver does, for tests of its concurrency rules."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event

from parley.ports.backend import CommittedStep, FinishReceipt, StepReceipt, TurnEnd
from parley.schemas.events import Event, EventKind
from parley.schemas.messages import StepPayload
from parley.schemas.records import IfBusy, TurnStatus, Usage
from parley.store.database import create_database_engine, migrate
from parley.store.sql_store import SqlStore


@dataclass(frozen=True)
class Driving:
    """A turn claimed by a driver: its ids, the driver's fence, the next free seq."""

    session_id: str
    turn_id: str
    run_id: str
    fence: int
    next_seq: int


class StatementLog:
    """The statements a store runs, by what they read."""

    def __init__(self, store: SqlStore) -> None:
        self.statements: list[str] = []
        event.listen(store.engine, "before_cursor_execute", self._record)

    def _record(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        self.statements.append(statement)

    def count(self, fragment: str) -> int:
        return sum(fragment in s for s in self.statements)


@contextmanager
def migrated_store(url: str) -> Iterator[SqlStore]:
    """A store on a new engine for ``url``, its schema migrated; closed after."""
    engine = create_database_engine(url)
    migrate(engine)
    store = SqlStore(engine)
    try:
        yield store
    finally:
        store.close()


def new_session(store: SqlStore, root: str = "/tmp") -> str:
    return store.create_session(root=root, metadata={}, token_ceiling=None).session_id


def submit(
    store: SqlStore,
    session_id: str,
    prompt: str = "p",
    *,
    announce: Callable[[Event], None] | None = None,
) -> tuple[str, str]:
    """Queue a turn; returns its turn and run ids.  ``announce`` gets its ``queued``
    event once it committed, as a client's announcement does."""
    receipt = store.submit_turn(
        session_id=session_id,
        prompt=prompt,
        request_id=None,
        contract=None,
        if_busy=IfBusy.ENQUEUE,
    )
    if announce is not None and receipt.queued is not None:
        announce(receipt.queued)
    return receipt.turn.turn_id, receipt.turn.run_id


def start(store: SqlStore, session_id: str, worker: str = "w") -> Driving:
    """Take the session (a new fence) and claim its next runnable turn."""
    fence, claim = store.start_drive(session_id, worker=worker, seq_floor=lambda _turn, _fence: 0)
    assert claim is not None, "nothing to claim"
    claimed, _started = claim
    return Driving(
        session_id=session_id,
        turn_id=claimed.turn.turn_id,
        run_id=claimed.run.run_id,
        fence=fence,
        next_seq=claimed.next_seq,
    )


def commit(
    store: SqlStore,
    d: Driving,
    index: int,
    *,
    fence: int | None = None,
    events: Sequence[Event] | None = None,
    close: bool = False,
    end: TurnEnd | None = None,
) -> StepReceipt:
    """Commit step ``index`` (3 input and 2 output tokens) under ``fence`` (default: the
    driver's own), with a ``step`` event at the next free seq unless ``events`` are given;
    with ``end``, ending the turn in the same transaction if nothing is pending."""
    return store.commit_step(
        run_id=d.run_id,
        session_id=d.session_id,
        fence=d.fence if fence is None else fence,
        step=CommittedStep(
            index=index,
            payload=StepPayload(text=f"step {index}", usage=Usage(input_tokens=3, output_tokens=2)),
        ),
        steer_cursor=0,
        events=[Event(turn_id=d.turn_id, seq=d.next_seq + index, kind=EventKind.STEP, data={})]
        if events is None
        else events,
        close_inbox_if_idle=close,
        end=end,
    )


def finish(store: SqlStore, d: Driving, end_seq: int, *, fence: int | None = None) -> FinishReceipt:
    """Finish the turn with reply "r"."""
    return store.finish_turn(
        run_id=d.run_id,
        session_id=d.session_id,
        fence=d.fence if fence is None else fence,
        cursor=0,
        events=[],
        end=TurnEnd(turn_id=d.turn_id, status=TurnStatus.FINISHED, reply="r", end_seq=end_seq),
    )
