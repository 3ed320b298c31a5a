"""The fleet's processes: ``worker`` (a Celery worker) and ``beat`` (the sweeper).  Both
are configured by their environment alone."""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from parley.cli import worker_processes
from parley.logs import celery_worker_logging
from parley.telemetry import tracing


def worker(args: argparse.Namespace, console: Console) -> int:
    fleet_environment(args)
    count = worker_processes.process_count(args.processes, args.settings, args.celery_args)
    if count > 1:
        return _supervise(count, args)
    worker_processes.die_with_parent()
    tracing.name_service("parley-worker")
    import click
    from celery.bin.celery import celery

    from parley.celery_tasks import app, settings
    from parley.fleet.app import QueueTypeMismatch, declare_kick_queues

    # A kick queue of another type on RabbitMQ: one line naming it and the ways out
    # (QueueTypeMismatch), not Celery's traceback of PRECONDITION_FAILED.  Anything else
    # (a broker out of reach, credentials it refuses) is Celery's to wait for or report,
    # as it declares the queues when it connects.
    try:
        declare_kick_queues(app, settings)
    except QueueTypeMismatch:
        raise
    except Exception:
        pass
    argv = [
        *("--app", "parley.celery_tasks:app", *celery_worker_logging(app, args.log_format)),
        # Both lanes, interactive first (the order kombu asks the broker in).
        *("worker", "--queues", f"{settings.queue},{settings.batch_queue}"),
        *("--loglevel", "INFO", *args.celery_args),
    ]
    if not any(a in ("-n", "--hostname") or a.startswith("--hostname=") for a in argv):
        # A node name of its own: Celery's default (celery@HOST) is the same for every
        # worker on a host, and on RabbitMQ two of them fight over one exclusive control
        # queue, the loser of a reconnect exiting.
        argv += ["--hostname", f"parley-{os.getpid()}@%h"]
    # Celery's own exit status (1 after an "Unrecoverable error"), which app.worker_main
    # drops: a worker that cannot go on must not look like one that was told to stop.
    try:
        status = celery.main(args=argv, standalone_mode=False)
    except click.ClickException as exc:  # a mistyped Celery option: its usage, no traceback
        exc.show()
        return exc.exit_code
    return int(status or 0)


def _supervise(count: int, args: argparse.Namespace) -> int:
    """Run ``count`` worker processes as one worker (:mod:`parley.cli.worker_processes`);
    this process serves their metrics, which they count in files of one directory."""
    from parley import metrics_export

    bind = metrics_export.MetricsBind.from_settings(args.settings)
    if bind is not None:
        metrics_export.serve_worker(bind)  # (sets PROMETHEUS_MULTIPROC_DIR for them)
        os.environ.pop(metrics_export.PORT_VARIABLE, None)  # the port is this process's
    try:
        return worker_processes.Supervisor(count, args.celery_args).run()
    finally:
        if bind is not None:
            metrics_export.stop_worker()


def beat(args: argparse.Namespace, console: Console) -> int:
    fleet_environment(args)
    tracing.name_service("parley-beat")
    from parley.celery_tasks import run_sweeper

    run_sweeper()
    return 0


def fleet_environment(args: argparse.Namespace) -> None:
    """A fleet process is configured by its environment alone: the options, when given,
    are that environment."""
    if args.db:
        os.environ["PARLEY_DATABASE_URL"] = args.db
    if args.host:
        os.environ["PARLEY_HOST"] = args.host
