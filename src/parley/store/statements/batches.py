"""Statements on files and batches (docs/batches.md): their rows, a batch's acceptance a
chunk of lines at a time (and the dropping of one never finished), its counts read from
its lines' runs, the pages of its output and error files, and its cancel (the batch
window's are in :mod:`.window`).

(The batch store reads these as ``bq.NAME``; they are a concern of their own, not part
of a turn's path.)"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    and_,
    case,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    true,
    tuple_,
    update,
)

from parley.schemas import tables as t
from parley.schemas.batches import ANSWERED, UNANSWERED
from parley.store.statements.binds import b
from parley.store.statements.run_status import QUEUED, RUNNING, WAITING, WAITING_FOR_AGENTS
from parley.store.statements.turns import TURN_COLUMNS

# ------------------------------------------------------------------------------ files

INSERT_FILE = insert(t.files)

FILE = select(t.files).where(t.files.c.id == b("file_id"))

SET_FILE_BYTES = update(t.files).where(t.files.c.id == b("file_id")).values(bytes=b("bytes"))

INSERT_FILE_PART = insert(t.file_parts)

FILE_PART = select(t.file_parts.c.data).where(
    t.file_parts.c.file_id == b("file_id"), t.file_parts.c.part == b("part")
)

FILES_OF_BATCHES = select(t.files.c.id).where(
    t.files.c.batch_id.in_(b("batch_ids", expanding=True))
)

# The uploads of those batches that no other batch was made from.
_other = t.batches.alias("other")
INPUT_FILES_OF_BATCHES = select(t.batches.c.input_file_id).where(
    t.batches.c.id.in_(b("batch_ids", expanding=True)),
    ~select(_other.c.id)
    .where(
        _other.c.input_file_id == t.batches.c.input_file_id,
        _other.c.id.not_in(b("batch_ids", expanding=True)),
    )
    .exists(),
)

DELETE_FILE_PARTS = delete(t.file_parts).where(
    t.file_parts.c.file_id.in_(b("file_ids", expanding=True))
)
DELETE_FILES = delete(t.files).where(t.files.c.id.in_(b("file_ids", expanding=True)))

# An upload no batch was made from (the command line's, when its batch was refused).
_unused = ~select(t.batches.c.id).where(t.batches.c.input_file_id == b("file_id")).exists()
DELETE_UNUSED_UPLOAD_PARTS = delete(t.file_parts).where(
    t.file_parts.c.file_id == b("file_id"), _unused
)
DELETE_UNUSED_UPLOAD = delete(t.files).where(
    t.files.c.id == b("file_id"), t.files.c.kind == "upload", _unused
)

# ---------------------------------------------------------------------------- batches

# A batch is written a chunk of lines per transaction while it is ``accepting``, and is
# a batch (``in_progress``, or ``failed``) once its last transaction says so; one
# abandoned half-way is ``dropping`` while its rows are deleted.  Neither is seen by a
# reader, nor are its lines started.
ACCEPTING = "accepting"
DROPPING = "dropping"
UNACCEPTED = (ACCEPTING, DROPPING)

INSERT_BATCH = insert(t.batches)

BATCH = select(t.batches).where(t.batches.c.id == b("batch_id"))

BATCH_BY_REQUEST = select(t.batches).where(
    t.batches.c.tenant.is_not_distinct_from(b("tenant", type_=t.batches.c.tenant.type)),
    t.batches.c.request_id == b("request_id"),
)

_NEWEST_FIRST = (t.batches.c.created_at.desc(), t.batches.c.id.desc())
BATCHES_OF_TENANT = (
    select(t.batches)
    .where(
        t.batches.c.tenant.is_not_distinct_from(b("tenant", type_=t.batches.c.tenant.type)),
        t.batches.c.status.not_in(UNACCEPTED),
    )
    .order_by(*_NEWEST_FIRST)
    .limit(b("limit"))
)
_BEFORE_THE_MARK = tuple_(t.batches.c.created_at, t.batches.c.id) < tuple_(
    b("created_at", type_=t.batches.c.created_at.type), b("id", type_=t.batches.c.id.type)
)
BATCHES_OF_TENANT_AFTER = BATCHES_OF_TENANT.where(_BEFORE_THE_MARK)

# Every tenant's (the command line's list, an operator's).
ALL_BATCHES = select(t.batches).order_by(*_NEWEST_FIRST).limit(b("limit"))
ALL_BATCHES_AFTER = ALL_BATCHES.where(_BEFORE_THE_MARK)

# The first reader to find every line ended writes the batch's end, once.
END_BATCH = (
    update(t.batches)
    .where(t.batches.c.id == b("batch_id"), t.batches.c.ended_at.is_(None))
    .values(status=b("status"), ended_at=b("ended_at"))
)

# Only a batch with a line still to end: one whose lines have all ended is completed,
# whether or not a reader has written its end yet.
_UNFINISHED_LINE = (
    select(t.batch_lines.c.line)
    .select_from(t.batch_lines.join(t.runs, t.runs.c.turn_id == t.batch_lines.c.turn_id))
    .where(
        t.batch_lines.c.batch_id == t.batches.c.id,
        t.runs.c.status.in_([QUEUED, RUNNING, WAITING]),
    )
    .exists()
)
# A chunk of lines written: the acceptance counts them, and so shows it is alive.
ADVANCE_ACCEPTANCE = (
    update(t.batches)
    .where(t.batches.c.id == b("batch_id"), t.batches.c.status == ACCEPTING)
    .values(total=t.batches.c.total + b("lines"))
)

# The batch row its last transaction holds while it queues the lines that continue
# conversations (a retry of its request id that finds it stalled waits for the lock).
LOCK_ACCEPTING = (
    select(t.batches.c.id)
    .where(t.batches.c.id == b("batch_id"), t.batches.c.status == ACCEPTING)
    .with_for_update()
)

LINE_COUNTS = select(
    func.count().label("lines"), func.count(t.batch_lines.c.turn_id).label("accepted")
).where(t.batch_lines.c.batch_id == b("batch_id"))

# OpenAI's ``errors.data`` of a batch none of whose lines was accepted: the first lines'.
FIRST_ERRORS = (
    select(t.batch_lines.c.error)
    .where(t.batch_lines.c.batch_id == b("batch_id"))
    .order_by(t.batch_lines.c.line)
    .limit(b("limit"))
)

FINISH_ACCEPTANCE = (
    update(t.batches)
    .where(t.batches.c.id == b("batch_id"), t.batches.c.status == ACCEPTING)
    .values(
        status=b("status"),
        total=b("total"),
        errors=b("errors", type_=t.Json),
        ended_at=b("ended_at"),
    )
)

# An acceptance given up: its own (it failed), or one a retry found stalled at ``seen``
# lines (only if it has not moved since, and was not finished meanwhile).
DROP_OWN = (
    update(t.batches)
    .where(t.batches.c.id == b("batch_id"), t.batches.c.status.in_(UNACCEPTED))
    .values(status=DROPPING)
)
DROP_STALLED = (
    update(t.batches)
    .where(
        t.batches.c.id == b("batch_id"),
        or_(
            t.batches.c.status == DROPPING,
            and_(t.batches.c.status == ACCEPTING, t.batches.c.total == b("seen")),
        ),
    )
    .values(status=DROPPING)
)

# A page of the sessions a dropped acceptance's lines opened, with their roots.
OPENED_BY_LINES = (
    select(t.sessions.c.id, t.sessions.c.root)
    .select_from(t.batch_lines.join(t.sessions, t.sessions.c.id == t.batch_lines.c.session_id))
    .where(t.batch_lines.c.batch_id == b("batch_id"), t.batch_lines.c.opened_session)
    .limit(b("limit"))
)

# Acceptances begun before ``cut`` and never finished (their process died): ``parley
# prune`` drops them.
ABANDONED_BEFORE = select(t.batches.c.id, t.batches.c.total).where(
    t.batches.c.status.in_(UNACCEPTED), t.batches.c.created_at < b("cut")
)

SET_CANCELLING = (
    update(t.batches)
    .where(t.batches.c.id == b("batch_id"), t.batches.c.status == "in_progress", _UNFINISHED_LINE)
    .values(status="cancelling", cancelling_at=b("now"))
)

# Ended batches whose files ``parley prune`` may remove: ended before the cut.
ENDED_BATCHES_BEFORE = select(t.batches.c.id).where(t.batches.c.ended_at < b("cut"))

DELETE_LINES = delete(t.batch_lines).where(
    t.batch_lines.c.batch_id.in_(b("batch_ids", expanding=True))
)
DELETE_BATCHES = delete(t.batches).where(t.batches.c.id.in_(b("batch_ids", expanding=True)))
DELETE_LINES_OF_BATCH = delete(t.batch_lines).where(t.batch_lines.c.batch_id == b("batch_id"))

# ------------------------------------------------------------------------------ lines

_LINE_RUN = t.batch_lines.outerjoin(t.runs, t.runs.c.turn_id == t.batch_lines.c.turn_id)

_THROTTLED = and_(t.runs.c.status == QUEUED, t.runs.c.not_before > b("now"))

# A batch's lines by where their runs stand (refused lines: status NULL), with what
# their runs spent: the counts and the usage of a batch are one pass over its lines.
BATCH_COUNTS = (
    select(
        t.runs.c.status,
        case((_THROTTLED, True), else_=False).label("throttled"),
        # A line whose turn waits for its agent calls' child turns (docs/sub-agents.md).
        case((t.runs.c.waiting_for == WAITING_FOR_AGENTS, True), else_=False).label("agents"),
        func.count().label("lines"),
        func.coalesce(func.sum(t.runs.c.input_tokens), 0).label("input_tokens"),
        func.coalesce(func.sum(t.runs.c.output_tokens), 0).label("output_tokens"),
        func.coalesce(func.sum(t.runs.c.cached_tokens), 0).label("cached_tokens"),
    )
    .select_from(_LINE_RUN)
    .where(t.batch_lines.c.batch_id == b("batch_id"))
    .group_by(t.runs.c.status, literal_column("throttled"), literal_column("agents"))
)

# The model the first line (in file order) to commit a step recorded with it: the
# model that ran the batch.  It walks the lines in order only until one ran, which the
# batch window makes the first few (it starts the oldest lines first).
BATCH_MODEL = (
    select(t.steps.c.payload)
    .select_from(_LINE_RUN)
    .join(t.steps, and_(t.steps.c.run_id == t.runs.c.id, t.steps.c.step_index == 0))
    .where(t.batch_lines.c.batch_id == b("batch_id"), t.runs.c.steps > 0)
    .order_by(t.batch_lines.c.line)
    .limit(1)
)

_LINE_COLUMNS = select(
    t.batch_lines.c.line,
    t.batch_lines.c.custom_id,
    t.batch_lines.c.turn_id,
    t.batch_lines.c.session_id,
    t.batch_lines.c.error,
    t.runs.c.status,
    t.runs.c.ended_at,
).select_from(_LINE_RUN)

_ANSWERED = t.runs.c.status.in_([s.value for s in ANSWERED])
_UNANSWERED = or_(
    t.batch_lines.c.turn_id.is_(None), t.runs.c.status.in_([s.value for s in UNANSWERED])
)

# Every line after ``line``, in file order (the page's list of a batch's lines).
LINES_PAGE = (
    _LINE_COLUMNS.where(t.batch_lines.c.batch_id == b("batch_id"), t.batch_lines.c.line > b("line"))
    .order_by(t.batch_lines.c.line)
    .limit(b("limit"))
)

# The output file's lines after ``line`` (its ended, answered lines, in file order).
OUTPUT_PAGE = (
    _LINE_COLUMNS.where(
        t.batch_lines.c.batch_id == b("batch_id"), t.batch_lines.c.line > b("line"), _ANSWERED
    )
    .order_by(t.batch_lines.c.line)
    .limit(b("limit"))
)

# The error file's lines after ``line`` (refused, failed or cancelled, in file order).
ERROR_PAGE = (
    _LINE_COLUMNS.where(
        t.batch_lines.c.batch_id == b("batch_id"), t.batch_lines.c.line > b("line"), _UNANSWERED
    )
    .order_by(t.batch_lines.c.line)
    .limit(b("limit"))
)


@cache
def ended_after(dialect: str) -> Any:
    """``Batch.results``: the lines whose runs ended after a point of their ends' order
    (``b_after_at``, then ``b_after_line``), at most ``b_limit``.  Read from
    ix_runs_batch_ended, each end's line found through its session (indexed), so that a
    page costs the ends since the point, not the batch's size.  Each database is kept
    from the plan it would choose otherwise, reading every line of the batch for every
    page: SQLite (no statistics) from the lines' key, so the batch's condition is
    written ``+batch_id``, which no index serves; PostgreSQL from a hash of them, so the
    line is a lateral subquery behind ``OFFSET 0``, which it does not flatten."""
    lines = t.batch_lines.c
    if dialect == "postgresql":
        line: Any = (
            select(lines.line, lines.custom_id, lines.turn_id, lines.session_id, lines.error)
            .where(
                lines.session_id == t.runs.c.session_id,
                lines.turn_id == t.runs.c.turn_id,
                lines.batch_id == b("batch_id"),
            )
            .offset(literal_column("0"))
            .lateral("line")
        )
        source, in_batch = t.runs.join(line, true()), true()
    else:
        line = t.batch_lines
        on = and_(lines.session_id == t.runs.c.session_id, lines.turn_id == t.runs.c.turn_id)
        source = t.runs.join(line, on)
        in_batch = literal_column("+batch_lines.batch_id") == b("batch_id")
    after = b("after_at", type_=t.runs.c.ended_at.type)
    return (
        select(
            line.c.line,
            line.c.custom_id,
            line.c.turn_id,
            line.c.session_id,
            line.c.error,
            t.runs.c.status,
            t.runs.c.ended_at,
        )
        .select_from(source)
        .where(
            t.runs.c.priority == literal_column("'batch'"),
            t.runs.c.ended_at >= after,
            tuple_(t.runs.c.ended_at, line.c.line) > tuple_(after, b("after_line")),
            in_batch,
            t.runs.c.status.in_([s.value for s in (*ANSWERED, *UNANSWERED)]),
        )
        .order_by(t.runs.c.ended_at, line.c.line)
        .limit(b("limit"))
    )


# ``Batch.results``: the refused lines after ``line``, in file order (once per call).
REFUSED_PAGE = (
    _LINE_COLUMNS.where(
        t.batch_lines.c.batch_id == b("batch_id"),
        t.batch_lines.c.line > b("line"),
        t.batch_lines.c.turn_id.is_(None),
    )
    .order_by(t.batch_lines.c.line)
    .limit(b("limit"))
)

# A page of turns, and their runs (every column a response object needs).
TURNS_BY_IDS = TURN_COLUMNS.where(t.turns.c.id.in_(b("turn_ids", expanding=True)))
RUNS_BY_TURNS = select(t.runs).where(t.runs.c.turn_id.in_(b("turn_ids", expanding=True)))

# ----------------------------------------------------------------------------- cancel

# A cancelled batch's lines still queued, whether they opened their session or continue
# one (which may wait there behind a turn that waits for a person): each is ended here,
# unrun.  The update takes each run's row lock and matches only a run still queued, so
# a line a driver claimed meanwhile is left to it.
#
# A line's turns are its own and, in a session the line opened, those queued there before
# it: a replay's line (docs/replay.md#many) is its replay session's last turn, the
# session's earlier turns running first; any other line that opened its session has only
# seeded turns before its own, which have ended.
_line_run = t.runs.alias("line_run")
_earlier = t.runs.alias("earlier")
_LINES_OF_BATCH = (
    select(_earlier.c.turn_id)
    .select_from(
        t.batch_lines.join(_line_run, _line_run.c.turn_id == t.batch_lines.c.turn_id).join(
            _earlier,
            and_(
                _earlier.c.session_id == t.batch_lines.c.session_id,
                _earlier.c.queue_position <= _line_run.c.queue_position,
            ),
        )
    )
    .where(
        t.batch_lines.c.batch_id == b("batch_id"),
        or_(t.batch_lines.c.opened_session, _earlier.c.turn_id == t.batch_lines.c.turn_id),
    )
)
_QUEUED_LINE = and_(
    t.runs.c.turn_id.in_(_LINES_OF_BATCH.scalar_subquery()), t.runs.c.status == QUEUED
)
# Whether a steer accepted for the run has neither reached a step nor been reported.
_STEERS_PENDING = t.runs.c.steer_count > t.runs.c.steer_cursor
# A line that waited to go on (for provider capacity, or resumed) had started once.
_CANCELLED_ERROR = case(
    (t.runs.c.started_at.is_(None), b("unstarted", type_=t.runs.c.error.type)),
    else_=b("waiting", type_=t.runs.c.error.type),
)
_CANCELLED = {
    "status": "cancelled",
    "error": _CANCELLED_ERROR,
    "inbox_open": False,
    "ended_at": b("now"),
    "last_seq": t.runs.c.last_seq + 1,
    "not_before": None,
}
_ENDED_LINE = (t.runs.c.turn_id, t.runs.c.session_id, t.runs.c.last_seq, t.runs.c.error)

# Those with no steer pending, in one statement (a steer counted meanwhile takes the
# run's row first, and the line is then ended with it below, or finds the inbox closed).
END_UNSTARTED = (
    update(t.runs).where(_QUEUED_LINE, ~_STEERS_PENDING).values(_CANCELLED).returning(*_ENDED_LINE)
)

# Those with steers pending, their rows locked: each is ended with its says reported
# undelivered (after what an earlier attempt reported), as a turn's end reports them.
STEERED_UNSTARTED = (
    select(t.runs.c.id, t.runs.c.steer_cursor, t.runs.c.undelivered)
    .where(_QUEUED_LINE, _STEERS_PENDING)
    .with_for_update()
)
END_STEERED = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.status == QUEUED)
    .values(
        {
            **_CANCELLED,
            "steer_cursor": t.runs.c.steer_count,
            "undelivered": b("undelivered", type_=t.Json),
        }
    )
    .returning(*_ENDED_LINE)
)

# The sessions of those lines, touched (their newest activity) first: a writer locks a
# session's row before its runs' (a claim does), and so does a cancel.
TOUCH_SESSIONS = (
    update(t.sessions)
    .where(t.sessions.c.id.in_(select(t.runs.c.session_id).where(_QUEUED_LINE).scalar_subquery()))
    .values(last_active_at=b("now"))
)

# The rest of a cancelled batch's unfinished lines' turns: interrupted through their
# inboxes.
UNFINISHED_TURNS = select(t.runs.c.turn_id).where(
    t.runs.c.turn_id.in_(_LINES_OF_BATCH.scalar_subquery()),
    t.runs.c.status.in_([QUEUED, RUNNING, WAITING]),
)

# ------------------------------------------------------------------------ replay lines

# A replay batch's line (docs/replay.md#many) is written with its replay session, before
# the session's turns: the batch window starts none of them while the batch is being
# accepted.  Its turn (the session's last) is set once they are queued.
SET_LINE_TURN = (
    update(t.batch_lines)
    .where(t.batch_lines.c.batch_id == b("batch_id"), t.batch_lines.c.line == b("line"))
    .values(turn_id=b("turn_id", type_=t.batch_lines.c.turn_id.type))
)
