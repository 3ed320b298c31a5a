"""Statements on a session's row: reading and listing, its head and title, its fence (the
lock of submissions, the check of every commit), its prefix generations."""

from __future__ import annotations

from sqlalchemy import Boolean, case, func, literal_column, select, text, tuple_, update

from parley.schemas import tables as t
from parley.store.statements.binds import b
from parley.store.statements.run_status import WAITING

SESSION = select(t.sessions).where(t.sessions.c.id == b("session_id"))

SESSIONS_OF_TENANT = (
    select(t.sessions)
    .where(t.sessions.c.tenant == b("tenant"))
    .order_by(t.sessions.c.created_at.desc(), t.sessions.c.id.desc())
    .limit(b("limit"))
)
# Keyset paging: the sessions after (older than) a page's last one.
_OLDER = tuple_(t.sessions.c.created_at, t.sessions.c.id) < tuple_(
    b("created_at", type_=t.sessions.c.created_at.type), b("id", type_=t.sessions.c.id.type)
)
SESSIONS_OF_TENANT_BEFORE = SESSIONS_OF_TENANT.where(_OLDER)
# The same without the sessions batch lines opened, in the words of the partial index
# ix_sessions_conversations (so both databases read it, not the batches' sessions).
CONVERSATIONS_OF_TENANT = SESSIONS_OF_TENANT.where(text(t.CONVERSATION))
CONVERSATIONS_OF_TENANT_BEFORE = CONVERSATIONS_OF_TENANT.where(_OLDER)

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

# The session's flags (migration 0030), each set under its row's lock in the transaction
# that stores what it stands for.
MARK_COMPACTED = update(t.sessions).where(t.sessions.c.id == b("session_id")).values(compacted=True)
MARK_PUSHES = (
    update(t.sessions)
    .where(
        t.sessions.c.id
        == select(t.turns.c.session_id).where(t.turns.c.id == b("turn_id")).scalar_subquery()
    )
    .values(pushes=True)
)

# The fence check of a step commit: charge the tokens only while the fence still holds.
CHARGE_SESSION = (
    update(t.sessions)
    .where(t.sessions.c.id == b("session_id"), t.sessions.c.fence == b("fence"))
    .values(tokens_used=t.sessions.c.tokens_used + b("tokens"))
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
_deferred = t.runs.alias("deferred")
# Sessions a driver has something to do for: a queued or running turn (none with a time
# still set: the sweeper releases those when it comes, RELEASE_DUE), and no turn waiting
# for answers, nor one before it waiting for its time or for provider capacity still to
# come (which the turns after it wait behind: a kick would find nothing).  With each, its
# most urgent lane ("interactive" sorts after "batch"), for the queue its kick goes to.
# A batch run still waiting for its place in the batch window is not work to kick here:
# no driver would claim it (src/parley/runtime/batch_window.py); one placed is, if its kick is lost.
SESSIONS_WITH_WORK = (
    select(t.runs.c.session_id, func.max(t.runs.c.priority).label("priority"))
    .where(
        text(t.ACTIVE_RUN),
        text(f"NOT ({t.UNPLACED_BATCH_RUN})"),
        ~select(_waiting.c.id)
        .where(
            _waiting.c.session_id == t.runs.c.session_id,
            # Spelt out, as ACTIVE_RUN is, the one bind aside.
            _waiting.c.status == literal_column(f"'{WAITING}'"),
        )
        .exists(),
        ~select(_deferred.c.id)
        .where(
            _deferred.c.session_id == t.runs.c.session_id,
            _deferred.c.not_before > b("now"),
            # (A turn before it, running when a later one was delayed, is work.)
            _deferred.c.queue_position < t.runs.c.queue_position,
        )
        .exists(),
    )
    .group_by(t.runs.c.session_id)
)
