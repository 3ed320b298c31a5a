"""The store's side of a turn's end: one fenced transaction commits its outcome, reply,
head and prefix, the webhook delivery of the end (if it has a URL to go to), and the
claim of the session's next runnable turn when the driver goes on.

A turn that ends with its last step commits both in the same row updates, provided no
steer is pending (else :class:`StepNotFinal`: the step commits alone); on PostgreSQL
that is one statement (``DialectStatements.end_with_step``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from parley.ports.backend import FinishReceipt, TurnEnd
from parley.schemas.errors import Fenced
from parley.schemas.events import Ended, Event
from parley.schemas.messages import StepPayload
from parley.schemas.records import SteerKind
from parley.store import statements as q
from parley.store.child_turns import ChildTurnStore
from parley.store.claims import Claims, KnownHead
from parley.store.connection import StoreConnection, Transactions
from parley.store.outbox import insert_delivery, insert_push_deliveries
from parley.store.rows import SessionRow, event_row, insert_step, read_pending, write_events


@dataclass(frozen=True, kw_only=True)
class RunCommit:
    """A commit a driver makes under its fence: its run and session, the fence, the steer
    cursor it read up to, the events it stores with the commit, and the time."""

    run_id: str
    session_id: str
    fence: int
    cursor: int
    events: Sequence[Event]
    now: datetime


class StepNotFinal(Exception):
    """A step asked to end its turn cannot: a steer is pending, or the run moved on.  Its
    transaction rolls back and the step commits on its own (which tells which)."""


class TurnEnds:
    """Committing a turn's end (see the module docstring)."""

    def __init__(self, db: Transactions, claims: Claims, children: ChildTurnStore) -> None:
        self._db = db
        self._claims = claims
        self._children = children

    def end_turn(
        self,
        db: StoreConnection,
        commit: RunCommit,
        end: TurnEnd,
        step: tuple[int, StepPayload] | None = None,
    ) -> FinishReceipt:
        """The turn-ending statements of a transaction.  With ``step`` (its index and
        payload) the turn's last step commits in the same row updates, provided no steer
        is pending (else :class:`StepNotFinal`); without, the inbox is closed here and
        what is pending is reported undelivered."""
        if step is not None:
            # Nothing pending (or this fails): nothing undelivered.
            undelivered: tuple[str, ...] = ()
            end_event = _end_event(end, undelivered)
            session = self._end_with_step(db, commit, end, step, end_event)
        else:
            session, undelivered = self._end_alone(db, commit, end)
            end_event = _end_event(end, undelivered)
            write_events(db, self._db.q, [*commit.events, end_event], commit.now)
        return self._after_end(db, commit, end, session, end_event, undelivered)

    def _end_alone(
        self, db: StoreConnection, commit: RunCommit, end: TurnEnd
    ) -> tuple[SessionRow, tuple[str, ...]]:
        """The session's and the run's writes of a turn that ends after its last step:
        the inbox closes, and the says still pending are undelivered (returned)."""
        discarded = end.discarded
        session = self._finish_session(db, commit, end, discarded.total)
        run_id, cursor = commit.run_id, commit.cursor
        closed = db.execute(q.CLOSE_RUNNING, {"b_run_id": run_id}).one_or_none()
        if closed is None:
            raise Fenced(f"run {run_id} is no longer running; not finished")
        if discarded.total:
            db.execute(
                q.CHARGE_RUN,
                {
                    "b_run_id": run_id,
                    "b_input_tokens": discarded.input_tokens,
                    "b_output_tokens": discarded.output_tokens,
                    "b_cached_tokens": discarded.cached_tokens,
                },
            )
        pending = read_pending(db, run_id, cursor) if closed.steer_count > cursor else ()
        # The end event reports what this attempt gives up on; the run keeps every say
        # of the turn that never reached the model, across resumes.
        undelivered = tuple(s.text for s in pending if s.kind is SteerKind.SAY)
        last = max([cursor] + [s.position for s in pending])
        kept = [*(closed.undelivered or ()), *undelivered]
        ended = {**_end_values(end, run_id, last, commit.now), "b_undelivered": kept or None}
        db.execute(q.END_RUN, ended)
        return session, undelivered

    def _after_end(
        self,
        db: StoreConnection,
        commit: RunCommit,
        end: TurnEnd,
        session: SessionRow,
        end_event: Event,
        undelivered: tuple[str, ...],
    ) -> FinishReceipt:
        """What the end's transaction does once the run ended: the end's delivery, the
        prefix, the claim of the next turn."""
        url = session.webhook_url or end.webhook_url
        if url is not None:
            # With the end, in its transaction: delivered at least once (parley.store.outbox).
            insert_delivery(db, delivery_id=str(uuid.uuid4()), run_id=commit.run_id, url=url)
        if session.pushes:  # (a session that never had a configuration has none)
            insert_push_deliveries(db, turn_id=end.turn_id, run_id=commit.run_id)
        generation = self._store_prefix(db, commit, session.prefix_generation, end)
        # Only a turn submitted (or resumed) after this one can be runnable now.
        later = session.turn_count > end.position
        following = (
            self._claims.claim_next(
                db,
                session,
                fence=commit.fence,
                worker=end.worker,
                seq_floor=end.claim_next,
                known=end.known,
                head=_head_after(end, session.head_turn_id, generation),
            )
            if end.claim_next and later
            else None
        )
        # A child turn's end wakes its parent in the same transaction: no end is
        # recorded without the parent learning of it.
        kicks, parent_events = self._children.wake_parent(
            db, session, end.turn_id, end.status.value, commit.now
        )
        return FinishReceipt(
            end_event=end_event,
            undelivered=undelivered,
            head_turn_id=session.head_turn_id,
            prefix_generation=generation,
            next_claim=following,
            later_turns=later,
            kicks=kicks,
            parent_events=parent_events,
        )

    def _finish_session(
        self, db: StoreConnection, commit: RunCommit, end: TurnEnd, tokens: int
    ) -> SessionRow:
        """FINISH_SESSION: the session row as the turn's end leaves it; Fenced if stale."""
        session = db.execute(q.FINISH_SESSION, _finish_values(commit, end, tokens))
        row = session.one_or_none()
        if row is None:
            raise _stale(commit.fence, end)
        return SessionRow.of(row)

    def _end_with_step(
        self,
        db: StoreConnection,
        commit: RunCommit,
        end: TurnEnd,
        step: tuple[int, StepPayload],
        end_event: Event,
    ) -> SessionRow:
        """The session's, the run's and the step's writes of a turn that ends with its
        last step, and the events; returns the session row as they leave it."""
        index, payload = step
        usage = payload.usage
        now = commit.now
        ended = {
            **_end_values(end, commit.run_id, commit.cursor, now),
            "b_index": index,
            "b_input_tokens": usage.input_tokens,
            "b_output_tokens": usage.output_tokens,
            "b_cached_tokens": usage.cached_tokens,
        }
        durable = [e for e in [*commit.events, end_event] if e.kind.durable]
        fused = self._db.q.end_with_step(len(durable))
        if fused is None:
            session = self._finish_session(db, commit, end, usage.total)
            if db.execute(q.END_RUN_WITH_STEP, ended).rowcount != 1:
                raise StepNotFinal
            insert_step(db, self._db.q, commit.run_id, index, payload, now)
            write_events(db, self._db.q, durable, now)
            return session
        values = {
            **_finish_values(commit, end, usage.total),
            **ended,
            "b_payload": payload.to_json(),
        }
        for n, event in enumerate(durable):
            values.update((q.row_key(n, k), v) for k, v in event_row(event).items())
        row = db.execute(fused, values).one_or_none()
        if row is None:
            raise _stale(commit.fence, end)
        if row.advanced != 1:
            raise StepNotFinal
        return SessionRow.of(row)

    def _store_prefix(
        self, db: StoreConnection, commit: RunCommit, generation: int, end: TurnEnd
    ) -> int:
        """Freeze the first committed turn's prefix, or store an explicit refresh as a new
        generation (an identical refresh is a no-op).  Returns the generation in force."""
        prefix, session_id = end.prefix, commit.session_id
        if prefix is None or not end.status.moves_head:
            return generation
        if generation > 0 and (
            not end.refresh_prefix or self._claims.prefix_of(db, session_id, generation) == prefix
        ):
            return generation
        generation += 1
        db.execute(
            q.INSERT_PREFIX,
            {
                "session_id": session_id,
                "generation": generation,
                "payload": prefix.to_json(),
                "created_at": commit.now,
            },
        )
        db.execute(q.SET_GENERATION, {"b_session_id": session_id, "b_generation": generation})
        return generation


def _stale(fence: int, end: TurnEnd) -> Fenced:
    return Fenced(f"fence {fence} is stale; turn {end.turn_id} not finished")


def _finish_values(commit: RunCommit, end: TurnEnd, tokens: int) -> dict[str, Any]:
    """FINISH_SESSION's values: ``tokens`` are those of a step committed with the end, or
    of one thrown away (TurnEnd.discarded)."""
    return {
        "b_session_id": commit.session_id,
        "b_fence": commit.fence,
        "b_move_head": end.status.moves_head,
        "b_turn_id": end.turn_id,
        "b_tokens": tokens,
        "b_now": commit.now,
    }


def _end_values(end: TurnEnd, run_id: str, cursor: int, now: datetime) -> dict[str, Any]:
    """END_RUN's values but ``undelivered`` (and END_RUN_WITH_STEP's, but for the
    step's)."""
    status = end.status
    return {
        "b_run_id": run_id,
        "b_status": status.value,
        "b_reply": end.reply if status.has_reply else None,
        "b_error": end.error,
        "b_partial": end.partial,
        "b_cursor": cursor,
        "b_now": now,
        "b_seq": end.end_seq,
    }


def _end_event(end: TurnEnd, undelivered: tuple[str, ...]) -> Event:
    """The ``end`` event of a turn ending as ``end`` says."""
    return Event.of(
        end.turn_id,
        end.end_seq,
        Ended(
            outcome=end.status.value,
            reply=end.reply,
            error=end.error,
            undelivered=undelivered,
            approvals=end.approvals,
        ),
    )


def _head_after(end: TurnEnd, head: str | None, generation: int) -> KnownHead:
    """What the claim after ``end`` may take as read; ``head`` and ``generation`` are as
    the ending transaction left them."""
    if not (end.status.moves_head and head == end.turn_id):
        return KnownHead(turn_id=head, generation=generation, prefix=None, path=None)
    # The turn now heads the session, and the prefix in force is the one it ran with: it
    # was frozen or refreshed just now, or was the frozen one already.
    path = None
    ancestors, last = end.path[:-1], end.path[-1] if end.path else None
    if (
        last is not None
        and last.turn_id == end.turn_id
        and all(t.status.settled for t in ancestors)
    ):
        # Parent links are set once and settled turns never change: the path its claim
        # read is still the path, with the turn itself at its outcome.
        reply = end.reply if end.status.has_reply else None
        path = (*ancestors, replace(last, status=end.status, reply=reply))
    return KnownHead(
        turn_id=head, generation=generation, prefix=end.prefix, path=path, compaction=end.compaction
    )
