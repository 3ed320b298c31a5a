"""How every parley process logs (docs/operations.md#logs): today's text lines, or, with
``PARLEY_LOG_FORMAT=json``, one JSON object per line.

A JSON line has ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message`` and ``pid``;
``session_id``, ``turn_id`` and ``run_id`` when the line concerns one (the ids of
:mod:`parley.telemetry.log_context`, set where a kick, a driver's claim or a gateway request
starts work on one, so no ``log.warning(...)`` call passes them); ``exception`` with the
traceback when there is one; and whatever ``extra=`` a library gave the record.

The JSON is python-json-logger's formatter (renamed fields, a UTC timestamp, any
``extra`` field, exceptions and values ``json`` cannot encode, each line one object)
rather than a formatter of our own: what it covers is what a hand-written one gets wrong
first.

In both formats every control character of a field (C0, DEL, C1, and Unicode's line and
paragraph separators) is written as a backslash escape (``\\n``, ``\\x1b``): a field
carries what a client sent (the gateway's access line has the request's decoded path),
and a ``%0a`` in it must not forge a line, nor a ``%1b`` drive the terminal that shows
the log.  A traceback keeps its line breaks, which are its own.

This module owns the setup for the command line's every process (:func:`configure_logging`)
and hands Celery's worker the same handler (:func:`celery_worker_logging`) instead of
letting it install its own.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from enum import StrEnum
from types import TracebackType
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from parley.errors import ParleyError
from parley.settings import Settings
from parley.telemetry.log_context import current_ids

TEXT_FORMAT = "%(asctime)s %(name)s %(message)s"
"""The text lines' format (the default): time, logger, message."""

# Celery's two lines per task ("received", "succeeded") say less than the one the driver
# logs per kick, and cost each kick two formatted writes; Alembic's two lines each time a
# process reads the schema's revision say nothing an operator acts on: warnings only.
QUIET_LOGGERS = ("celery.worker.strategy", "celery.app.trace", "alembic.runtime.migration")


# Each control character → its escape; the common ones as Python spells them.
CONTROL_ESCAPES = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))},
    **{ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"},
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}
TRACEBACK_ESCAPES = {code: text for code, text in CONTROL_ESCAPES.items() if code != ord("\n")}


def escape_controls(text: str) -> str:
    """``text`` with every control character written as a backslash escape."""
    return text.translate(CONTROL_ESCAPES)


def escape_traceback(text: str) -> str:
    """A traceback's text with every control character but its line breaks escaped."""
    return text.translate(TRACEBACK_ESCAPES)


def format_exception_lines(ei: Any) -> str:
    """A traceback as logging writes it, but each exception's own message (which may hold
    text a client sent) on one line: its line breaks escaped, the frames' kept."""
    exception = traceback.TracebackException(*ei)
    messages: set[str] = set()
    chain: traceback.TracebackException | None = exception
    seen: set[int] = set()
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        messages.update(chain.format_exception_only())
        chain = chain.__cause__ or (None if chain.__suppress_context__ else chain.__context__)
    text = "".join(
        escape_controls(chunk.rstrip("\n")) + "\n" if chunk in messages else chunk
        for chunk in exception.format()
    )
    return text.removesuffix("\n")


class LogFormat(StrEnum):
    """What ``PARLEY_LOG_FORMAT`` may name."""

    TEXT = "text"
    JSON = "json"


def log_format(settings: Settings) -> LogFormat:
    """The format ``PARLEY_LOG_FORMAT`` names (unset: text); the settings refused any
    other value, so a typo stops the process at its start rather than leaving it logging
    in a format nothing reads."""
    return LogFormat(settings.log_format)


class IdsOnRecords(logging.Filter):
    """Puts the ids of the current log context on each record (as attributes, so a
    formatter sees them like any ``extra``); ids the call gave itself are kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in current_ids().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


class TextLines(logging.Formatter):
    """The text lines (:data:`TEXT_FORMAT`), control characters escaped."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return escape_traceback(format_exception_lines(ei))

    def formatStack(self, stack_info: str) -> str:
        return escape_traceback(super().formatStack(stack_info))


class CommandLines(logging.Formatter):
    """A command's warnings (not a daemon's), for the person at the terminal: each the
    message alone, on one line.  A parley error it carries (a provider out of reach, a
    store that failed) ends the same line, as the command's own errors are printed:
    what the command shows next (a turn's end) says the rest.  Any other exception keeps
    its traceback, a bug's to report."""

    def format(self, record: logging.LogRecord) -> str:
        line = escape_controls(record.getMessage())
        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return line
        if isinstance(error, ParleyError):
            return f"{line} ({escape_controls(f'{type(error).__name__}: {error}')})"
        return f"{line}\n{escape_traceback(format_exception_lines(record.exc_info))}"


class JsonLines(JsonFormatter):
    """One JSON object per record, on one line, control characters escaped in every
    string (JSON's own escapes would hand them back to whatever reads the field)."""

    def __init__(self) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s %(process)d",
            rename_fields={
                "levelname": "level",
                "name": "logger",
                "process": "pid",
                "exc_info": "exception",
            },
            timestamp="time",
            # uvicorn repeats some messages with terminal colours for its own formatter.
            reserved_attrs=[*RESERVED_ATTRS, "color_message"],
        )

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        # The time first, as a person reading the lines expects (the library adds it last).
        ordered = {"time": log_data.pop("time"), **log_data}
        return {
            name: escape_traceback(value) if name in TRACEBACKS else _escaped(value)
            for name, value in ordered.items()
        }


TRACEBACKS = frozenset({"exception", "stack_info"})
"""The JSON fields that hold a traceback (renamed ``exc_info``, and ``stack_info``)."""


def _escaped(value: Any) -> Any:
    """``value`` with every string in it escaped (an ``extra`` field may be a dict)."""
    if isinstance(value, str):
        return escape_controls(value)
    if isinstance(value, dict):
        return {escape_controls(str(k)): _escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_escaped(item) for item in value]
    return value


def configure_logging(
    level: int, log_format: LogFormat, *, text: logging.Formatter | None = None
) -> None:
    """Make the root logger write ``level`` and above to stderr in ``log_format``,
    replacing any handler it had (this is a process's entry point speaking); ``text``
    formats the text lines (default :class:`TextLines`).  In JSON, Python's warnings and
    uncaught exceptions are logged too, so that nothing the process writes to stderr is
    anything but a JSON line."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format is LogFormat.JSON:
        handler.addFilter(IdsOnRecords())
        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(text or TextLines())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    if log_format is LogFormat.JSON:
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread


def celery_worker_logging(app: Any, log_format: LogFormat) -> list[str]:
    """Before ``celery worker`` starts in this process: in JSON, keep Celery from
    setting up loggers of its own (its task loggers' handler, in its own format and not
    propagated to ours, and its multiprocessing logger's: a connected ``setup_logging``
    receiver tells it that logging is done), send what is printed to stdout and stderr
    (host code's ``print``) through logging as Celery would, and have its shutdown
    notices logged rather than written straight to the terminal.  Returns the options
    to add to the ``celery`` command (``--quiet``: no multi-line banner).  In text,
    Celery sets up what it always has (it leaves the root logger's handler alone:
    ``worker_hijack_root_logger`` is off)."""
    if log_format is not LogFormat.JSON:
        return []
    from celery.apps import worker as celery_worker
    from celery.signals import setup_logging

    def keep_ours(loglevel: int | None = None, **_kwargs: Any) -> None:
        if loglevel:
            logging.getLogger().setLevel(loglevel)
        if app.conf.worker_redirect_stdouts:
            app.log.redirect_stdouts(app.conf.worker_redirect_stdouts_level)

    setup_logging.connect(keep_ours, weak=False)
    celery_worker.safe_say = _say_through_logging
    return ["--quiet"]


def _say_through_logging(msg: str, f: Any = None) -> None:
    """Celery's ``safe_say`` (its warm and cold shutdown notices, written to the
    terminal from a signal handler), as a log line."""
    logging.getLogger("celery.apps.worker").info("%s", msg.strip())


def _log_uncaught(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    logging.getLogger("parley").critical("uncaught exception", exc_info=(kind, value, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return  # (as the default hook: a thread that exits says nothing)
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("parley").critical(
        "uncaught exception in thread %s",
        name,
        exc_info=(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback),
    )


__all__ = [
    "CommandLines",
    "IdsOnRecords",
    "JsonLines",
    "LogFormat",
    "TextLines",
    "celery_worker_logging",
    "configure_logging",
    "escape_controls",
    "escape_traceback",
    "log_format",
]
