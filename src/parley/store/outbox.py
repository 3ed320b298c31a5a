"""The webhook outbox (docs/operations.md#webhooks): the store's side of at-least-once delivery.

A turn's end that has a URL to go to (its session's, else its host's) inserts a row in
the transaction that commits the end (:func:`insert_delivery`, called by
``parley.store.turn_runs``): the end cannot commit without its delivery, nor the delivery
exist without the end.  The deliverer then claims due rows (:meth:`OutboxStore.claim_due`)
by moving them a lease into the future and counting the attempt, posts them outside any
transaction, and records how it went.  A deliverer that dies mid-post leaves its rows to
come due again when the lease runs out: a receiver may see a delivery twice, never zero
times, and tells repeats by the delivery id.

Its statements are in the catalogue, :mod:`parley.store.statements.outbox`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from parley.schemas.operations import WebhookDelivery
from parley.schemas.records import TurnStatus
from parley.store import statements as q
from parley.store.clock import utc_now
from parley.store.connection import StoreConnection, Transactions
from parley.store.rows import aware


def insert_delivery(
    db: StoreConnection,
    *,
    delivery_id: str,
    run_id: str,
    url: str,
    kind: str | None = None,
    token: str | None = None,
) -> None:
    """In a turn's final transaction, after its run row was ended: the delivery of that
    end to ``url``, due at once (``kind`` ``a2a``: an A2A push notification, with its
    receiver's ``token``)."""
    db.execute(
        q.INSERT_DELIVERY,
        {
            "b_delivery_id": delivery_id,
            "b_url": url,
            "b_now": utc_now(),
            "b_run_id": run_id,
            "b_kind": kind,
            "b_token": token,
        },
    )


def insert_push_deliveries(db: StoreConnection, *, turn_id: str, run_id: str) -> None:
    """In a turn's final transaction: a delivery of its end to each of its A2A push
    configurations."""
    for config in db.execute(q.PUSH_CONFIGS_OF_TURN, {"b_turn_id": turn_id}).all():
        insert_delivery(
            db,
            delivery_id=str(uuid.uuid4()),
            run_id=run_id,
            url=config.url,
            kind=A2A,
            token=config.token,
        )


def delivery_of(row: Any) -> WebhookDelivery:
    """A ``webhook_outbox`` row as a record."""

    def when(value: datetime | None) -> datetime | None:
        return None if value is None else aware(value)

    return WebhookDelivery(
        delivery_id=row.id,
        session_id=row.session_id,
        turn_id=row.turn_id,
        run_id=row.run_id,
        url=row.url,
        outcome=row.outcome,
        reply=row.reply,
        error=row.error,
        steps=int(row.steps),
        input_tokens=int(row.input_tokens),
        output_tokens=int(row.output_tokens),
        ended_at=aware(row.ended_at),
        created_at=aware(row.created_at),
        attempts=int(row.attempts),
        next_attempt_at=aware(row.next_attempt_at),
        last_attempt_at=when(row.last_attempt_at),
        last_status=row.last_status,
        last_error=row.last_error,
        delivered_at=when(row.delivered_at),
        given_up_at=when(row.given_up_at),
        kind=row.kind,
        token=row.token,
    )


UNENDED = frozenset({TurnStatus.QUEUED, TurnStatus.RUNNING, TurnStatus.WAITING})
A2A = "a2a"
"""The ``kind`` of a delivery made for an A2A push configuration."""


@dataclass(frozen=True)
class PushConfig:
    """Where a turn's end is also posted, in A2A's form (docs/protocols.md#5-a2a)."""

    config_id: str
    turn_id: str
    url: str
    token: str | None


class OutboxStore:
    """The deliverer's protocol with the store (see the module docstring)."""

    def __init__(self, db: Transactions) -> None:
        self._db = db

    def claim_due(self, *, limit: int, lease_until: datetime) -> list[WebhookDelivery]:
        """Up to ``limit`` due deliveries, each now counting one more attempt and due
        again at ``lease_until`` unless its outcome is recorded first."""
        with self._db.tx() as db:
            rows = db.execute(
                q.CLAIM_DUE, {"b_now": utc_now(), "b_limit": limit, "b_lease_until": lease_until}
            ).all()
        return sorted((delivery_of(r) for r in rows), key=lambda d: d.next_attempt_at)

    def record_delivered(self, delivery_id: str, status: int) -> None:
        """A receiver answered ``status`` (2xx): the delivery is done."""
        with self._db.tx() as db:
            db.execute(
                q.RECORD_DELIVERED,
                {"b_delivery_id": delivery_id, "b_now": utc_now(), "b_status": status},
            )

    def record_failed(
        self,
        delivery: WebhookDelivery,
        *,
        status: int | None,
        error: str,
        retry_at: datetime,
        give_up: bool,
    ) -> bool:
        """The attempt ``delivery`` (as claimed) failed: due again at ``retry_at``, or
        given up.  False if a later claim of the row has taken over meanwhile."""
        with self._db.tx() as db:
            updated = db.execute(
                q.RECORD_FAILED,
                {
                    "b_delivery_id": delivery.delivery_id,
                    "b_attempts": delivery.attempts,
                    "b_retry_at": retry_at,
                    "b_status": status,
                    "b_error": error,
                    "b_given_up_at": utc_now() if give_up else None,
                },
            ).rowcount
        return bool(updated)

    def has_unsettled_deliveries(self) -> bool:
        """Whether any delivery is still to make."""
        return self._db.reading(lambda db: db.execute(q.ANY_UNSETTLED).one_or_none()) is not None

    def deliveries(self, session_id: str) -> list[WebhookDelivery]:
        """A session's deliveries, oldest first."""
        rows: Sequence[Any] = self._db.reading(
            lambda db: db.execute(q.DELIVERIES_OF_SESSION, {"b_session_id": session_id}).all()
        )
        return [delivery_of(r) for r in rows]

    def add_push_config(self, turn_id: str, url: str, token: str | None) -> PushConfig:
        """A push configuration for the turn.  Its run is locked first: if the turn has
        ended (or its end commits meanwhile, which the lock waits for), that end is
        posted to it at once, as the end's transaction would have."""
        config = PushConfig(str(uuid.uuid4()), turn_id, url, token)
        with self._db.tx() as db:
            # The session's flag first (its row, then the run: the order every writer
            # locks them in), so that an end that finds it unset has ended before this.
            db.execute(q.MARK_PUSHES, {"b_turn_id": turn_id})
            run = db.execute(q.LOCK_RUN_OF_TURN, {"b_turn_id": turn_id}).one()
            db.execute(
                q.INSERT_PUSH_CONFIG,
                {
                    "b_config_id": config.config_id,
                    "b_turn_id": turn_id,
                    "b_url": url,
                    "b_token": token,
                    "b_now": utc_now(),
                },
            )
            if run.status not in UNENDED:
                insert_delivery(
                    db, delivery_id=str(uuid.uuid4()), run_id=run.id, url=url, kind=A2A, token=token
                )
        return config

    def push_configs(self, turn_id: str) -> list[PushConfig]:
        """The turn's push configurations, oldest first."""
        rows: Sequence[Any] = self._db.reading(
            lambda db: db.execute(q.PUSH_CONFIGS_OF_TURN, {"b_turn_id": turn_id}).all()
        )
        return [PushConfig(r.id, r.turn_id, r.url, r.token) for r in rows]

    def delete_push_config(self, turn_id: str, config_id: str) -> bool:
        """Forget one of the turn's push configurations; False if it has none of that id."""
        with self._db.tx() as db:
            deleted = db.execute(
                q.DELETE_PUSH_CONFIG, {"b_turn_id": turn_id, "b_config_id": config_id}
            ).rowcount
        return bool(deleted)

    def delivery(self, delivery_id: str) -> WebhookDelivery | None:
        """One delivery (None if there is no such row)."""
        row = self._db.reading(
            lambda db: db.execute(q.DELIVERY, {"b_delivery_id": delivery_id}).one_or_none()
        )
        return None if row is None else delivery_of(row)
