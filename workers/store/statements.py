"""Every SQL statement parley runs, built once and named.

Statements take their values as bind parameters, so SQLAlchemy compiles each one once
per dialect and a call only binds values (building a statement per call cost more than
running it).  Bind names carry a ``b_`` prefix: SQLAlchemy reserves column names for the
SET and VALUES clauses.  Row locks (``FOR UPDATE``) render on PostgreSQL only; SQLite
serialises writers with ``BEGIN IMMEDIATE`` instead.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Boolean,
    String,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from schemas import tables as t
from schemas.events import EventKind
from schemas.records import TurnStatus
from workers.store.connection import MAX_INSERT_ROWS, many_rows

QUEUED = TurnStatus.QUEUED.value
RUNNING = TurnStatus.RUNNING.value
WAITING = TurnStatus.WAITING.value
ACTIVE = (QUEUED, RUNNING)
UNFINISHED = (*ACTIVE, WAITING)
RESUMABLE = tuple(s.value for s in TurnStatus if s.resumable)

# Queued or running, spelt with fixed binds rather than an IN list: SQLAlchemy expands an
# IN list on every execution, while this is the same SQL each time (prepared once, and
# run straight through psycopg; see workers.store.connection).
IS_ACTIVE = or_(t.runs.c.status == QUEUED, t.runs.c.status == RUNNING)
# Not ended: active, or waiting for answers (a waiting run holds its session's place in
# line: the turns after it wait too, though no driver holds the session meanwhile).
IS_UNFINISHED = or_(IS_ACTIVE, t.runs.c.status == WAITING)


EVENT_COLUMNS = ("turn_id", "seq", "kind", "data")
"""An event row's columns but ``created_at`` (the time of the transaction storing it)."""


def b(name: str, **kwargs: Any) -> Any:
    """A bind parameter named ``b_<name>``."""
    return bindparam(f"b_{name}", **kwargs)


# ------------------------------------------------------------------ sessions

SESSION = select(t.sessions).where(t.sessions.c.id == b("session_id"))

SESSIONS_OF_TENANT = (
    select(t.sessions)
    .where(t.sessions.c.tenant == b("tenant"))
    .order_by(t.sessions.c.created_at.desc(), t.sessions.c.id.desc())
    .limit(b("limit"))
)
# Keyset paging: the sessions after (older than) a page's last one.
SESSIONS_OF_TENANT_BEFORE = SESSIONS_OF_TENANT.where(
    tuple_(t.sessions.c.created_at, t.sessions.c.id)
    < tuple_(
        b("created_at", type_=t.sessions.c.created_at.type), b("id", type_=t.sessions.c.id.type)
    )
)

SET_HEAD = (
    update(t.sessions).where(t.sessions.c.id == b("session_id")).values(head_turn_id=b("head"))
)

SET_TITLE = update(t.sessions).where(t.sessions.c.id == b("session_id")).values(title=b("title"))
# The first turn's prompt titles a session that has no title yet.
SET_TITLE_IF_NONE = SET_TITLE.where(t.sessions.c.title.is_(None))

BUMP_TURN_COUNT = (
    update(t.sessions)
    .where(t.sessions.c.id == b("session_id"))
    .values(turn_count=t.sessions.c.turn_count + 1)
    .returning(t.sessions.c.turn_count)
)

# Returns the whole row: a driver's first claim needs it, and this saves reading it.
TAKE_FENCE = (
    update(t.sessions)
    .where(t.sessions.c.id == b("session_id"))
    .values(fence=t.sessions.c.fence + 1)
    .returning(*t.sessions.c)
)

LOCK_SESSION = SESSION.with_for_update()

# The fence check of a step commit: charge the tokens only while the fence still holds.
CHARGE_SESSION = (
    update(t.sessions)
    .where(t.sessions.c.id == b("session_id"), t.sessions.c.fence == b("fence"))
    .values(tokens_used=t.sessions.c.tokens_used + b("tokens"))
)

# What a turn spent on a step it threw away (nothing of the step is stored).
CHARGE_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"))
    .values(
        input_tokens=t.runs.c.input_tokens + b("input_tokens"),
        output_tokens=t.runs.c.output_tokens + b("output_tokens"),
        cached_tokens=t.runs.c.cached_tokens + b("cached_tokens"),
    )
)

# The fence check of a turn commit: move the head (or leave it) while the fence holds,
# and charge the tokens of the step that commits with it, if one does.  A turn's end is
# its session's newest activity, which retention counts from.
FINISH_SESSION = (
    update(t.sessions)
    .where(t.sessions.c.id == b("session_id"), t.sessions.c.fence == b("fence"))
    .values(
        head_turn_id=case(
            (b("move_head", type_=Boolean()), b("turn_id")), else_=t.sessions.c.head_turn_id
        ),
        tokens_used=t.sessions.c.tokens_used + b("tokens"),
        last_active_at=b("now"),
    )
    .returning(*t.sessions.c)
)

SET_GENERATION = (
    update(t.sessions)
    .where(t.sessions.c.id == b("session_id"))
    .values(prefix_generation=b("generation"))
)

PREFIX = select(t.prefixes.c.payload).where(
    t.prefixes.c.session_id == b("session_id"), t.prefixes.c.generation == b("generation")
)

INSERT_PREFIX = t.prefixes.insert()

INSERT_SESSION = t.sessions.insert()

# In the words of the partial index ix_runs_active, so PostgreSQL reads it instead of
# the runs.  (Only the fleet's sweeper asks; SQLite, without statistics, may not.)
_waiting = t.runs.alias("waiting")
# Sessions a driver has something to do for: a queued or running turn, and no turn
# waiting for answers (which the turns after it wait behind: a kick would find nothing).
SESSIONS_WITH_WORK = (
    select(t.runs.c.session_id)
    .where(
        text(t.ACTIVE_RUN),
        ~select(_waiting.c.id)
        .where(
            _waiting.c.session_id == t.runs.c.session_id,
            # Spelt out, as ACTIVE_RUN is: the sweeper's statement has no binds at all.
            _waiting.c.status == literal_column(f"'{WAITING}'"),
        )
        .exists(),
    )
    .distinct()
)

# ------------------------------------------------------------------ turns

TURN_COLUMNS = select(
    t.turns.c.id,
    t.turns.c.session_id,
    t.turns.c.parent_id,
    t.turns.c.prompt,
    t.turns.c.request_id,
    t.turns.c.created_at,
    t.runs.c.id.label("run_id"),
    t.runs.c.status,
    t.runs.c.reply,
).join(t.runs, t.runs.c.turn_id == t.turns.c.id)

TURN = TURN_COLUMNS.where(t.turns.c.id == b("turn_id"))

# A turn and the tenant of its session, in one round trip (the gateway's check on every
# route about a turn).
TURN_AND_TENANT = (
    TURN_COLUMNS.add_columns(t.sessions.c.tenant)
    .join(t.sessions, t.sessions.c.id == t.turns.c.session_id)
    .where(t.turns.c.id == b("turn_id"))
)

TURN_BY_REQUEST = TURN_COLUMNS.where(
    t.turns.c.session_id == b("session_id"), t.turns.c.request_id == b("request_id")
)

TREE = TURN_COLUMNS.where(t.turns.c.session_id == b("session_id")).order_by(t.turns.c.ordinal)

TURN_OWNER = select(t.turns.c.session_id).where(t.turns.c.id == b("turn_id"))

# A turn that hangs under the given one, if any (a resume refuses to extend its parent).
CHILD_OF_TURN = select(t.turns.c.id).where(t.turns.c.parent_id == b("turn_id")).limit(1)


def _path() -> Any:
    # Walk parent links from a head in one recursive query (same SQL on both back ends),
    # each level looking its parent up by primary key.  (A join of the walk to ``turns``
    # lets PostgreSQL, which plans a recursive term for a work table of ten rows, scan
    # the whole table at every level while it holds some thousands of turns: a path of n
    # turns then cost n table scans, and turn 2000 of one session 225 ms instead of 30.)
    head = b("head", type_=t.turns.c.id.type)
    walk = select(head.label("id"), literal(0).label("depth")).cte("walk", recursive=True)
    parent = select(t.turns.c.parent_id).where(t.turns.c.id == walk.c.id).scalar_subquery()
    walk = walk.union_all(
        select(parent, (walk.c.depth + 1).label("depth")).where(walk.c.id.is_not(None))
    )
    return TURN_COLUMNS.join(walk, walk.c.id == t.turns.c.id).order_by(walk.c.depth.desc())


PATH = _path()

SET_PARENT = update(t.turns).where(t.turns.c.id == b("turn_id")).values(parent_id=b("parent_id"))

# A submission's rows: its turn (no parent until it starts), its queued run, and the
# run's ``queued`` event.  They share one set of parameters, so PostgreSQL can run them
# as one statement (DialectStatements.insert_submission).
INSERT_TURN = insert(t.turns).values(
    id=b("turn_id"),
    session_id=b("session_id"),
    parent_id=None,
    ordinal=b("position"),
    prompt=b("prompt"),
    request_id=b("request_id"),
    created_at=b("now"),
)

# ------------------------------------------------------------------ runs

RUN_BY_TURN = select(t.runs).where(t.runs.c.turn_id == b("turn_id"))

LOCK_RUN_BY_TURN = RUN_BY_TURN.with_for_update()

LOCK_RUN = select(t.runs.c.id).where(t.runs.c.id == b("run_id")).with_for_update()

RUN_BY_ID = select(t.runs).where(t.runs.c.id == b("run_id"))

SESSION_OF_TURN = select(t.runs.c.session_id).where(t.runs.c.turn_id == b("turn_id"))

RUN_ID_OF_TURN = select(t.runs.c.id).where(t.runs.c.turn_id == b("turn_id"))

RUN_STATUS = select(t.runs.c.status).where(t.runs.c.id == b("run_id"))

ACTIVE_RUNS = select(t.runs.c.id, t.runs.c.turn_id, t.runs.c.status).where(
    t.runs.c.session_id == b("session_id"), IS_UNFINISHED
)

# The run to drive next, locked: a stranded running one first, then the oldest queued,
# unless a waiting one comes before it (then nothing is runnable: the caller sees it).
NEXT_RUN = (
    select(
        t.runs,
        t.turns.c.parent_id,
        t.turns.c.prompt,
        t.turns.c.request_id,
        t.turns.c.created_at.label("turn_created_at"),
    )
    .join(t.turns, t.turns.c.id == t.runs.c.turn_id)
    .where(t.runs.c.session_id == b("session_id"), IS_UNFINISHED)
    .order_by(case((t.runs.c.status == RUNNING, 0), else_=1), t.runs.c.queue_position)
    .limit(1)
    .with_for_update(of=t.runs)
)

# Every column given, defaults included, so SQLAlchemy has none to fill in per call.
INSERT_RUN = insert(t.runs).values(
    id=b("run_id"),
    turn_id=b("turn_id"),
    session_id=b("session_id"),
    status=QUEUED,
    attempts=0,
    stalled_attempts=0,
    contract=b("contract"),
    host_context=b("host_context", type_=t.Json),
    steps=0,
    input_tokens=0,
    output_tokens=0,
    cached_tokens=0,
    steer_count=0,
    steer_cursor=0,
    inbox_open=True,
    last_seq=1,
    queued_at=b("now"),
    queue_position=b("position"),
)

INSERT_QUEUED = insert(t.events).values(
    turn_id=b("turn_id"), seq=1, kind=EventKind.QUEUED.value, data=b("data"), created_at=b("now")
)

CLAIM_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"))
    .values(
        status=RUNNING,
        attempts=t.runs.c.attempts + 1,
        stalled_attempts=t.runs.c.stalled_attempts + 1,
        worker=b("worker"),
        started_at=func.coalesce(t.runs.c.started_at, b("now")),
        inbox_open=True,
        last_seq=b("seq"),
    )
)

# What committing a step adds to its run.
_STEP_VALUES = {
    "steps": t.runs.c.steps + 1,
    "input_tokens": t.runs.c.input_tokens + b("input_tokens"),
    "output_tokens": t.runs.c.output_tokens + b("output_tokens"),
    "cached_tokens": t.runs.c.cached_tokens + b("cached_tokens"),
    "steer_cursor": b("cursor"),
    # A committed step is progress: the attempts that count towards giving up start over.
    "stalled_attempts": 0,
    # A step that waited for answers is held no more once it commits.
    "held_step": null(),
}

# The step the caller thinks comes next, of a run that is still running: a replayed or
# stale commit matches nothing.
_NEXT_STEP = (t.runs.c.status == RUNNING, t.runs.c.steps == b("index"))

ADVANCE_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), *_NEXT_STEP)
    .values(
        **_STEP_VALUES,
        last_seq=case((t.runs.c.last_seq > b("last_seq"), t.runs.c.last_seq), else_=b("last_seq")),
        # The model stopped and no steer is pending: close the inbox in the same row
        # update that holds the lock a concurrent say() needs.
        inbox_open=case(
            (
                (b("close", type_=Boolean()) & (t.runs.c.steer_count == b("cursor"))),
                False,
            ),
            else_=t.runs.c.inbox_open,
        ),
    )
    .returning(t.runs.c.steer_count)
)

CLOSE_INBOX = update(t.runs).where(t.runs.c.id == b("run_id")).values(inbox_open=False)

# Closing the inbox first takes the run row's lock for the rest of the turn commit; it
# returns what an earlier attempt's end reported undelivered, which this end keeps.
CLOSE_RUNNING = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.status == RUNNING)
    .values(inbox_open=False)
    .returning(t.runs.c.steer_count, t.runs.c.undelivered)
)

_END_VALUES = {
    "status": b("status"),
    "reply": b("reply"),
    "error": b("error"),
    "partial": b("partial"),
    "steer_cursor": b("cursor"),
    "ended_at": b("now"),
    "last_seq": b("seq"),
}

# ``undelivered``: every say of the run that never reached a committed step, this
# attempt's and those of the attempts before a resume.
END_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"))
    .values(**_END_VALUES, undelivered=b("undelivered", type_=t.Json))
)

# A final step and its turn's end in one row update (one statement where ADVANCE_RUN and
# END_RUN take two), which leaves ``undelivered`` as an earlier attempt's end left it
# (nothing is pending now).  It also requires that no steer was accepted past the cursor: the
# update takes the run row's lock that a concurrent say() needs, so a steer either
# counted before (and this matches nothing) or finds the inbox closed.
END_RUN_WITH_STEP = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), *_NEXT_STEP, t.runs.c.steer_count == b("cursor"))
    .values({**_STEP_VALUES, **_END_VALUES, "inbox_open": False})
)

RESUME_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"))
    .values(
        status=QUEUED,
        queued_at=b("now"),
        queue_position=b("position"),
        # Whoever resumes a turn that gave up gives it a fresh set of attempts.
        stalled_attempts=0,
        inbox_open=True,
        error=None,
        reply=None,
        last_seq=b("seq"),
    )
)

# ------------------------------------------------------------------ the fleet's state

# How many runs are queued, running and waiting, and the oldest ``queued_at`` of each:
# the unfinished work of every session (``parley status``).
UNFINISHED_BY_STATUS = (
    select(
        t.runs.c.status,
        func.count().label("runs"),
        func.min(t.runs.c.queued_at).label("oldest"),
    )
    .where(IS_UNFINISHED)
    .group_by(t.runs.c.status)
)

# The runs of one unfinished status, oldest in line first, at most ``limit``; a waiting
# one with the time its oldest unanswered call asked.
UNFINISHED_OF_STATUS = (
    select(
        t.runs.c.turn_id,
        t.runs.c.session_id,
        t.runs.c.status,
        t.runs.c.worker,
        t.runs.c.steps,
        t.runs.c.attempts,
        t.runs.c.queued_at,
        t.runs.c.started_at,
        select(func.min(t.approvals.c.requested_at))
        .where(t.approvals.c.run_id == t.runs.c.id, t.approvals.c.decision.is_(None))
        .scalar_subquery()
        .label("asked_at"),
    )
    .where(t.runs.c.status == b("status"))
    .order_by(t.runs.c.queued_at, t.runs.c.id)
    .limit(b("limit"))
)

# ------------------------------------------------------------------ session leases

# Which embedded process drives a session (see schemas.tables.session_leases).  Taking a
# lease is one statement per dialect (an upsert that only overwrites the holder's own
# row or an expired one): DialectStatements.take_lease.
_leases = t.session_leases

TAKE_LEASE_OF_THE_DEAD = (
    update(_leases)
    .where(_leases.c.session_id == b("session_id"), _leases.c.owner == b("dead"))
    .values(owner=b("owner"), expires_at=b("expires_at"))
)

LEASE_HOLDER = select(_leases.c.owner).where(_leases.c.session_id == b("session_id"))

RENEW_LEASES = (
    update(_leases)
    .where(
        _leases.c.owner == b("owner"),
        _leases.c.session_id.in_(b("session_ids", expanding=True)),
    )
    .values(expires_at=b("expires_at"))
)

RELEASE_LEASE = delete(_leases).where(
    _leases.c.session_id == b("session_id"), _leases.c.owner == b("owner")
)

LEASES_OF = select(_leases.c.session_id, _leases.c.owner, _leases.c.expires_at).where(
    _leases.c.session_id.in_(b("session_ids", expanding=True))
)


# ------------------------------------------------------------------ steps, steers, events

STEPS_OF_RUNS = (
    select(t.steps.c.run_id, t.steps.c.step_index, t.steps.c.payload)
    .where(t.steps.c.run_id.in_(b("run_ids", expanding=True)))
    .order_by(t.steps.c.run_id, t.steps.c.step_index)
)

# Counting a steer only while the inbox is open takes the run row's lock and checks it in
# one statement: a concurrent close either sees the steer or refuses it.
COUNT_STEER = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.inbox_open.is_(True))
    .values(steer_count=t.runs.c.steer_count + 1)
    .returning(t.runs.c.steer_count)
)

INSERT_STEER = t.steers.insert()

PENDING_STEERS = (
    select(t.steers.c.position, t.steers.c.kind, t.steers.c.text)
    .where(t.steers.c.run_id == b("run_id"), t.steers.c.position > b("cursor"))
    .order_by(t.steers.c.position)
)

EVENTS_AFTER = (
    select(t.events.c.seq, t.events.c.kind, t.events.c.data)
    .where(t.events.c.turn_id == b("turn_id"), t.events.c.seq > b("seq"))
    .order_by(t.events.c.seq)
)

LAST_EVENT_SEQ = select(func.max(t.events.c.seq)).where(t.events.c.turn_id == b("turn_id"))


class DialectStatements:
    """The statements whose SQL differs per dialect: idempotent inserts."""

    def __init__(self, dialect: str) -> None:
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        # A cold shutdown can interrupt a COMMIT whose retry then finds the row written.
        self.insert_step = insert(t.steps).on_conflict_do_nothing()
        self.insert_events = insert(t.events).on_conflict_do_nothing()
        # One statement and one round trip where three would take three: data-modifying
        # CTEs (PostgreSQL only; foreign keys are checked at the end of the statement).
        postgres = dialect == "postgresql"
        self.insert_submission = (
            INSERT_QUEUED.add_cte(INSERT_TURN.cte("new_turn"), INSERT_RUN.cte("new_run"))
            if postgres
            else None
        )
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
    fresh = run.c.attempts == 0
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


# ------------------------------------------------------------------ approvals

# A driver's step waits for answers: the run waits, holding its step (fenced by the
# session row the caller locked, and only while it runs).
HOLD_RUN = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.status == RUNNING)
    .values(
        status=WAITING,
        held_step=b("held_step", type_=t.Json),
        approval_count=t.runs.c.approval_count + b("asked"),
        last_seq=case((t.runs.c.last_seq > b("last_seq"), t.runs.c.last_seq), else_=b("last_seq")),
        worker=None,
    )
)

INSERT_APPROVAL = t.approvals.insert()

APPROVALS_OF_TURN = (
    select(t.approvals)
    .where(t.approvals.c.turn_id == b("turn_id"))
    .order_by(t.approvals.c.step_index, t.approvals.c.position)
)

APPROVALS_OF_RUN = (
    select(t.approvals)
    .where(t.approvals.c.run_id == b("run_id"))
    .order_by(t.approvals.c.step_index, t.approvals.c.position)
)

APPROVAL = select(t.approvals).where(t.approvals.c.id == b("approval_id"))

DECIDE_APPROVAL = (
    update(t.approvals)
    .where(t.approvals.c.id == b("approval_id"), t.approvals.c.decision.is_(None))
    .values(decision=b("decision"), reason=b("reason"), decided_at=b("now"))
)

UNDECIDED_OF_RUN = select(func.count()).where(
    t.approvals.c.run_id == b("run_id"), t.approvals.c.decision.is_(None)
)

UNDECIDED_IDS_OF_RUN = select(t.approvals.c.id).where(
    t.approvals.c.run_id == b("run_id"), t.approvals.c.decision.is_(None)
)

# Every answer is in: the run is runnable again, in its place in the session's line.
REQUEUE_WAITING = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.status == WAITING)
    .values(status=QUEUED)
)

# Seqs for events written while no driver holds the turn (answers to a waiting one).
TAKE_SEQS = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"))
    .values(last_seq=t.runs.c.last_seq + b("count"))
    .returning(t.runs.c.last_seq)
)

# An approved call is about to run: marked once (an attempt that finds it marked does not
# run it again for the same answer).
CONSUME_APPROVAL = (
    update(t.approvals)
    .where(
        t.approvals.c.id == b("approval_id"),
        t.approvals.c.decision == "approved",
        t.approvals.c.consumed_at.is_(None),
    )
    .values(consumed_at=b("now"))
)

EXPIRED_APPROVALS = select(t.approvals.c.id, t.approvals.c.turn_id).where(
    t.approvals.c.decision.is_(None), t.approvals.c.expires_at <= b("now")
)


# ------------------------------------------------------------------ seeded history

SEED_TURN = insert(t.turns)
SEED_RUN = insert(t.runs)
INSERT_SEED = insert(t.seeds)
SEED_OF_SESSION = select(t.seeds).where(t.seeds.c.session_id == b("session_id"))
# The seeded turns ended as they were stored: the session's newest activity.
SET_TURN_COUNT = (
    update(t.sessions)
    .where(t.sessions.c.id == b("session_id"))
    .values(turn_count=b("count"), last_active_at=b("now"))
)
