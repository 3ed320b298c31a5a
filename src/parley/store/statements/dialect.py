"""The statements whose SQL differs per dialect: idempotent inserts, the lease upsert,
and PostgreSQL's one-statement forms (data-modifying CTEs) of a claim, a drive's start
and a turn's end with its last step."""

from __future__ import annotations

from typing import Any

from sqlalchemy import String, all_, and_, case, func, literal, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from parley.schemas import tables as t
from parley.schemas.events import EventKind
from parley.store.statements.binds import MAX_INSERT_ROWS, b, many_rows
from parley.store.statements.events import EVENT_COLUMNS, INSERT_QUEUED
from parley.store.statements.run_status import RUNNING
from parley.store.statements.runs import END_RUN_WITH_STEP, INSERT_RUN, NEXT_RUN
from parley.store.statements.sessions import BUMP_TURN_COUNT, FINISH_SESSION, TAKE_FENCE
from parley.store.statements.turns import INSERT_TURN

WINDOW_LOCK_KEY = -4933941432433228011
"""The batch window's advisory lock: the first 8 bytes of SHA-1("parley.batch_window"),
signed, so as not to meet another application's lock on the same database."""


class DialectStatements:
    """The statements whose SQL differs per dialect: idempotent inserts."""

    def __init__(self, dialect: str) -> None:
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        # A cold shutdown can interrupt a COMMIT whose retry then finds the row written.
        self.insert_step = insert(t.steps).on_conflict_do_nothing()
        self.insert_events = insert(t.events).on_conflict_do_nothing()
        # A schedule's slot is claimed by its row (docs/time.md#schedules): a beat whose
        # insert finds the row there returns nothing, and fires nothing.
        self.claim_slot = (
            insert(t.schedule_runs).on_conflict_do_nothing().returning(t.schedule_runs.c.slot_at)
        )
        # One statement and one round trip where three would take three: data-modifying
        # CTEs (PostgreSQL only; foreign keys are checked at the end of the statement).
        postgres = dialect == "postgresql"
        self.insert_submission = (
            INSERT_QUEUED.add_cte(INSERT_TURN.cte("new_turn"), INSERT_RUN.cte("new_run"))
            if postgres
            else None
        )
        self.submit_plain = _submit_plain() if postgres else None
        lease = insert(t.session_leases).values(
            session_id=b("session_id"), owner=b("owner"), expires_at=b("expires_at")
        )
        # Taken when free, expired or already ours; a live holder's row is left alone,
        # and then nothing is returned.
        self.take_lease = lease.on_conflict_do_update(
            index_elements=[t.session_leases.c.session_id],
            set_={"owner": lease.excluded.owner, "expires_at": lease.excluded.expires_at},
            where=or_(
                t.session_leases.c.owner == lease.excluded.owner,
                t.session_leases.c.expires_at < b("now"),
            ),
        ).returning(t.session_leases.c.owner)
        # The batch window's places are given under one lock, fleet-wide: a transaction's
        # advisory lock on PostgreSQL (released with it, so a pooler in transaction mode
        # keeps nothing); SQLite's BEGIN IMMEDIATE serialises writers already.
        self.lock_window = (
            select(func.pg_advisory_xact_lock(literal(WINDOW_LOCK_KEY))) if postgres else None
        )
        self.claim_next = _claim_next_fresh() if postgres else None
        self.start_drive = _start_drive_fresh() if postgres else None
        self._postgres = postgres
        self._end_with_step: dict[int, Any] = {}

    def end_with_step(self, events: int) -> Any:
        """PostgreSQL: a turn's end with its last step, in one statement (None elsewhere,
        or past ``MAX_INSERT_ROWS`` events, a step of many tool calls).  See
        :func:`_end_with_step`; built once per number of events stored with it."""
        if not self._postgres or events > MAX_INSERT_ROWS:
            return None
        statement = self._end_with_step.get(events)
        if statement is None:
            statement = self._end_with_step[events] = _end_with_step(events)
        return statement


def _end_with_step(events: int) -> Any:
    """FINISH_SESSION, END_RUN_WITH_STEP, and the inserts of the step and of ``events``
    events (see :func:`many_rows` for their binds' names), in one statement where they
    take four.
    Returns the session row as FINISH_SESSION does (none when the fence is stale) and
    ``advanced``, the runs END_RUN_WITH_STEP updated.  It runs in a transaction that
    rolls back unless both hold: the statement's parts run whatever the others find.

    The run update waits for the session's (its condition reads it), so rows are locked
    in the order every writer takes them: session, then run."""
    finish = FINISH_SESSION.cte("finish")
    ended = (
        END_RUN_WITH_STEP.where(select(finish.c.id).exists()).returning(t.runs.c.id).cte("ended")
    )
    step = (
        postgresql.insert(t.steps)
        .values(
            run_id=b("run_id"), step_index=b("index"), payload=b("payload"), created_at=b("now")
        )
        .on_conflict_do_nothing()
        .cte("step")
    )
    stored = many_rows(
        postgresql.insert(t.events).on_conflict_do_nothing(),
        EVENT_COLUMNS,
        events,
        shared={"created_at": b("now")},
    ).cte("stored")
    advanced = select(func.count()).select_from(ended).scalar_subquery()
    return select(*finish.c, advanced.label("advanced")).add_cte(step, stored)


def _submit_plain() -> Any:
    """A plain submission (no request id, nothing asked of the turns before it) in one
    statement, which runs on its own, committed as it returns: BUMP_TURN_COUNT, titling
    the session with ``title`` if this is its first turn and it has none, and the
    inserts of the turn, its queued run and its ``queued`` event at the position the
    count gives (one round trip where a transaction of two statements takes four).
    Returns the position.  A missing session violates the turn's foreign key, so the
    statement fails whole and changes nothing.

    It locks the session row first, as every writer does; the run's tenant is read
    from the row as the statement found it (the count changes nothing else)."""
    bumped = (
        BUMP_TURN_COUNT.values(
            title=case(
                (
                    and_(t.sessions.c.turn_count == 0, t.sessions.c.title.is_(None)),
                    b("title", type_=t.sessions.c.title.type),
                ),
                else_=t.sessions.c.title,
            )
        )
    ).cte("bumped")
    position = select(bumped.c.turn_count).scalar_subquery()
    turn = INSERT_TURN.values(ordinal=position).cte("new_turn")
    # (Run on psycopg directly, where a column's Python-side default inside a CTE would
    # be sent as NULL: every column is given.)
    run = INSERT_RUN.values(queue_position=position, approval_count=0).cte("new_run")
    queued = INSERT_QUEUED.cte("queued")
    return select(bumped.c.turn_count).add_cte(turn, run, queued)


def _claim_next_fresh() -> Any:
    """NEXT_RUN, and when that run never started, its claim: SET_PARENT, CLAIM_RUN and the
    insert of its ``started`` event, all in one statement (PostgreSQL's data-modifying
    CTEs) where four take four round trips.  A run that started before is only read and
    locked: its claim must first adopt what its events' buffer holds.  Returns the run
    as NEXT_RUN does, as it was before the claim, and ``claimed``."""
    run, claim, writes = _fresh_claim(b("head"))
    return (
        select(run, claim.c.id.is_not(None).label("claimed"))
        .outerjoin(claim, claim.c.id == run.c.id)
        .add_cte(*writes)
    )


SESSION_COLUMNS = tuple(c.name for c in t.sessions.c)
RUN_PREFIX = "run_"


def _start_drive_fresh() -> Any:
    """TAKE_FENCE and ``_claim_next_fresh`` in one statement, for a driver that just took
    the session's lock, run on its own (autocommit): one round trip where a transaction
    takes four.  The run's columns carry the ``run_`` prefix beside the session's.

    One statement reads one snapshot, taken before the fence update waits for a
    submission holding the session row: a run that submission committed meanwhile is
    not seen.  ``seen`` is the session's ``turn_count`` in that snapshot (a plain read of
    the row, beside the update); the one the update returns, read after the wait, is
    higher exactly when the snapshot missed a submission (or a resume)."""
    session = TAKE_FENCE.cte("session")
    seen = (
        select(t.sessions.c.turn_count.label("position"))
        .where(t.sessions.c.id == b("session_id"))
        .cte("seen")
    )
    run, claim, writes = _fresh_claim(select(session.c.head_turn_id).scalar_subquery())
    return (
        select(
            *(session.c[name] for name in SESSION_COLUMNS),
            *(column.label(RUN_PREFIX + column.name) for column in run.c),
            claim.c.id.is_not(None).label("claimed"),
            seen.c.position.label("seen"),
        )
        .select_from(session)
        .join(seen, literal(True))
        .outerjoin(run, literal(True))
        .outerjoin(claim, claim.c.id == run.c.id)
        .add_cte(*writes)
    )


def _fresh_claim(head: Any) -> tuple[Any, Any, tuple[Any, ...]]:
    """The parts of a fresh claim hung under ``head``: the next run (NEXT_RUN), its claim
    (returning its id), and the writes nothing reads (parent, ``started`` event)."""
    run = NEXT_RUN.cte("next_run")
    # Never started, due, and in the interactive lane (of a tenant not held back) or
    # holding a place in the batch window; the others are left to the caller (claims.py:
    # they wait for their time or their lane, or are promoted).
    fresh = and_(
        run.c.attempts == 0,
        # A delayed turn whose time has not come is left alone (claims.py: it holds its
        # session's line, and nothing else, until then).
        or_(run.c.not_before.is_(None), run.c.not_before <= b("now")),
        or_(
            and_(
                run.c.priority != literal("batch"),
                # An array, not an expanding IN: the statement's text stays the same
                # whatever the list, so it runs on psycopg directly, prepared.
                run.c.tenant != all_(b("held_back", type_=postgresql.ARRAY(String))),
            ),
            run.c.placed_at.is_not(None),
        ),
    )
    claim = (
        update(t.runs)
        .where(t.runs.c.id == run.c.id, fresh)
        .values(
            status=RUNNING,
            attempts=1,
            stalled_attempts=1,
            worker=b("worker"),
            started_at=b("now"),
            inbox_open=True,
            last_seq=run.c.last_seq + 1,
            not_before=None,
        )
        .returning(t.runs.c.id)
        .cte("claim")
    )
    hang = (
        update(t.turns)
        .where(t.turns.c.id == run.c.turn_id, fresh, t.turns.c.parent_id.is_distinct_from(head))
        .values(parent_id=head)
        .cte("hang")
    )
    started = (
        postgresql.insert(t.events)
        .from_select(
            ["turn_id", "seq", "kind", "data", "created_at"],
            select(
                run.c.turn_id,
                run.c.last_seq + 1,
                literal(EventKind.STARTED.value),
                func.jsonb_build_object(
                    "run_id", run.c.id, "attempt", 1, "worker", b("worker", type_=String())
                ),
                b("now"),
            ).where(fresh),
        )
        .on_conflict_do_nothing()
        .cte("started")
    )
    return run, claim, (hang, started)
