"""What a command writes (src/parley/cli/output.py, parley.logs.CommandLines): a warning is
one line, a parley error it carries on that line, any other exception's traceback kept;
off a terminal no line wraps."""

from __future__ import annotations

import io
import logging
import sys

import pytest
from rich.text import Text
from rich.tree import Tree

from parley.cli.output import console
from parley.logs import CommandLines
from parley.models.errors import ProviderError


def logged(exc: BaseException | None, message: str = "model failed on turn %s") -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(CommandLines())
    logger = logging.getLogger(f"tests.cli_output.{id(out)}")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        if exc is None:
            logger.warning(message, "t-1")
        else:
            try:
                raise exc
            except BaseException:
                logger.warning(message, "t-1", exc_info=True)
    finally:
        logger.removeHandler(handler)
    return out.getvalue()


def test_a_warning_is_its_message_alone_on_one_line() -> None:
    assert logged(None) == "model failed on turn t-1\n"
    assert logged(None, "odd\nline %s\x1b[31m") == "odd\\nline t-1\\x1b[31m\n"


def test_a_parley_error_ends_the_warnings_line_and_no_traceback_is_printed() -> None:
    error = ProviderError(
        "cannot connect: Connection refused",
        provider="openai:gpt-4o-mini",
        retriable=True,
        phase="request",
    )
    line = logged(error)
    assert line.count("\n") == 1 and "Traceback" not in line
    assert line.startswith("model failed on turn t-1 (ProviderError: ")
    assert "cannot connect: Connection refused" in line


def test_any_other_exception_keeps_its_traceback() -> None:
    text = logged(ValueError("a bug"))
    assert text.startswith("model failed on turn t-1\nTraceback (most recent call last):")
    assert "ValueError: a bug" in text


def test_off_a_terminal_nothing_wraps_and_no_tree_line_is_cropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.delenv("COLUMNS", raising=False)
    long_id = "batch_" + "0123456789abcdef" * 2
    tree = Tree(Text("session"))
    tree.add(Text(f"{long_id} [finished] " + "a long prompt " * 10))
    shown = console()
    shown.print(Text(f"output {long_id}, errors {long_id}, " * 3))
    shown.print(tree)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].count(long_id) == 6
    assert lines[2].rstrip().endswith("a long prompt")
