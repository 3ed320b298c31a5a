"""parley.logs and parley.telemetry.log_context: the format a variable names, the ids a line
carries, and the JSON line itself."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from parley.errors import InvalidRequest
from parley.logs import IdsOnRecords, JsonLines, LogFormat, TextLines, log_format
from parley.settings import Settings
from parley.telemetry.log_context import bind, current_ids, log_context, log_scope


@pytest.fixture
def lines() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger of its own writing JSON lines into a buffer."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(IdsOnRecords())
    handler.setFormatter(JsonLines())
    logger = logging.getLogger(f"tests.logs.{id(out)}")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, out
    logger.removeHandler(handler)


def parsed(out: io.StringIO) -> list[dict[str, Any]]:
    text = out.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_the_format_is_text_unless_json_is_asked_and_anything_else_is_refused() -> None:
    def format_of(environ: dict[str, str]) -> LogFormat:
        return log_format(Settings.from_environment(environ))

    assert format_of({}) is LogFormat.TEXT
    assert format_of({"PARLEY_LOG_FORMAT": ""}) is LogFormat.TEXT
    assert format_of({"PARLEY_LOG_FORMAT": "text"}) is LogFormat.TEXT
    assert format_of({"PARLEY_LOG_FORMAT": "json"}) is LogFormat.JSON
    for wrong in ("JSON", "xml", "json ", "logfmt"):
        with pytest.raises(InvalidRequest) as refused:
            format_of({"PARLEY_LOG_FORMAT": wrong})
        expected = f"PARLEY_LOG_FORMAT must be text or json, not {wrong!r}"
        assert str(refused.value) == expected


def test_a_line_is_one_object_with_its_fields_and_the_ids_of_its_context(
    lines: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = lines
    logger.info("outside")
    with log_context(session_id="s1"):
        logger.warning("about the session")
        with log_context(turn_id="t1", run_id="r1"):
            logger.warning("two\nlines, %s", "one record")
        logger.info("the session again")
    outside, session, turn, again = parsed(out)
    assert list(outside) == ["time", "level", "logger", "message", "pid"]
    assert outside["level"] == "INFO" and outside["logger"] == logger.name
    assert outside["time"].endswith("+00:00")  # UTC, ISO 8601
    assert session["session_id"] == "s1" and "turn_id" not in session
    assert turn["message"] == "two\\nlines, one record"  # escaped: see the test below
    assert (turn["session_id"], turn["turn_id"], turn["run_id"]) == ("s1", "t1", "r1")
    assert "turn_id" not in again and again["session_id"] == "s1"
    assert current_ids() == {}


def test_an_exception_and_extra_fields_are_kept_and_a_call_s_own_ids_win(
    lines: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = lines
    with log_context(session_id="s1", turn_id="t1"):
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed", extra={"turn_id": "t2", "attempt": 3, "at": object()})
    [line] = parsed(out)
    assert line["level"] == "ERROR" and line["attempt"] == 3
    assert line["turn_id"] == "t2" and line["session_id"] == "s1"
    assert "ValueError: boom" in line["exception"] and "Traceback" in line["exception"]
    assert line["at"].startswith("<object object")  # what json cannot encode, as text


FORGED = "/v1/x\n2026-01-01 00:00:00,000 parley.gateway.access GET / 200\r\x1b[2J\x9b\x7f\u2028"
FORGED_LINE = "2026-01-01 00:00:00,000 parley.gateway.access GET / 200"
ESCAPED_END = "\\r\\x1b[2J\\x9b\\x7f\\u2028"
ESCAPED = f"/v1/x\\n{FORGED_LINE}{ESCAPED_END}"


@pytest.mark.parametrize("formatter", [TextLines, JsonLines])
def test_control_characters_are_escaped_in_every_field_but_a_traceback_keeps_its_lines(
    formatter: type[logging.Formatter],
) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter())
    logger = logging.getLogger(f"tests.logs.escape.{formatter.__name__}")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("GET %s 404", FORGED, extra={"path": FORGED, "nested": {FORGED: [FORGED]}})
        try:
            raise ValueError(f"bad {FORGED}")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    for control in ("\r", "\x1b", "\x9b", "\x7f", "\u2028"):
        assert control not in text, repr(text)
    if formatter is JsonLines:
        record, failed = parsed(out)
        assert record["message"] == f"GET {ESCAPED} 404"
        assert record["path"] == ESCAPED and record["nested"] == {ESCAPED: [ESCAPED]}
        assert failed["exception"].startswith("Traceback (most recent call last):\n")
        assert failed["exception"].endswith(f"ValueError: bad /v1/x\n{FORGED_LINE}{ESCAPED_END}")
    else:
        warning, failure, *traceback = text.splitlines()
        assert warning.endswith(f"GET {ESCAPED} 404")
        assert failure.endswith(" failed") and traceback[0] == "Traceback (most recent call last):"
        # The traceback's own line breaks stay; its message is one line, escaped.
        assert traceback[-1] == f"ValueError: bad {ESCAPED}"
        assert traceback[-2].startswith("    raise ValueError")


def test_bind_names_ids_in_an_open_scope_only() -> None:
    bind(turn_id="nowhere")  # outside any block: nothing to name
    assert current_ids() == {}
    with log_scope():
        bind(session_id="s1")
        bind(turn_id="t1", run_id=None)
        assert current_ids() == {"session_id": "s1", "turn_id": "t1"}
        with log_context(turn_id="t2"):
            bind(turn_id="t3")  # a fixed block keeps its ids
            assert current_ids() == {"session_id": "s1", "turn_id": "t2"}
        assert current_ids()["turn_id"] == "t1"
    assert current_ids() == {}


def test_a_scope_is_shared_with_work_handed_to_threads_but_not_with_new_threads() -> None:
    seen: list[dict[str, str]] = []

    async def request(turn_id: str) -> dict[str, str]:
        with log_scope():
            # What a sync route does in the threadpool (the context is copied, the scope
            # is the same): the access line after it sees the id.
            await asyncio.to_thread(bind, turn_id=turn_id)
            await asyncio.sleep(0.01)  # the other request binds meanwhile
            thread = threading.Thread(target=lambda: seen.append(dict(current_ids())))
            thread.start()
            thread.join()
            return dict(current_ids())

    async def two_requests() -> list[dict[str, str]]:
        return list(await asyncio.gather(request("t1"), request("t2")))

    assert asyncio.run(two_requests()) == [{"turn_id": "t1"}, {"turn_id": "t2"}]
    assert seen == [{}, {}]
