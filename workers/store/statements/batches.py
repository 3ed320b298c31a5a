"""Statements on files and batches (docs/batches.md): their rows, a batch's counts read
from its lines' runs, the pages of its output and error files, its cancel, and the batch
window's look at the oldest queued batch runs.

(The batch store reads these as ``bq.NAME``; they are a concern of their own, not part
of a turn's path.)"""

from __future__ import annotations

from sqlalchemy import and_, case, delete, func, insert, literal_column, or_, select, tuple_, update

from schemas import tables as t
from schemas.batches import ANSWERED, UNANSWERED
from workers.store.statements.binds import b
from workers.store.statements.run_status import QUEUED, RUNNING, WAITING
from workers.store.statements.turns import TURN_COLUMNS

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

# ---------------------------------------------------------------------------- batches

INSERT_BATCH = insert(t.batches)

BATCH = select(t.batches).where(t.batches.c.id == b("batch_id"))

BATCH_BY_REQUEST = select(t.batches).where(
    t.batches.c.tenant.is_not_distinct_from(b("tenant", type_=t.batches.c.tenant.type)),
    t.batches.c.request_id == b("request_id"),
)

_NEWEST_FIRST = (t.batches.c.created_at.desc(), t.batches.c.id.desc())
BATCHES_OF_TENANT = (
    select(t.batches)
    .where(t.batches.c.tenant.is_not_distinct_from(b("tenant", type_=t.batches.c.tenant.type)))
    .order_by(*_NEWEST_FIRST)
    .limit(b("limit"))
)
BATCHES_OF_TENANT_AFTER = BATCHES_OF_TENANT.where(
    tuple_(t.batches.c.created_at, t.batches.c.id)
    < tuple_(b("created_at", type_=t.batches.c.created_at.type), b("id", type_=t.batches.c.id.type))
)

# The first reader to find every line ended writes the batch's end, once.
END_BATCH = (
    update(t.batches)
    .where(t.batches.c.id == b("batch_id"), t.batches.c.ended_at.is_(None))
    .values(status=b("status"), ended_at=b("ended_at"))
)

SET_CANCELLING = (
    update(t.batches)
    .where(t.batches.c.id == b("batch_id"), t.batches.c.status == "in_progress")
    .values(status="cancelling", cancelling_at=b("now"))
)

# Ended batches whose files ``parley prune`` may remove: ended before the cut.
ENDED_BATCHES_BEFORE = select(t.batches.c.id).where(t.batches.c.ended_at < b("cut"))

DELETE_LINES = delete(t.batch_lines).where(
    t.batch_lines.c.batch_id.in_(b("batch_ids", expanding=True))
)
DELETE_BATCHES = delete(t.batches).where(t.batches.c.id.in_(b("batch_ids", expanding=True)))

# The lines of sessions about to be pruned (their turns go with them): their rows are
# removed first, and their batches keep the count of what they had.
SESSIONS_OF_BATCHES = select(t.batch_lines.c.session_id).where(
    t.batch_lines.c.batch_id.in_(b("batch_ids", expanding=True)),
    t.batch_lines.c.opened_session,
)

# ------------------------------------------------------------------------------ lines

INSERT_LINE = insert(t.batch_lines)

_LINE_RUN = t.batch_lines.outerjoin(t.runs, t.runs.c.turn_id == t.batch_lines.c.turn_id)

_THROTTLED = and_(t.runs.c.status == QUEUED, t.runs.c.not_before > b("now"))

# A batch's lines by where their runs stand (refused lines: status NULL).
BATCH_COUNTS = (
    select(
        t.runs.c.status,
        case((_THROTTLED, True), else_=False).label("throttled"),
        func.count().label("lines"),
    )
    .select_from(_LINE_RUN)
    .where(t.batch_lines.c.batch_id == b("batch_id"))
    .group_by(t.runs.c.status, literal_column("throttled"))
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

# Lines that ended at or after ``since`` (and the refused ones): ``Batch.results``.
ENDED_SINCE = (
    _LINE_COLUMNS.where(
        t.batch_lines.c.batch_id == b("batch_id"),
        or_(t.batch_lines.c.turn_id.is_(None), t.runs.c.ended_at >= b("since")),
        or_(_ANSWERED, _UNANSWERED),
    )
    .order_by(t.runs.c.ended_at, t.batch_lines.c.line)
    .limit(b("limit"))
)

# A page of turns, and their runs (every column a response object needs).
TURNS_BY_IDS = TURN_COLUMNS.where(t.turns.c.id.in_(b("turn_ids", expanding=True)))
RUNS_BY_TURNS = select(t.runs).where(t.runs.c.turn_id.in_(b("turn_ids", expanding=True)))

# ----------------------------------------------------------------------------- cancel

# A cancelled batch's lines that opened their session and never started (nor got a
# steer): ended here, unrun.  The update takes each run's row lock and matches only a run
# still queued, so a line a driver claimed meanwhile is left to it.
_OPENED_LINES = select(t.batch_lines.c.turn_id).where(
    t.batch_lines.c.batch_id == b("batch_id"), t.batch_lines.c.opened_session
)
END_UNSTARTED = (
    update(t.runs)
    .where(
        t.runs.c.turn_id.in_(_OPENED_LINES.scalar_subquery()),
        t.runs.c.status == QUEUED,
        t.runs.c.steer_count == 0,
    )
    .values(
        status="cancelled",
        error=b("error"),
        inbox_open=False,
        ended_at=b("now"),
        last_seq=t.runs.c.last_seq + 1,
        not_before=None,
    )
    .returning(t.runs.c.turn_id, t.runs.c.session_id, t.runs.c.last_seq)
)

# The sessions of those lines, touched (their newest activity) first: a writer locks a
# session's row before its runs' (a claim does), and so does a cancel.
TOUCH_SESSIONS = (
    update(t.sessions)
    .where(
        t.sessions.c.id.in_(
            select(t.runs.c.session_id)
            .where(
                t.runs.c.turn_id.in_(_OPENED_LINES.scalar_subquery()),
                t.runs.c.status == QUEUED,
                t.runs.c.steer_count == 0,
            )
            .scalar_subquery()
        )
    )
    .values(last_active_at=b("now"))
)

# The rest of a cancelled batch's unfinished lines: interrupted through their inboxes.
UNFINISHED_TURNS = (
    select(t.runs.c.turn_id)
    .select_from(_LINE_RUN)
    .where(
        t.batch_lines.c.batch_id == b("batch_id"),
        t.runs.c.status.in_([QUEUED, RUNNING, WAITING]),
    )
)

# ----------------------------------------------------------------------------- window

# The sessions of the oldest queued batch runs that may start now (ix_runs_batch_queue).
OLDEST_QUEUED_BATCH = (
    select(t.runs.c.session_id)
    .where(
        t.runs.c.status == literal_column(f"'{QUEUED}'"),
        t.runs.c.priority == literal_column("'batch'"),
        or_(t.runs.c.not_before.is_(None), t.runs.c.not_before <= b("now")),
    )
    .order_by(t.runs.c.queued_at)
    .limit(b("limit"))
)

# Batch runs holding a place in the window: driven now, or waiting for capacity.
BATCH_IN_FLIGHT = select(func.count()).where(
    t.runs.c.priority == "batch",
    or_(
        t.runs.c.status == RUNNING, and_(t.runs.c.status == QUEUED, t.runs.c.not_before > b("now"))
    ),
)
