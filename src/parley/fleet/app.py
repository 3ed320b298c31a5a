"""The Celery app factory: one configuration for producers and workers alike.

At-least-once kicks: late acks, reject on worker lost, prefetch 1.  On a Redis broker
the visibility timeout is set on every app (the shortest one touching a broker wins);
RabbitMQ (``amqp://``) needs none, and its kick queues are quorum queues unless
``PARLEY_BROKER_QUEUE_TYPE=classic``.  JSON only, and no result backend: turn state lives
in PostgreSQL.
"""

from __future__ import annotations

import math
import re
from typing import Any

import redis
from amqp.exceptions import PreconditionFailed  # type: ignore[import-untyped]
from celery import Celery
from kombu import Exchange, Queue  # type: ignore[attr-defined]
from kombu.exceptions import OperationalError
from kombu.utils.url import parse_url

from parley.coordination import constants as c
from parley.fleet.settings import FleetSettings
from parley.schemas.errors import InvalidRequest

#: Celery's ``broker_transport`` for parley's kombu channel (``src/parley/fleet/transport.py``),
#: by name: kombu imports it when a connection is made, not when parley is imported.
TRANSPORT = "parley.fleet.transport:Transport"
#: The same for a ``rediss://`` broker.
TLS_TRANSPORT = "parley.fleet.transport:TlsTransport"

#: What a broker that is down or refusing raises (kombu wraps connection errors in
#: ``OperationalError``): an outage that the sweeper rides out, not a bug, so callers log
#: it on one line rather than with its chained traceback.
BROKER_ERRORS: tuple[type[Exception], ...] = (OperationalError, redis.RedisError, OSError)


def transport_for(broker_url: str) -> str | None:
    """The ``broker_transport`` setting for ``broker_url``: parley's channel for a
    ``redis://`` or ``rediss://`` URL, else None (kombu picks by scheme)."""
    if broker_url.startswith("redis://"):
        return TRANSPORT
    if broker_url.startswith("rediss://"):
        return TLS_TRANSPORT
    return None


REDIS_BROKER_CONNECTIONS = 10
"""kombu's own size for a Redis broker channel's connection pool, which raises past it: a
worker on the threads pool raises it to its concurrency (``parley.celery_tasks``)."""


def is_redis(broker_url: str) -> bool:
    """Whether ``broker_url`` names a Redis broker (else RabbitMQ, or another of kombu's)."""
    return broker_url.startswith(("redis://", "rediss://", "redis+socket://"))


def is_amqp(broker_url: str) -> bool:
    """Whether ``broker_url`` names a RabbitMQ broker (kombu's AMQP transport)."""
    return broker_url.startswith(("amqp://", "amqps://", "pyamqp://"))


def quorum_queues(settings: FleetSettings) -> bool:
    """Whether the fleet's kick queues are RabbitMQ quorum queues: on a RabbitMQ broker,
    unless ``PARLEY_BROKER_QUEUE_TYPE=classic``.  (A Redis broker has no queue types.)"""
    return is_amqp(settings.broker_url) and settings.queue_type == "quorum"


def kick_exchange(queue: str) -> str:
    """The topic exchange of a quorum kick queue.  Not the queue's own name, which the
    classic queues' direct exchange has (Celery's default): a fleet that moves from
    classic queues to quorum ones deletes its queues, and need not find that exchange."""
    return f"{queue}.kicks"


def kick_queues(settings: FleetSettings) -> list[Any]:
    """The interactive queue, then the batch queue (the order a worker consumes them in,
    docs/admission.md).

    Quorum queues: replicated and durable, and redelivering what a closed channel took,
    like classic durable ones.  Each is bound to a topic exchange of its own, because
    Celery sends a kick with a countdown to a quorum queue through RabbitMQ's delay queues
    (its "native delayed delivery", which a worker declares as it starts), and those
    forward a message only to a topic exchange: with the direct exchange of a classic
    queue, the kick would reach a worker at once and wait there, unacknowledged, in one
    of its slots (a quorum queue's prefetch does not grow for it, as a classic one's
    does)."""
    names = (settings.queue, settings.batch_queue)
    if not quorum_queues(settings):
        return [Queue(name) for name in names]  # type: ignore[no-untyped-call]
    return [
        Queue(  # type: ignore[no-untyped-call]
            name,
            Exchange(kick_exchange(name), type="topic"),  # type: ignore[no-untyped-call]
            routing_key=name,
            queue_arguments={"x-queue-type": "quorum"},
        )
        for name in names
    ]


class QueueTypeMismatch(InvalidRequest):
    """The broker has a kick queue of another type than the fleet's (or other arguments):
    RabbitMQ refuses to declare it again (``PRECONDITION_FAILED``)."""

    def __init__(self, queue: str, settings: FleetSettings, reason: object) -> None:
        other = "classic" if settings.queue_type == "quorum" else "quorum"
        vhost = parse_url(settings.broker_url).get("virtual_host") or "/"
        super().__init__(
            f"RabbitMQ already has a queue {queue!r} that is not the {settings.queue_type} "
            f"queue this fleet declares ({reason}): delete it (`rabbitmqctl delete_queue -p "
            f"{vhost} {queue}`, with the fleet stopped; the sweeper sends its kicks again), "
            f"or set PARLEY_BROKER_QUEUE_TYPE={other} to keep it"
        )


def declare_kick_queues(app: Any, settings: FleetSettings) -> None:
    """Declare the fleet's kick queues on a RabbitMQ broker now (nothing on a Redis one):
    :class:`QueueTypeMismatch` if the broker has one of another type, naming it.  A
    broker out of reach raises as kombu does (one of :data:`BROKER_ERRORS`)."""
    if not is_amqp(settings.broker_url):
        return
    with app.connection_for_write() as connection:
        for queue in kick_queues(settings):
            channel = connection.channel()
            try:
                queue.bind(channel).declare()
            except PreconditionFailed as exc:
                raise QueueTypeMismatch(queue.name, settings, exc) from None
            finally:
                channel.close()  # (RabbitMQ closed it already after a refusal)


def transport_options(broker_url: str) -> dict[str, Any]:
    """Celery's ``broker_transport_options`` for ``broker_url``.

    A Redis broker redelivers an unacknowledged kick once the visibility timeout passes
    (while it still runs, if it runs that long), and kombu sets no socket timeout of its
    own.  These mean nothing to RabbitMQ: it redelivers a kick only when the channel that
    took it closes (its worker died or lost the connection), and Celery's heartbeats (120
    s) tell it of a connection gone half-open.  Options kombu's AMQP transport does not
    know would reach py-amqp's ``Connection`` as keywords it ignores, so it gets none."""
    if not is_redis(broker_url):
        return {}
    return {
        # BRPOP on the queues in the order the worker consumes them (interactive, then
        # batch), every time: kombu's default round robin would serve a batch kick
        # before an interactive one as often as not.
        "queue_order_strategy": "priority",
        "visibility_timeout": c.VISIBILITY_TIMEOUT_SECONDS,
        "socket_timeout": c.BROKER_SOCKET_SECONDS,
        "socket_connect_timeout": c.BROKER_SOCKET_SECONDS,
        "max_connections": REDIS_BROKER_CONNECTIONS,
    }


def create_app(settings: FleetSettings, *, name: str = "parley", stock_kombu: bool = False) -> Any:
    """A Celery app for ``settings``: producers send kicks with it, workers run them.

    A Redis broker goes through parley's kombu channel (``parley.fleet.transport``)
    unless ``stock_kombu``, which the benchmark's floor uses to measure Celery as shipped."""
    app = Celery(name, broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        broker_transport=None if stock_kombu else transport_for(settings.broker_url),
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # When the broker connection drops, a running kick goes on and its driver finishes
        # its turn (Celery 5's default, pinned here: Celery 6 is to turn it to True).  The
        # kick goes back on the queue (when the lost channel closes, or once the visibility
        # timeout passes), and the copy finds the session's lock held or nothing left to
        # do: kicks are idempotent.  True would SIGTERM the prefork process running the
        # kick (the threads pool cannot cancel one, and logs that it failed to), so its
        # turn would go on elsewhere with the step in flight redone.  While this is False,
        # Celery warns at each connection loss (a CPendingDeprecationWarning, logged on
        # py.warnings, announcing the new default): setting it does not silence that.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options=transport_options(settings.broker_url),
        # Interactive first: a worker consumes them in this order (docs/admission.md).
        task_queues=kick_queues(settings),
        # With quorum queues (Celery's defaults, pinned): a per-consumer prefetch, as
        # RabbitMQ refuses a global one there, and countdown kicks through delay queues
        # that are quorum queues too (kick_queues).
        worker_detect_quorum_queues=True,
        broker_native_delayed_delivery_queue_type="quorum",
        task_default_queue=settings.queue,
        task_routes={
            c.DRIVE_TASK: {"queue": settings.queue},
            c.SWEEP_TASK: {"queue": settings.queue},
        },
        worker_hijack_root_logger=False,
        # Task events (PARLEY_TASK_EVENTS=1), so that Flower and `celery -A
        # parley.celery_tasks events` see each kick: sent, received, started, succeeded.
        # Off by default: four PUBLISHes through kombu's fanout per kick, to nobody
        # unless a monitor listens, cost a streaming worker some 7% of its CPU.  (Flower
        # also turns the workers' on by remote control as it starts.)
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
    )
    return app


def send_kick(
    app: Any,
    settings: FleetSettings,
    session_id: str,
    *,
    priority: str = "interactive",
    countdown: float | None = None,
) -> None:
    """Ask the fleet to drive a session (a signal, not a job: duplicates are harmless),
    on the queue of its lane; with ``countdown``, not before that many seconds (a turn
    that waits for provider capacity).  :class:`QueueTypeMismatch` if the queue is of
    another type on the broker."""
    queue = settings.queue_of(priority)
    if countdown is not None and quorum_queues(settings):
        # RabbitMQ's delay queues count whole seconds, and Celery refuses a countdown of
        # less than one there (ValueError): round up, never down.
        countdown = float(math.ceil(countdown))
    try:
        app.send_task(c.DRIVE_TASK, args=[session_id], queue=queue, countdown=countdown)
    except PreconditionFailed as exc:
        raise QueueTypeMismatch(queue, settings, exc) from None


#: The countdown that Celery's native delayed delivery writes before a routing key: 28
#: binary digits, each followed by a dot (kombu.transport.native_delayed_delivery).
DELAY_BITS = re.compile(r"^(?:[01]\.){28}")


def kick_queue(routing_key: str) -> str:
    """The queue a delivered kick was sent to, from its routing key: a kick that waited
    in RabbitMQ's delay queues (a countdown on a quorum queue) carries its countdown's
    bits before it (``0.1.….parley.turns.batch``)."""
    return DELAY_BITS.sub("", routing_key, count=1)
