"""The webhook outbox (docs/operations.md#webhooks): the store's side of at-least-once delivery.

A turn's end that has a URL to go to (its session's, else its host's) inserts a row in
the transaction that commits the end (:func:`insert_delivery`, called by
``workers.store.turn_runs``): the end cannot commit without its delivery, nor the delivery
exist without the end.  The deliverer then claims due rows (:meth:`OutboxStore.claim_due`)
by moving them a lease into the future and counting the attempt, posts them outside any
transaction, and records how it went.  A deliverer that dies mid-post leaves its rows to
come due again when the lease runs out: a receiver may see a delivery twice, never zero
times, and tells repeats by the delivery id.

Its statements are in the catalogue, :mod:`workers.store.statements.outbox`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from schemas.operations import WebhookDelivery
from workers.store import statements as q
from workers.store.clock import utc_now
from workers.store.connection import StoreConnection, Transactions
from workers.store.rows import aware


def insert_delivery(db: StoreConnection, *, delivery_id: str, run_id: str, url: str) -> None:
    """In a turn's final transaction, after its run row was ended: the delivery of that
    end to ``url``, due at once."""
    db.execute(
        q.INSERT_DELIVERY,
        {"b_delivery_id": delivery_id, "b_url": url, "b_now": utc_now(), "b_run_id": run_id},
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
    )


class OutboxStore(Transactions):
    """The deliverer's protocol with the store (see the module docstring)."""

    def claim_due(self, *, limit: int, lease_until: datetime) -> list[WebhookDelivery]:
        """Up to ``limit`` due deliveries, each now counting one more attempt and due
        again at ``lease_until`` unless its outcome is recorded first."""
        with self._tx() as db:
            rows = db.execute(
                q.CLAIM_DUE, {"b_now": utc_now(), "b_limit": limit, "b_lease_until": lease_until}
            ).all()
        return sorted((delivery_of(r) for r in rows), key=lambda d: d.next_attempt_at)

    def record_delivered(self, delivery_id: str, status: int) -> None:
        """A receiver answered ``status`` (2xx): the delivery is done."""
        with self._tx() as db:
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
        with self._tx() as db:
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
        return self._reading(lambda db: db.execute(q.ANY_UNSETTLED).one_or_none()) is not None

    def deliveries(self, session_id: str) -> list[WebhookDelivery]:
        """A session's deliveries, oldest first."""
        rows: Sequence[Any] = self._reading(
            lambda db: db.execute(q.DELIVERIES_OF_SESSION, {"b_session_id": session_id}).all()
        )
        return [delivery_of(r) for r in rows]

    def delivery(self, delivery_id: str) -> WebhookDelivery | None:
        """One delivery (None if there is no such row)."""
        row = self._reading(
            lambda db: db.execute(q.DELIVERY, {"b_delivery_id": delivery_id}).one_or_none()
        )
        return None if row is None else delivery_of(row)
