"""What a request must be, checked before anything is written: the size limits a prompt,
a steer, a request id, metadata and a host context are held to, and the checks of them
that the clients and the gateway's routes share (each raises :class:`InvalidRequest`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BeforeValidator

from parley.errors import InvalidRequest, ParleyError
from parley.ports.admission import PRIORITIES, Priority
from parley.schemas.records import IfBusy
from parley.store.ids import storable, validate_ids
from parley.store.session_titles import title_problem

MAX_PROMPT_BYTES = 1_000_000
MAX_STEER_BYTES = 100_000
MAX_REQUEST_ID = 200
MAX_METADATA_BYTES = 100_000
MAX_CONTEXT_BYTES = 64_000
MAX_SIGNAL_BYTES = 100_000
"""The largest payload a signal may carry (as JSON): it becomes a tool result."""
MAX_JSON_DEPTH = 64
"""How deep a stored JSON object may nest its objects and arrays (the object itself is
level 1).  Far below what would fail later: pydantic stops serializing at some 255
levels, so a deeper one would be stored and then fail every read that answers it."""
MAX_SEQ = 2**31 - 1  # the store's seq columns are 32-bit


def check_timeout(timeout: Any) -> None:
    """:class:`InvalidRequest` unless ``timeout`` is a number of seconds or None."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout):
        raise InvalidRequest(f"timeout must be a number of seconds or None, not {timeout!r}")


MAX_DELAY_SECONDS = 10 * 366 * 24 * 3600
"""The longest ``after`` (ten years): past it, a number of seconds is a mistake (a
timestamp in milliseconds, say) rather than a plan."""


def check_start(at: Any, after: Any) -> datetime | None:
    """When a delayed turn may start (docs/time.md#delayed-turns), in UTC: ``at`` (an
    aware datetime) or ``after`` (seconds from now, finite and not negative), at most
    one of them; None for a turn that may start at once.  Else :class:`InvalidRequest`.
    A time already past is kept as it is: the turn starts at once."""
    if at is not None and after is not None:
        raise InvalidRequest("give at or after, not both")
    if at is not None:
        if not isinstance(at, datetime):
            raise InvalidRequest(f"at must be a datetime, not {at!r}")
        if at.tzinfo is None or at.utcoffset() is None:
            raise InvalidRequest(
                f"at must carry its time zone (a naive datetime is ambiguous): {at.isoformat()}"
            )
        try:
            when = at.astimezone(UTC)
        except OverflowError:  # (past the last year a datetime holds, once in UTC)
            when = datetime.max.replace(tzinfo=UTC)
    elif after is not None:
        if (
            isinstance(after, bool)
            or not isinstance(after, (int, float))
            or not math.isfinite(after)
            or after < 0
        ):
            raise InvalidRequest(
                f"after must be a finite, non-negative number of seconds, not {after!r}"
            )
        if after > MAX_DELAY_SECONDS:
            raise InvalidRequest(f"after is at most {MAX_DELAY_SECONDS} seconds (ten years)")
        when = datetime.now(UTC) + timedelta(seconds=after)
    else:
        return None
    return when


def check_metadata(metadata: Any) -> None:
    """:class:`InvalidRequest` unless ``metadata`` is session metadata ``open_session``
    takes: JSON that comes back as it went in (string keys, no sets, NaN or infinity), at
    most :data:`MAX_METADATA_BYTES` of it."""
    check_json_object(metadata, "metadata", MAX_METADATA_BYTES)


def check_title(title: Any) -> None:
    """:class:`InvalidRequest` unless ``title`` is a session title (one line of printable
    text, at most :data:`~parley.store.session_titles.MAX_TITLE_CHARS` characters)."""
    problem = title_problem(title)
    if problem is not None:
        raise InvalidRequest(problem)


def checked_payload(payload: Any) -> Any:
    """``payload`` if it is a signal's payload (docs/time.md#waiting-for-an-event): any
    JSON value (None too) that comes back as it went in, at most
    :data:`MAX_SIGNAL_BYTES` of it; else :class:`InvalidRequest`."""
    check_json_value(payload, "the signal's payload", MAX_SIGNAL_BYTES)
    return payload


def check_json_object(value: Any, what: str, limit: int) -> None:
    """:class:`InvalidRequest` unless ``value`` is a JSON object that comes back as it
    went in (string keys, no sets, NaN or infinity, no NUL or lone surrogate in any
    string), of at most ``limit`` bytes and :data:`MAX_JSON_DEPTH` levels."""
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a dict")
    check_json_value(value, what, limit)


def check_json_value(value: Any, what: str, limit: int) -> None:
    """:class:`InvalidRequest` unless ``value`` is a JSON value that comes back as it
    went in (string keys, no sets, NaN or infinity, no NUL or lone surrogate in any
    string), of at most ``limit`` bytes and :data:`MAX_JSON_DEPTH` levels."""
    # Before json.dumps, which recurses (and a value that contains itself nests forever).
    if _nests_deeper_than(value, MAX_JSON_DEPTH):
        raise InvalidRequest(
            f"{what} must nest its objects and arrays at most {MAX_JSON_DEPTH} levels deep"
        )
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{what} must be JSON: {exc}") from exc
    if json.loads(text) != value:
        raise InvalidRequest(f"{what} must be JSON: string keys, and lists rather than tuples")
    if not all(storable(item) for item in _strings(value)):
        raise InvalidRequest(f"{what} must be JSON text without NUL characters or lone surrogates")
    if len(text.encode("utf-8")) > limit:
        raise InvalidRequest(f"{what} must be at most {limit} bytes of JSON")


def _nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` has dicts, lists or tuples more than ``limit`` levels deep (walked
    without recursion)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


def _strings(value: Any) -> Iterator[str]:
    """Every string of a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def check_id(value: Any, missing: type[ParleyError] = InvalidRequest) -> None:
    """``missing`` (by default :class:`InvalidRequest`) unless ``value`` is an id the
    store could hold."""
    try:
        validate_ids(value)
    except InvalidRequest as exc:
        if missing is InvalidRequest:
            raise
        raise missing(str(exc)) from exc


def check_text(value: str | bytes, what: str, limit: int) -> str:
    """``value`` as text if it is the ``what`` of a request (UTF-8, not blank, no NUL, at
    most ``limit`` bytes), else :class:`InvalidRequest` saying which it is not."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest(
                f"the {what} is not valid UTF-8: {exc.reason} at byte {exc.start}"
            ) from exc
    if not isinstance(value, str):
        raise InvalidRequest(f"the {what} must be text, not {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"the {what} is not valid UTF-8 (lone surrogate at {exc.start})"
        ) from exc
    if not value.strip():
        raise InvalidRequest(f"the {what} is empty")
    if "\x00" in value:
        raise InvalidRequest(f"the {what} contains a NUL character")
    if size > limit:
        raise InvalidRequest(f"the {what} is {size} bytes; the limit is {limit}")
    return value


def check_request_id(request_id: Any) -> None:
    """:class:`InvalidRequest` unless ``request_id`` is a turn's request id: a non-empty
    string of at most :data:`MAX_REQUEST_ID` characters that the store can hold."""
    if (
        not isinstance(request_id, str)
        or not request_id
        or len(request_id) > MAX_REQUEST_ID
        or not storable(request_id)
    ):
        raise InvalidRequest(
            f"request_id must be a non-empty string of at most {MAX_REQUEST_ID} characters "
            "(UTF-8, no NUL)"
        )


def check_priority(value: str) -> Priority:
    """``value`` as a lane of admission (docs/admission.md), else :class:`InvalidRequest`."""
    if value not in PRIORITIES:
        raise InvalidRequest(f"priority must be one of {list(PRIORITIES)}, not {value!r}")
    return value


def check_if_busy(value: IfBusy | str) -> IfBusy:
    """``value`` as an :class:`IfBusy`, else :class:`InvalidRequest` listing them."""
    try:
        return IfBusy(value)
    except ValueError:
        raise InvalidRequest(
            f"if_busy must be one of {[b.value for b in IfBusy]}, not {value!r}"
        ) from None


def _not_a_string_or_boolean(value: Any) -> Any:
    if isinstance(value, (str, bool)):
        raise ValueError(f"must be a whole number, not {json.dumps(value)}")
    return value


JSON_NUMBER = BeforeValidator(_not_a_string_or_boolean)
"""After an integer field's ``Field(..., strict=False)``: a whole number as JSON Schema
has them (``2.0`` is 2), never a string of one or a boolean (a strict ``int`` would
refuse the ``2.0`` the document allows; the bounds go before this, or the document
loses them)."""
