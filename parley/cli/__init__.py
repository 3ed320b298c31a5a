"""The ``parley`` command line (docs/reference.md, "Command line").

Configuration comes from the environment (``PARLEY_DATABASE_URL``, ``PARLEY_HOST``) or
the matching options.  Errors from :mod:`parley.errors` print one clear line and exit 2.
Each group of commands has a module of its own: ``turns`` (submit, resume, follow, say,
interrupt, approve), ``sessions`` (new, history, tree, chat), ``fleet`` (worker, beat),
``gateway``, ``maintenance`` (demo, migrate, prune, status); ``parser`` declares them all.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Sequence

from rich.console import Console

from parley.cli.parser import command_parser
from parley.errors import ParleyError
from parley.logs import LogFormat, configure_logging, log_format
from parley.render import error_line
from workers.telemetry.log_context import log_scope


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status."""
    parser = command_parser()
    # `parley worker` hands whatever it does not know to `celery worker`.
    args, extra = parser.parse_known_args(argv)
    if extra and not args.takes_celery_args:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.celery_args = extra
    console = Console(highlight=False)
    try:
        _configure_logging(args)
        # The lines a command logs name the session or turn it works on, once the client
        # has found it (a daemon's requests and turns set their own).
        with contextlib.nullcontext() if args.daemon else log_scope():
            status: int = args.command(args, console)
    except ParleyError as exc:
        # On stderr and on one line, so that `S=$(parley new …)` never captures an error.
        Console(stderr=True, highlight=False).print(error_line(exc), soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        return 130
    return status


def _configure_logging(args: argparse.Namespace) -> None:
    """``PARLEY_LOG_FORMAT`` for this process (a value it does not know stops the command
    before anything else happens).  A daemon logs its work; any other command logs only
    warnings, and in text leaves them to Python's default (the message alone) as it
    always has."""
    args.log_format = log_format()
    if args.daemon:
        configure_logging(logging.INFO, args.log_format)
    elif args.log_format is LogFormat.JSON:
        configure_logging(logging.WARNING, args.log_format)


if __name__ == "__main__":
    sys.exit(main())
