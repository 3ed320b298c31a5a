"""Statements on turns: a turn with its run's status and reply, the tree, the path from a
head (one recursive query, whole or back to the compaction that applies), a submission's
turn row."""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, literal, select, update

from parley.schemas import tables as t
from parley.store.statements.binds import b
from parley.store.statements.compactions import usable_by

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
    t.runs.c.not_before,
    t.runs.c.waiting_for,
    t.runs.c.waiting_event,
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


def _path(*, to_compaction: bool = False) -> Any:
    # Walk parent links from a head in one recursive query (same SQL on both back ends),
    # each level looking its parent up by primary key.  (A join of the walk to ``turns``
    # lets PostgreSQL, which plans a recursive term for a work table of ten rows, scan
    # the whole table at every level while it holds some thousands of turns: a path of n
    # turns then cost n table scans, and turn 2000 of one session 225 ms instead of 30.)
    head = b("head", type_=t.turns.c.id.type)
    walk = select(head.label("id"), literal(0).label("depth")).cte("walk", recursive=True)
    parent = select(t.turns.c.parent_id).where(t.turns.c.id == walk.c.id).scalar_subquery()
    goes_on: Any = walk.c.id.is_not(None)
    if to_compaction:
        # Stop at the first turn (from the head) a compaction that is not dropped covers
        # through: it is the one reaching furthest along this path, so the turns above
        # it are never sent and need not be read (docs/compaction.md#which-one-applies).
        # A branch from above that turn never walks through it, so never sees it.
        c = t.compactions
        covers = select(c.c.id).where(
            c.c.through_turn_id == walk.c.id,
            c.c.dropped_at.is_(None),
            usable_by(b("native_of")),
        )
        goes_on = goes_on & ~covers.exists()
    walk = walk.union_all(select(parent, (walk.c.depth + 1).label("depth")).where(goes_on))
    return TURN_COLUMNS.join(walk, walk.c.id == t.turns.c.id).order_by(walk.c.depth.desc())


PATH = _path()

# The path from a head back to the newest turn a live compaction covers through, that
# turn first (or back to the root when none covers a turn of it): what a claim reads.
# ``native_of`` names the provider whose native compactions count (statements.compactions).
PATH_TO_COMPACTION = _path(to_compaction=True)

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
