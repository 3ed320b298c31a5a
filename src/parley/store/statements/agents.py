"""Statements on sub-agents (docs/sub-agents.md): a step that waits for its child turns,
the children of a step as their ends left them, and the parent's return to its place
in line once the last of them ended."""

from __future__ import annotations

from sqlalchemy import exists, func, select, update

from parley.schemas import tables as t
from parley.store.statements.binds import b
from parley.store.statements.run_status import (
    CANCELLED,
    QUEUED,
    RUNNING,
    WAITING,
    WAITING_FOR_AGENTS,
    WAITING_IN_LINE,
    hold_step,
)

# A driver's step waits for its children: as HOLD_RUN, but for agents (no approvals).
HOLD_FOR_AGENTS = hold_step(WAITING_FOR_AGENTS)

# A child session's first turn is the call's child turn (a person may submit more to
# the child session later: those are not the call's): the child sessions, each with its
# first turn and that turn's run.
_CHILD_TURNS = t.sessions.join(
    t.turns, (t.turns.c.session_id == t.sessions.c.id) & (t.turns.c.ordinal == 1)
).join(t.runs, t.runs.c.turn_id == t.turns.c.id)

_child_turn = (
    select(t.sessions.c.id.label("session_id"))
    .add_columns(
        t.sessions.c.parent_call_id.label("call_id"),
        t.sessions.c.agent,
        t.turns.c.id.label("turn_id"),
        t.runs.c.status,
        t.runs.c.reply,
        t.runs.c.error,
    )
    .select_from(_CHILD_TURNS)
)

CHILDREN_OF_STEP = _child_turn.where(
    t.sessions.c.parent_run_id == b("run_id"), t.sessions.c.parent_step == b("step")
)

# The step's children not ended yet, read after the caller locked the parent's run (so
# that of two children ending at once, the second sees the first's end).
UNFINISHED_CHILDREN = (
    select(func.count())
    .select_from(_CHILD_TURNS)
    .where(
        t.sessions.c.parent_run_id == b("run_id"),
        t.sessions.c.parent_step == b("step"),
        t.runs.c.status.in_((QUEUED, RUNNING, WAITING)),
    )
)

# The last child ended: the parent goes back to its place in line, if it still waits
# for this step's children (not for a later step's, nor for anything else).
REQUEUE_PARENT = (
    update(t.runs)
    .where(
        t.runs.c.id == b("run_id"),
        t.runs.c.status == WAITING,
        t.runs.c.waiting_for == WAITING_FOR_AGENTS,
        t.runs.c.steps == b("step"),
    )
    .values(status=QUEUED)
    .returning(t.runs.c.session_id, t.runs.c.priority)
)

# Is this turn its session's first (the call's child turn)?
TURN_ORDINAL = select(t.turns.c.ordinal).where(t.turns.c.id == b("turn_id"))

# The call's child turns of a parent turn not ended yet (an interrupt reaches them);
# by the parent's run, which the sessions' unique key indexes.
UNFINISHED_CHILD_TURNS = (
    select(t.turns.c.id)
    .select_from(_CHILD_TURNS)
    .where(
        t.sessions.c.parent_run_id
        == select(t.runs.c.id).where(t.runs.c.turn_id == b("turn_id")).scalar_subquery(),
        t.runs.c.status.in_((QUEUED, RUNNING, WAITING)),
    )
    .order_by(t.sessions.c.parent_step, t.sessions.c.parent_call_id)
)

# A child opened past the step's ``max_parallel_agents``: it waits for a place among
# its siblings (no driver claims a waiting run, and the sweeper does not kick it).
HOLD_BACK_CHILD = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"))
    .values(status=WAITING, waiting_for=WAITING_FOR_AGENTS)
)

# The step's next child waiting for a place, in the model's order of the calls (their
# ``queued_at`` is the hold's time plus their position in microseconds).
NEXT_HELD_BACK_CHILD = (
    select(t.runs.c.id)
    .select_from(_CHILD_TURNS)
    .where(
        t.sessions.c.parent_run_id == b("run_id"),
        t.sessions.c.parent_step == b("step"),
        t.runs.c.status == WAITING,
        t.runs.c.waiting_for == WAITING_FOR_AGENTS,
        t.runs.c.held_step.is_(None),
    )
    .order_by(t.runs.c.queued_at)
    .limit(1)
)

# That child takes the place of one that ended: queued, to be kicked.
PLACE_CHILD = (
    update(t.runs)
    .where(t.runs.c.id == b("run_id"), t.runs.c.status == WAITING)
    .values(status=QUEUED, waiting_for=WAITING_IN_LINE)
    .returning(t.runs.c.session_id, t.runs.c.priority)
)

# Every call's child turn of a run, in step and call order (for its result).
CHILDREN_OF_RUN = (
    _child_turn.add_columns(t.sessions.c.parent_step)
    .where(t.sessions.c.parent_run_id == b("run_id"))
    .order_by(t.sessions.c.parent_step, t.runs.c.queued_at)
)

# A turn's run, and whether any agent call of it opened a child: what a result needs
# (the children themselves are read only for a turn that has some).
RUN_WITH_CHILDREN_BY_TURN = select(
    t.runs, exists().where(t.sessions.c.parent_run_id == t.runs.c.id).label("has_children")
).where(t.runs.c.turn_id == b("turn_id"))

# A held step as its resume leaves it (marked resumed: its driver resumes the children
# an interrupt cancelled).
SET_HELD_STEP = (
    update(t.runs).where(t.runs.c.id == b("run_id")).values(held_step=b("held_step", type_=t.Json))
)

# The children of a step an interrupt of their parent cancelled, in the model's order of
# the calls (a resume of the parent resumes them).
CANCELLED_CHILDREN_OF_STEP = CHILDREN_OF_STEP.where(t.runs.c.status == CANCELLED).order_by(
    t.runs.c.queued_at
)

# The tokens of a run's descendants: its agent calls' child turns, and theirs, down the
# tree (each level found through the sessions' parent_run_id key).
_descendants = (
    select(t.runs.c.id).where(t.runs.c.id == b("run_id")).cte("descendants", recursive=True)
)
_descendants = _descendants.union_all(
    select(t.runs.c.id)
    .select_from(_CHILD_TURNS)
    .where(t.sessions.c.parent_run_id == _descendants.c.id)
)
DESCENDANTS_USAGE = select(
    func.coalesce(func.sum(t.runs.c.input_tokens), 0).label("input_tokens"),
    func.coalesce(func.sum(t.runs.c.output_tokens), 0).label("output_tokens"),
    func.coalesce(func.sum(t.runs.c.cached_tokens), 0).label("cached_tokens"),
).where(t.runs.c.id.in_(select(_descendants.c.id)), t.runs.c.id != b("run_id"))

# The child turns under a batch's lines (docs/batches.md), by status: from each line
# whose turn waits for its agent calls' children, down their trees, through the child
# sessions' parent key; only turns not ended (a turn ends after its children).
_line_parents = (
    select(t.runs.c.id)
    .select_from(t.batch_lines.join(t.runs, t.runs.c.turn_id == t.batch_lines.c.turn_id))
    .where(
        t.batch_lines.c.batch_id == b("batch_id"),
        t.runs.c.status == WAITING,
        t.runs.c.waiting_for == WAITING_FOR_AGENTS,
    )
)
_UNFINISHED_CHILD = t.runs.c.status.in_((QUEUED, RUNNING, WAITING))
_line_children = (
    select(t.runs.c.id, t.runs.c.status)
    .select_from(_CHILD_TURNS)
    .where(t.sessions.c.parent_run_id.in_(_line_parents), _UNFINISHED_CHILD)
    .cte("line_children", recursive=True)
)
_line_children = _line_children.union_all(
    select(t.runs.c.id, t.runs.c.status)
    .select_from(_CHILD_TURNS)
    .where(t.sessions.c.parent_run_id == _line_children.c.id, _UNFINISHED_CHILD)
)
BATCH_CHILDREN = select(_line_children.c.status, func.count().label("runs")).group_by(
    _line_children.c.status
)
