"""The ``parley`` command line (docs/reference.md, "Command line").

Configuration comes from the environment (``PARLEY_DATABASE_URL``, ``PARLEY_HOST``) or
the matching options (before or after the command).  Errors from :mod:`parley.errors`
print one clear line and exit 2; a reader that closes the pipe ends the command quietly
(:mod:`parley.cli.output`).  Each group of commands has a module of its own: ``turns``
(submit, resume, follow, say, interrupt, approve), ``sessions`` (new, history, tree,
chat), ``batches`` (batch submit, list, status, results, cancel), ``fleet`` (worker,
beat), ``gateway``, ``maintenance`` (demo, migrate, prune, status); ``parser`` declares
them all, ``connecting`` gives each its client.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Sequence

from parley.cli.output import console, leave_closed_pipe, use_log_format
from parley.cli.parser import command_parser
from parley.errors import ParleyError
from parley.logs import CommandLines, LogFormat, configure_logging, log_format
from parley.render import error_line
from parley.settings import Settings
from parley.telemetry.log_context import log_scope


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status."""
    parser = command_parser()
    # `parley worker` hands whatever it does not know to `celery worker`.
    args, extra = parser.parse_known_args(argv)
    if extra and not args.takes_celery_args:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.celery_args = extra
    try:
        # Every variable, read once here: a malformed one is one line naming it, and
        # nothing runs.
        args.settings = Settings.from_environment()
        _configure_logging(args)
        # The lines a command logs name the session or turn it works on, once the client
        # has found it (a daemon's requests and turns set their own).
        with contextlib.nullcontext() if args.daemon else log_scope():
            status: int = args.command(args, console())
        sys.stdout.flush()  # (here, where a closed pipe is caught, rather than at exit)
    except ParleyError as exc:
        # On stderr and on one line, so that `S=$(parley new …)` never captures an error.
        console(stderr=True).print(error_line(exc), soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return leave_closed_pipe()
    return status


def _configure_logging(args: argparse.Namespace) -> None:
    """``PARLEY_LOG_FORMAT`` for this process (a value it does not know stops the command
    before anything else happens).  A daemon logs its work; any other command logs only
    warnings, in text each on a line of its own (:class:`~parley.logs.CommandLines`: a
    provider out of reach is one line, not a traceback before the turn's end says it)."""
    args.log_format = log_format(args.settings)
    use_log_format(args.log_format)
    if args.daemon:
        configure_logging(logging.INFO, args.log_format)
    elif args.log_format is LogFormat.JSON:
        configure_logging(logging.WARNING, args.log_format)
    else:
        configure_logging(logging.WARNING, args.log_format, text=CommandLines())


if __name__ == "__main__":
    sys.exit(main())
