"""The text a command takes (a prompt, a steer): on the command line, from a file or from
stdin, bounded as the client bounds it; and the prompt echoed back."""

from __future__ import annotations

import sys

from rich.text import Text

import parley


def text_argument(
    given: str | None, path: str | None, *, what: str, option: str, limit: int
) -> tuple[str, str | None]:
    """The text a command takes: ``given`` on the command line, or read from the file
    ``path``, or from stdin (``-`` as either); and where it was read from (None: the
    command line).  At most ``limit`` bytes are read: a larger text is refused, as the
    client would refuse it, without reading the rest."""
    if given is not None and path is not None:
        raise parley.errors.InvalidRequest(f"give the {what} or {option}, not both")
    if given is not None and given != "-":
        return given, None
    path = path or given
    if path is None:
        raise parley.errors.InvalidRequest(
            f"no {what}: give it, or {option} PATH (- reads it from stdin)"
        )
    source = "stdin" if path == "-" else path
    return _decoded(_read_bounded(path, what, limit), source, what), source


def _read_bounded(path: str, what: str, limit: int) -> bytes:
    """Up to ``limit`` bytes of stdin (``-``) or of the file ``path``, and one more: a
    text over the limit is told by its length."""
    if path == "-":
        data = sys.stdin.buffer.read(limit + 1)
    else:
        try:
            with open(path, "rb") as file:
                data = file.read(limit + 1)
        except OSError as exc:
            raise parley.errors.InvalidRequest(
                f"cannot read the {what} from {path}: {exc.strerror or exc}"
            ) from None
    if len(data) > limit:
        source = "stdin" if path == "-" else path
        raise parley.errors.InvalidRequest(
            f"the {what} from {source} is over the limit of {limit} bytes"
        )
    return data


def _decoded(data: bytes, source: str, what: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise parley.errors.InvalidRequest(
            f"the {what} from {source} is not UTF-8 text (byte {exc.start})"
        ) from None
    if not text.strip():
        raise parley.errors.InvalidRequest(f"the {what} from {source} is empty")
    return text


def prompt_line(prompt: str, source: str | None) -> Text:
    """The prompt echoed: whole when given on the command line; read from a file or
    stdin (a large one, most likely), its first line and its size."""
    line = Text("you: ", "bold")
    if source is None:
        return line.append(prompt)
    first = prompt.strip().splitlines()[0]
    line.append(first if len(first) <= 80 else first[:79] + "…")
    return line.append(f"  ({len(prompt)} characters from {source})", "dim")
