"""Statements on the webhook outbox: a turn's end's delivery row, the deliverer's claims of
due rows, and how each attempt went (see :mod:`parley.store.outbox`); and a turn's A2A
push configurations, whose deliveries go through it."""

from __future__ import annotations

from sqlalchemy import Integer, String, delete, insert, literal, select, update

from parley.schemas import tables as t
from parley.store.statements.binds import b

o = t.webhook_outbox
# Neither delivered nor given up: still to make.
UNSETTLED = (o.c.delivered_at.is_(None), o.c.given_up_at.is_(None))

# A snapshot of the run as the turn's end just left it, in the same transaction.
INSERT_DELIVERY = insert(o).from_select(
    [
        "id",
        "session_id",
        "turn_id",
        "run_id",
        "url",
        "outcome",
        "reply",
        "error",
        "steps",
        "input_tokens",
        "output_tokens",
        "ended_at",
        "created_at",
        "attempts",
        "next_attempt_at",
        "kind",
        "token",
    ],
    select(
        b("delivery_id", type_=String()),
        t.runs.c.session_id,
        t.runs.c.turn_id,
        t.runs.c.id,
        b("url", type_=String()),
        t.runs.c.status,
        t.runs.c.reply,
        t.runs.c.error,
        t.runs.c.steps,
        t.runs.c.input_tokens,
        t.runs.c.output_tokens,
        t.runs.c.ended_at,
        b("now", type_=t.Timestamp),
        literal(0, type_=Integer()),
        b("now", type_=t.Timestamp),
        b("kind", type_=String()),
        b("token", type_=String()),
    ).where(t.runs.c.id == b("run_id")),
)

p = t.push_configs
INSERT_PUSH_CONFIG = insert(p).values(
    id=b("config_id"),
    turn_id=b("turn_id"),
    url=b("url"),
    token=b("token"),
    created_at=b("now"),
)
PUSH_CONFIGS_OF_TURN = select(p).where(p.c.turn_id == b("turn_id")).order_by(p.c.created_at, p.c.id)
DELETE_PUSH_CONFIG = delete(p).where(p.c.turn_id == b("turn_id"), p.c.id == b("config_id"))
# The turn's current run, locked: a push configuration made while the turn's end commits
# waits for it, and then sees the end (and posts it itself).
LOCK_RUN_OF_TURN = (
    select(t.runs.c.id, t.runs.c.status).where(t.runs.c.turn_id == b("turn_id")).with_for_update()
)

# Due rows, oldest due first; on PostgreSQL skipping rows another deliverer is claiming
# (SQLite serialises writers anyway, and renders no FOR UPDATE).
_DUE = (
    select(o.c.id)
    .where(*UNSETTLED, o.c.next_attempt_at <= b("now"))
    .order_by(o.c.next_attempt_at)
    .limit(b("limit"))
    .with_for_update(skip_locked=True)
)

CLAIM_DUE = (
    update(o)
    .where(o.c.id.in_(_DUE.scalar_subquery()))
    .values(
        attempts=o.c.attempts + 1,
        next_attempt_at=b("lease_until"),
        last_attempt_at=b("now"),
    )
    .returning(*o.c)
)

RECORD_DELIVERED = (
    update(o)
    .where(o.c.id == b("delivery_id"), o.c.delivered_at.is_(None))
    .values(delivered_at=b("now"), given_up_at=None, last_status=b("status"), last_error=None)
)

# Only the attempt that claimed the row last records its failure: one whose lease ran out
# while it waited must not move a newer attempt's schedule.
RECORD_FAILED = (
    update(o)
    .where(o.c.id == b("delivery_id"), o.c.attempts == b("attempts"), *UNSETTLED)
    .values(
        next_attempt_at=b("retry_at"),
        last_status=b("status"),
        last_error=b("error"),
        given_up_at=b("given_up_at"),
    )
)

DELIVERIES_OF_SESSION = (
    select(o).where(o.c.session_id == b("session_id")).order_by(o.c.created_at, o.c.id)
)

DELIVERY = select(o).where(o.c.id == b("delivery_id"))

ANY_UNSETTLED = select(o.c.id).where(*UNSETTLED).limit(1)
