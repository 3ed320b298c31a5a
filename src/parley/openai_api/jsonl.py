"""A batch's input read within bounds (docs/batches.md#lines): a JSONL file a part at a
time, each line decoded on its own, and every line, read from a file or given parsed
from Python, checked for what the store cannot keep.

A line must never fail the batch, nor the process reading it: JSON nested a thousand
deep exhausts Python's recursion, an integer of 4,300 digits is refused by ``int``, and
a NUL or a lone surrogate (``\\u0000``, ``\\ud800``) anywhere in a line, a key's name
included, is refused by PostgreSQL, or by UTF-8 itself.  So a line is held to
:data:`MAX_LINE_BYTES`, its nesting is counted before it is decoded, its numbers are
bounded as they are decoded, and its strings are checked once it is: a line that breaks
one of these is refused alone, saying which.  What a refusal quotes of the line is cut
short (:func:`line_refusal`), so an error never echoes the input back at length.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from itertools import accumulate
from typing import Any

from parley.schemas.batches import LineRefusal
from parley.store.ids import storable
from parley.validation import MAX_JSON_DEPTH, MAX_REQUEST_ID

MAX_LINE_BYTES = 4 << 20
"""The most bytes one line may have: a 1 MB prompt fits, JSON-escaped."""
MAX_NUMBER_CHARS = 100
"""The most characters a number in a line may be written with (``int`` refuses 4,300
digits; nothing a request holds needs more than twenty)."""
MAX_MESSAGE_CHARS = 500
"""The most characters a refused line's error message has: what it quotes of the line is
cut to fit."""
MAX_PARAM_CHARS = 100
"""The most characters of the parameter a refused line's error names."""

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class _Unreadable(ValueError):
    """A line that cannot be decoded within the bounds, and why (its code and message)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def jsonl_stream(parts: Iterable[bytes]) -> Iterator[tuple[int, Any]]:
    """The lines of a JSONL file whose bytes come as ``parts``, with their numbers (from
    1), each decoded, or the :class:`LineRefusal` that says why it cannot be; blank lines
    are skipped.  One line is held at a time, and a line over :data:`MAX_LINE_BYTES` is
    refused without being held."""
    number, line = 0, _HeldLine()
    for part in parts:
        *ended, rest = part.split(b"\n")
        for piece in ended:
            line.add(piece)
            number += 1
            value = line.take(number)
            if value is not None:
                yield number, value
        line.add(rest)
    if line.held:
        number += 1
        yield number, line.take(number)


class _HeldLine:
    """The line being read: its bytes so far, or only that it is too long."""

    def __init__(self) -> None:
        self._bytes = bytearray()
        self._over = False

    @property
    def held(self) -> bool:
        return self._over or bool(self._bytes.strip())

    def add(self, piece: bytes) -> None:
        if self._over:
            return
        self._bytes += piece
        if len(self._bytes) > MAX_LINE_BYTES:
            self._bytes, self._over = bytearray(), True

    def take(self, number: int) -> Any:
        """The line, decoded (or refused; None if blank), and a fresh one begun."""
        value = _too_long(number) if self._over else decode_line(number, bytes(self._bytes))
        self._bytes, self._over = bytearray(), False
        return value


def _too_long(number: int) -> LineRefusal:
    return line_refusal(
        number, None, "invalid_line", f"the line is over {MAX_LINE_BYTES} bytes (the limit)"
    )


def decode_line(number: int, raw: bytes) -> Any:
    """Line ``number`` (its bytes, without the newline) decoded, or the refusal that says
    why it cannot be; None for a blank line."""
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8-sig")
        if _nests_deeper(text):
            raise _Unreadable(
                "invalid_line", f"the line nests objects and arrays over {MAX_JSON_DEPTH} deep"
            )
        value = json.loads(
            text, parse_int=_integer, parse_float=_fraction, parse_constant=_constant
        )
    except UnicodeDecodeError as exc:
        return line_refusal(number, None, "invalid_json", f"not JSON: not UTF-8 ({exc.reason})")
    except json.JSONDecodeError as exc:
        return line_refusal(number, None, "invalid_json", f"not JSON: {exc}")
    except _Unreadable as exc:
        return line_refusal(number, None, exc.code, str(exc))
    if "\\u" in text:  # only an escape can make a NUL or a lone surrogate of strict UTF-8
        return checked_line(number, value)
    return value


def _nests_deeper(text: str) -> bool:
    """Whether the JSON ``text`` nests its objects and arrays more than
    :data:`MAX_JSON_DEPTH` deep, counted without decoding it (its strings left out)."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0) > MAX_JSON_DEPTH


def _integer(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Unreadable("invalid_line", f"a number is over {MAX_NUMBER_CHARS} characters long")
    return int(text)


def _fraction(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Unreadable("invalid_line", f"a number is over {MAX_NUMBER_CHARS} characters long")
    value = float(text)
    if not math.isfinite(value):
        raise _Unreadable("invalid_line", f"the number {text} is out of range")
    return value


def _constant(name: str) -> Any:
    raise _Unreadable("invalid_json", f"not JSON: {name} is not a JSON value")


def given_lines(lines: Iterable[Any]) -> Iterator[tuple[int, Any]]:
    """Lines given parsed (from Python), numbered from 1, each as it is or the refusal
    that says why the store could not keep it."""
    for number, value in enumerate(lines, start=1):
        yield number, checked_line(number, value)


def checked_line(number: int, value: Any) -> Any:
    """``value`` (line ``number``) if every part of it is JSON the store keeps as it is,
    else its refusal naming the first part that is not."""
    problem = unstorable(value)
    if problem is None:
        return value
    where, what = problem
    custom_id = value.get("custom_id") if isinstance(value, dict) else None
    return line_refusal(number, custom_id, "invalid_line", f"{where or 'the line'}: {what}", where)


def unstorable(value: Any) -> tuple[str | None, str] | None:
    """Where in ``value`` (a dotted path, None for the value itself) the first part is
    that the store cannot keep as it is, and why: a string or key with a NUL or a lone
    surrogate, a key that is not a string, a number over :data:`MAX_NUMBER_CHARS` digits
    or not finite, nesting over :data:`MAX_JSON_DEPTH`, or what JSON has no type for.
    None if there is none.  Walked without recursion."""
    pending: list[tuple[Any, int, str | None]] = [(value, 1, None)]
    while pending:
        item, depth, where = pending.pop()
        problem = _scalar_problem(item)
        if problem is not None:
            return where, problem
        if isinstance(item, (dict, list)) and depth > MAX_JSON_DEPTH:
            return where, f"nests objects and arrays over {MAX_JSON_DEPTH} deep"
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str) or not storable(key):
                    return where, "has a key that is not text (UTF-8, no NUL)"
                pending.append((child, depth + 1, key if where is None else f"{where}.{key}"))
        elif isinstance(item, list):
            inside = where or ""
            pending.extend((child, depth + 1, f"{inside}[{n}]") for n, child in enumerate(item))
    return None


def _scalar_problem(item: Any) -> str | None:
    """Why the store cannot keep ``item`` as it is, if it is not a container."""
    if isinstance(item, str):
        return None if storable(item) else "is not text (UTF-8, no NUL)"
    if isinstance(item, bool) or item is None or isinstance(item, (dict, list)):
        return None
    if isinstance(item, int):
        fits = -(10**MAX_NUMBER_CHARS) < item < 10**MAX_NUMBER_CHARS
        return None if fits else f"is a number over {MAX_NUMBER_CHARS} digits"
    if isinstance(item, float):
        return None if math.isfinite(item) else "is a number that is not finite"
    return f"is a {type(item).__name__}, which JSON has not"


def line_refusal(
    number: int, custom_id: Any, code: str, message: str, param: str | None = None
) -> LineRefusal:
    """A refused line's record, quoting little of it: ``custom_id`` only if it is one (a
    string of 1 to 200 characters the store keeps), the message cut to
    :data:`MAX_MESSAGE_CHARS` and the parameter to :data:`MAX_PARAM_CHARS`."""
    kept = (
        custom_id
        if isinstance(custom_id, str)
        and 0 < len(custom_id) <= MAX_REQUEST_ID
        and storable(custom_id)
        else None
    )
    return LineRefusal(
        line=number,
        custom_id=kept,
        code=code,
        message=_cut(message, MAX_MESSAGE_CHARS),
        param=None if param is None else _cut(param, MAX_PARAM_CHARS),
    )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
